"""A training command as its own driver process attached to the test session's Ray, and what fault tests do to it:
find its training workers, wait for its first stored checkpoint, interrupt it as a terminal's Ctrl-C does (and what
an interrupted run and its relaunch must show, whichever command it is)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from checkpoint_helpers import assert_mid_run, verifying_checkpoints, verifying_steps
from process_helpers import train_workers_of


def launch(command: str, overrides: list[str]) -> subprocess.Popen:
    """`albert-dist COMMAND --set …` in its own session (a process group a signal can reach whole, as a terminal's),
    attached to the test session's Ray; its output (stdout and stderr together) on `stdout`."""
    import ray

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "albert_dist.cli", command]
    for item in overrides:
        args += ["--set", item]
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def wait_for_checkpoint(run_dir: Path, process: subprocess.Popen | None = None, timeout: float = 300) -> bool:
    """Whether a checkpoint of the run verifies within `timeout` (complete: Ray copies a checkpoint file by file);
    fails the test, with the driver's output, if the driver ends first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if verifying_steps(run_dir):
            return True
        assert process is None or process.poll() is None, process.stdout.read()
        time.sleep(0.05)
    return False


def training_workers(count: int = 2, timeout: float = 300) -> list[int]:
    """The `count` training workers of the run starting on this test process's Ray, once all run: found before the
    fault is due, as reading the process table takes seconds on a loaded machine, while the run goes on."""
    deadline = time.time() + timeout
    while len(workers := train_workers_of(os.getpid())) < count:
        assert time.time() < deadline, f"training workers: {workers}"
        time.sleep(0.2)
    return workers


def interrupt(driver: subprocess.Popen, workers: list[int], timeout: float = 300) -> str:
    """A real SIGINT to the driver's process group, as a terminal's Ctrl-C sends it, with the training workers held
    (SIGSTOP) around it so that it lands while the run is still training (tiny steps take milliseconds), then let
    go for the abort to stop them. Returns the driver's output once it has ended."""
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    os.killpg(driver.pid, signal.SIGINT)
    for pid in workers:
        os.kill(pid, signal.SIGCONT)
    out, _ = driver.communicate(timeout=timeout)
    return out


def interrupted_then_relaunched(
    start: Callable[[], subprocess.Popen], run_dir: Path, tracking_uri: str, last_step: int
) -> tuple[str, str]:
    """Ctrl-C (`interrupt`) to the run `start()` launches, once a checkpoint is stored; then the same command
    again. Asserts what a user is promised whatever the command: the command ends 130 saying so, without a
    traceback, its MLflow run KILLED (stopped by the user), every stored checkpoint still verifies; the relaunch
    resumes from the newest of them, mid-run, and ends with the one MLflow run FINISHED. Returns the outputs of the
    interrupted run and of the relaunch."""
    from mlflow.tracking import MlflowClient

    victim = start()
    workers = training_workers()
    assert wait_for_checkpoint(run_dir, victim), "no checkpoint appeared"
    interrupted = interrupt(victim, workers)
    assert victim.returncode == 130 and "albert-dist: interrupted" in interrupted, (
        victim.returncode,
        interrupted[-3000:],
    )
    assert "Traceback" not in interrupted, interrupted[-3000:]
    verifying = verifying_steps(run_dir)
    stored = {path for path in run_dir.glob("ray/*/checkpoint_*") if path.is_dir()}
    assert stored and set(verifying_checkpoints(run_dir)) == stored, "a stored checkpoint does not verify"

    client = MlflowClient(tracking_uri)

    def statuses() -> list[str]:
        experiments = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(experiments, filter_string=f"attributes.run_name = '{run_dir.name}'")
        return [run.info.status for run in runs]

    assert statuses() == ["KILLED"]
    again = start()
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out[-3000:]
    assert_mid_run(int(re.search(r"resumed from .* at step (\d+)", out).group(1)), verifying, last_step)
    assert statuses() == ["FINISHED"]  # the same run, resumed
    return interrupted, out
