"""`run_training` on a real Ray Train run: how its workers are set up (seen from inside them) and how the driver learns
the way a run ended (diverged; resumed at its end after Ray lost its last report)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from checkpoint_helpers import training_plan

from albert_dist.config import ScalingSection, TrainSection
from albert_dist.train.loop import TaskSpec
from albert_dist.train.ray_runner import TrainingDiverged, run_training, torch_threads

pytestmark = pytest.mark.slow  # every test here runs Ray Train on the session's Ray


@dataclass(frozen=True)
class ThreadsRecordingTask(TaskSpec):
    """test_loop's KeywordTask, after writing this worker's torch thread count to a file named by its pid."""

    out: str

    def build(self, rank, world_size, dataset):
        from test_loop import KeywordTask

        (Path(self.out) / str(os.getpid())).write_text(str(torch.get_num_threads()))
        return KeywordTask()


@pytest.fixture(scope="module")
def two_cpu_run(tmp_path_factory, ray_session):
    """One 4-step run on one worker of 2 CPUs in the session's local Ray; each worker records its torch threads."""
    root = tmp_path_factory.mktemp("threads")
    out = root / "threads"
    out.mkdir()
    result = run_training(
        training_plan(
            name="threads",
            storage_path=root / "ray",
            task=ThreadsRecordingTask(str(out)),
            train=TrainSection(
                max_steps=4, warmup_steps=0, log_every=2, eval_every=4, checkpoint_every=4, precision="fp32"
            ),
            scaling=ScalingSection(num_workers=1, cpus_per_worker=2),
        )
    )
    return result, out


def test_workers_use_the_cpus_ray_reserved_as_torch_threads(two_cpu_run):
    """A worker of two CPUs trains with two torch threads, whatever OMP_NUM_THREADS the worker inherited (the test
    command sets 1); one of half a CPU with one, not with every core of the machine."""
    result, out = two_cpu_run
    assert result.metrics["step"] == 4
    assert [p.read_text() for p in out.iterdir()] == ["2"]
    assert torch_threads(ScalingSection(cpus_per_worker=3)) == 3 and torch_threads(ScalingSection()) == 1


def test_a_local_ray_runs_training_without_a_preemption_watcher(two_cpu_run, ray_session, monkeypatch):
    """The local Ray (ray_init.start_local_ray, as the commands and this session start it) turns off Ray Train's
    preemption watcher, one actor per run that one machine has no use for."""
    from ray._private.worker import get_dashboard_url
    from ray.util.state import list_actors

    # the state API takes $RAY_API_SERVER_ADDRESS over $RAY_ADDRESS over its argument: name this session's
    # dashboard itself, not an address to resolve beside the other pytest process's Ray and the clusters tests start
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", f"http://{get_dashboard_url()}")
    job = ray_session.get_runtime_context().get_job_id()
    classes = sorted({actor.class_name for actor in list_actors(filters=[("job_id", "=", job)], limit=10_000)})
    assert "TrainController" in classes, classes
    assert "PreemptionWatcher" not in classes, classes


@dataclass(frozen=True)
class KeywordSpec(TaskSpec):
    """test_loop's KeywordTask on every worker; its loss turns NaN after `poison_from_step` calls when given."""

    poison_from_step: int | None = None

    def build(self, rank, world_size, dataset):
        from test_loop import KeywordTask

        return KeywordTask(poison_from_step=self.poison_from_step)


def test_a_diverged_run_stops_with_its_message_and_keeps_the_last_good_checkpoint(tmp_path, ray_session):
    """The loss turns NaN for good after 5 calls: at the next log (step 8; the count stays on the device between
    logs) 4 non-finite steps reach the limit of 3 and the run stops with the loop's message, though the stop reports
    no checkpoint for Ray to carry it, and the checkpoint of step 4 stays."""
    with pytest.raises(TrainingDiverged, match=r"not finite for 4 consecutive steps \(up to step 8\)"):
        run_training(
            training_plan(
                name="diverged",
                storage_path=tmp_path,
                task=KeywordSpec(poison_from_step=5),
                train=TrainSection(
                    max_steps=12,
                    warmup_steps=0,
                    log_every=4,
                    eval_every=4,
                    checkpoint_every=4,
                    max_nonfinite_steps=3,
                    precision="fp32",
                ),
                scaling=ScalingSection(num_workers=1, cpus_per_worker=1),
            )
        )
    assert [
        json.loads((d / "manifest.json").read_text())["step"]
        for d in (tmp_path / "diverged").glob("checkpoint_*")
        if d.is_dir()
    ] == [4]


def test_a_relaunched_finished_run_whose_last_report_ray_lost_ends_at_its_end(tmp_path, ray_session):
    """A run whose last checkpoint is stored but not in Ray's record (its record cut off, as a crash or a full disk
    leaves it, or a node lost right after the report) is relaunched: it resumes at its last step, trains no further
    and reports its end again, so the result is the end of the run, evaluated, not Ray's older record or nothing."""
    train = TrainSection(max_steps=4, warmup_steps=0, log_every=2, eval_every=2, checkpoint_every=2, precision="fp32")
    run = dict(
        name="ended",
        storage_path=tmp_path,
        task=KeywordSpec(),
        train=train,
        scaling=ScalingSection(num_workers=1, cpus_per_worker=1),
        seed=0,
    )
    first = run_training(training_plan(**run))
    (tmp_path / "ended" / "checkpoint_manager_snapshot.json").write_text('{"checkpoint_results": [')
    again = run_training(training_plan(**run))
    assert again.metrics["step"] == 4 and again.metrics["resumed_from_step"] == 4
    assert again.metrics["eval_accuracy"] == first.metrics["eval_accuracy"]


def test_a_worker_that_died_is_one_line_and_a_bug_keeps_rays_error():
    """A worker's process killed (no Python error of ours to show) ends the command on one line saying the
    checkpoints are kept; any other failure in a worker stays Ray's error, whose traceback shows the bug."""
    from ray.exceptions import ActorDiedError, RayTaskError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    from albert_dist.train.ray_runner import WorkersLost, _user_error

    # how Ray Train's WorkerGroupError holds a worker whose process was killed
    died = _user_error([WorkerHealthCheckFailedError("A worker health check failed.", ActorDiedError())], "/runs/x")
    assert isinstance(died, WorkersLost)
    assert str(died) == (
        "a training worker died (The actor died unexpectedly before finishing this task.) with no restart left "
        "(train.max_failures); the checkpoints stored before are kept: relaunch the same run.name to resume from them"
    )
    bug = RayTaskError("train_fn", "Traceback ...", ZeroDivisionError("division by zero"))
    assert _user_error([bug], "/runs/x") is None
