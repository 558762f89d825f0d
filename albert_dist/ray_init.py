"""Connecting to Ray the same way from every command."""

from __future__ import annotations

import os

from albert_dist.console import quiet_ray


# Ray Train 2.60 sends a worker's print both to Ray's stdout wrapper and to its logger, so every progress line
# would reach the console twice; with the redirection off it reaches it once, through Ray's usual log forwarding.
WORKER_ENV = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}


def ensure_ray() -> None:
    """Join the cluster named by $RAY_ADDRESS (set for Ray jobs and by `cluster/local` scripts), else start a
    private local Ray: never silently attach to some other cluster running on the machine."""
    import ray

    if ray.is_initialized():
        return
    os.environ.update(WORKER_ENV)  # a local Ray's workers inherit it; jobs and cluster scripts set it themselves
    # a local Ray gets its dashboard: Ray Train's placement-group cleaner asks the state API it serves whether the
    # training controller is alive, and logs a warning every second while it cannot
    ray.init(address=os.environ.get("RAY_ADDRESS") or "local", configure_logging=False)
    quiet_ray()  # Ray's own log lines to a file unless --verbose
