"""Connecting to Ray the same way from every command."""

from __future__ import annotations

import os


def ensure_ray() -> None:
    """Join the cluster named by $RAY_ADDRESS (set for Ray jobs and by `cluster/local` scripts), else start a
    private local Ray: never silently attach to some other cluster running on the machine."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or "local"
    ray.init(address=address, include_dashboard=False if address == "local" else None, configure_logging=False)
