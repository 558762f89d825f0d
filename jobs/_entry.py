"""What every job entry point shares: the CLI's `--config/--set` flags, config validation, a stable output root.

A Ray job runs in a temporary copy of the working directory that is deleted with the job, so inside a job a
relative `run.output_dir` needs `$ALBERT_DIST_HOME` (set by `albert-dist submit` or the cluster manifests);
without it the job stops before doing any work instead of writing where nobody will find the results.
"""

from __future__ import annotations

import argparse
import os
import sys

from albert_dist import job_registry
from albert_dist.cli import _add_config_flags
from albert_dist.config import load_config
from albert_dist.errors import AlbertDistError, ConfigError, user_error
from albert_dist.storage import is_uri

# Set by Ray's job supervisor in the environment of a submitted job's entrypoint.
_RAY_JOB_MARKER = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def main(name: str, argv: list[str] | None = None) -> int:
    """Parse `--config/--set`, validate into the registered job's config class and run the job."""
    job = job_registry.get(name)
    parser = argparse.ArgumentParser(prog=f"python -m {' '.join(job.entry)}", description=job.help)
    _add_config_flags(parser)
    args = parser.parse_args(argv)
    try:
        cfg = load_config(job.config_class(), args.config, args.overrides)
        check_output_root(cfg)
        return job.load().main(cfg) or 0
    except (AlbertDistError, OSError) as err:
        error = user_error(err)
        if error is None:
            raise
        print(f"{' '.join(job.entry)}: error: {error}", file=sys.stderr)
        return 2


def check_output_root(cfg) -> None:
    """Refuse a relative output directory inside a Ray job unless $ALBERT_DIST_HOME anchors it."""
    output_dir = cfg.run.output_dir
    relative = not (is_uri(output_dir) or os.path.isabs(os.path.expanduser(output_dir)))
    if relative and os.environ.get(_RAY_JOB_MARKER) and not os.environ.get("ALBERT_DIST_HOME"):
        raise ConfigError(
            f"run.output_dir={output_dir!r} is relative and $ALBERT_DIST_HOME is not set: inside a "
            "Ray job it would land in the job's temporary working directory; set ALBERT_DIST_HOME "
            "(albert-dist submit does) or an absolute run.output_dir"
        )


def run(name: str) -> None:
    """The `__main__` body of an entry module."""
    sys.exit(main(name))
