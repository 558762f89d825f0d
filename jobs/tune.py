"""Ray job: hyperparameter sweep with Ray Tune, `python -m jobs.tune {finetune,distill} --config FILE`."""

import sys

from jobs._entry import run

SWEEPS = {
    "finetune": ("albert_dist.tune.config:FinetuneTuneConfig", "albert_dist.tune:run_tune_finetune"),
    "distill": ("albert_dist.tune.config:DistillTuneConfig", "albert_dist.tune:run_tune_distill"),
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in SWEEPS:
        sys.exit(f"usage: python -m jobs.tune {{{','.join(SWEEPS)}}} --config FILE [--set SECTION.FIELD=VALUE]")
    kind = sys.argv.pop(1)
    run(__doc__, f"tune {kind}", *SWEEPS[kind])
