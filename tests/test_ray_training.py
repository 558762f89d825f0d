"""How Ray Train workers are set up by `run_training`, seen from inside the workers of a real Ray Train run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from albert_dist.config import ScalingSection, TrainSection
from albert_dist.train.loop import TaskSpec
from albert_dist.train.ray_runner import run_training, torch_threads


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
    result = run_training(name="threads", storage_path=root / "ray", task=ThreadsRecordingTask(str(out)),
                          train=TrainSection(max_steps=4, warmup_steps=0, log_every=2, eval_every=4,
                                             checkpoint_every=4, precision="fp32"),
                          scaling=ScalingSection(num_workers=1, cpus_per_worker=2), seed=0)
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
