"""Ray job: hyperparameter sweep with Ray Tune, `python -m jobs.tune {finetune,distill} --config FILE`."""

import sys

from albert_dist.job_registry import JOBS
from jobs._entry import run

SWEEPS = [job.entry[1] for job in JOBS.values() if job.entry[0] == "jobs.tune"]

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in SWEEPS:
        sys.exit(f"usage: python -m jobs.tune {{{','.join(SWEEPS)}}} --config FILE [--set SECTION.FIELD=VALUE]")
    run(f"tune-{sys.argv.pop(1)}")
