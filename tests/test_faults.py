"""Faults injected for real into pretraining runs: a worker SIGKILLed mid-run, a corrupted latest checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from albert_dist.config import PretrainJobConfig, load_config
from tests.test_pretrain import pretrain_overrides, prepared  # noqa: F401 - the shared prepared-data fixture

pytestmark = pytest.mark.slow


def train_worker_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "ray::RayTrainWorker"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def kill_a_worker_after_first_checkpoint(run_dir: Path, killed: list[int], timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any((p / "manifest.json").exists() for p in run_dir.glob("ray/*/checkpoint_*")):
            pids = train_worker_pids()
            if pids:
                os.kill(pids[-1], signal.SIGKILL)
                killed.append(pids[-1])
                return
        time.sleep(0.5)


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "model" / "model.safetensors")


def run(prepared_root: Path, name: str, *extra: str):
    from albert_dist.pretrain import pretrain

    overrides = pretrain_overrides(prepared_root, name, steps=30) + ["train.checkpoint_every=10",
                                                                      "train.eval_every=30", *extra]
    return pretrain(load_config(PretrainJobConfig, None, overrides))


def test_killed_worker_is_restarted_from_the_checkpoint(prepared, ray_session):  # noqa: F811
    from mlflow.tracking import MlflowClient

    baseline = run(prepared, "unfaulted")
    killed: list[int] = []
    killer = threading.Thread(target=kill_a_worker_after_first_checkpoint, args=(prepared / "faulted", killed))
    killer.start()
    outcome = run(prepared, "faulted", "train.max_failures=2")
    killer.join()
    assert killed, "no worker was killed"
    assert outcome.metrics["step"] == 30

    a, b = final_weights(prepared / "unfaulted"), final_weights(prepared / "faulted")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)

    client = MlflowClient(outcome.tracking_uri)
    for metric in ("loss", "tokens_per_s", "eval_sop_accuracy"):
        steps = [m.step for m in client.get_metric_history(outcome.run_id, metric)]
        assert len(steps) == len(set(steps)), f"{metric} logged twice at some step: {sorted(steps)}"
    assert baseline.run_id != outcome.run_id


def test_corrupted_latest_checkpoint_falls_back_to_the_previous(prepared, ray_session, capfd):  # noqa: F811
    run(prepared, "corrupt", "train.keep_checkpoints=3")
    checkpoints = sorted((prepared / "corrupt" / "ray").glob("*/checkpoint_*"))
    latest = max(checkpoints, key=lambda p: p.stat().st_mtime)
    state = latest / "training_state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # truncated
    before = final_weights(prepared / "corrupt")

    outcome = run(prepared, "corrupt", "train.keep_checkpoints=3")
    out = capfd.readouterr().out
    assert "does not match its checksum" in out and "previous good checkpoint" in out
    assert outcome.metrics["step"] == 30
    after = final_weights(prepared / "corrupt")
    for key in before:
        torch.testing.assert_close(before[key], after[key], rtol=0, atol=0, msg=key)
