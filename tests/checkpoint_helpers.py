"""What a fault left of a run's stored checkpoints, and whether its resume was from the newest of them."""

from __future__ import annotations

import json
from pathlib import Path

from albert_dist.errors import CheckpointError
from albert_dist.train import checkpointing


def verifying_checkpoints(run_dir: Path) -> dict[Path, int]:
    """The stored checkpoints that pass their checksums, with their steps (Ray copies a checkpoint file by file: one
    whose manifest is there may still be on its way, or cut off by a fault, and is never resumed from)."""
    found = {}
    for checkpoint in run_dir.glob("ray/*/checkpoint_*"):
        try:
            checkpointing.verify_manifest(checkpoint)
        except CheckpointError:
            continue
        found[checkpoint] = json.loads((checkpoint / "manifest.json").read_text())["step"]
    return found


def verifying_steps(run_dir: Path) -> list[int]:
    return sorted(verifying_checkpoints(run_dir).values())


def assert_mid_run(resumed: int, verifying: list[int], last_step: int, first_checkpoint: int = 10) -> None:
    """A resume from the newest checkpoint that verified before the relaunch (`verifying`), strictly inside the
    run: not from scratch, not its end (a run resumed at its end has nothing left to train, and ends like an
    uninterrupted one whatever resume does)."""
    assert verifying and first_checkpoint <= verifying[-1] < last_step, verifying
    assert resumed == verifying[-1], f"resumed at step {resumed}, the newest checkpoint that verified: {verifying}"


def training_plan(name, storage_path, task, train, scaling, seed=0, datasets=None, publish_to=None, fingerprint=None):
    """The plan of an untracked run of `task` (no job config: what `run_training` needs and nothing more)."""
    from albert_dist.train.plan import Plan

    return Plan(
        task=task,
        train=train,
        scaling=scaling,
        seed=seed,
        name=name,
        storage_path=storage_path,
        publish_to=publish_to,
        fingerprint=fingerprint,
        resume_changes="refuse",
        tracking=None,
        datasets=lambda: datasets or {},
    )
