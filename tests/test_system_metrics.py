"""MLflow's system metrics (`tracking.system_metrics`): on by default for the jobs that track a run, logged under
system/ while the job's run is open, and none at all when turned off."""

from __future__ import annotations

import time

import mlflow
import pytest

from albert_dist.config import load_config
from albert_dist.finetune.config import DistillJobConfig, FinetuneJobConfig
from albert_dist.pretrain.config import PretrainJobConfig
from albert_dist.tracking.run import RunTarget, job_run
from albert_dist.train.plan import run_target


@pytest.mark.parametrize("config_class", [PretrainJobConfig, FinetuneJobConfig, DistillJobConfig])
def test_on_by_default_for_training_jobs_and_off_by_a_key(config_class, tmp_path):
    on = load_config(config_class, {"run": {"output_dir": str(tmp_path)}})
    assert run_target(on).system_metrics is True
    off = load_config(config_class, {"run": {"output_dir": str(tmp_path)}}, ["tracking.system_metrics=false"])
    assert run_target(off).system_metrics is False


def system_keys(uri: str, run_id: str) -> set[str]:
    return {key for key in mlflow.MlflowClient(uri).get_run(run_id).data.metrics if key.startswith("system/")}


def busy_run(target: RunTarget) -> str:
    with job_run(target, "pretrain", params={}, config_yaml="") as run:
        busy_until = time.monotonic() + 1.5  # several sampling intervals of a busy CPU
        while time.monotonic() < busy_until:
            sum(range(10_000))
    return run.run_id


def test_the_run_has_system_metrics_only_when_on(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # one store for both runs: making one takes seconds
    off = busy_run(RunTarget(uri, "system-metrics", tmp_path / "off", "off", system_metrics=False))
    assert system_keys(uri, off) == set()

    target = RunTarget(uri, "system-metrics", tmp_path / "on", "on", system_metrics=True)
    on = busy_run(target)
    keys = system_keys(uri, on)
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= keys, keys
    client = mlflow.MlflowClient(uri)
    history = client.get_metric_history(on, "system/cpu_utilization_percentage")
    assert len(history) >= 2 and all(0 <= m.value <= 100 for m in history)
    assert max(m.value for m in history) > 0  # the loop above kept a CPU busy
    # a relaunch of the job continues the run's system metrics after its last step
    with job_run(target, "pretrain", params={}, config_yaml="") as again:
        time.sleep(0.6)
    assert again.run_id == on
    steps = [m.step for m in client.get_metric_history(on, "system/cpu_utilization_percentage")]
    assert len(steps) > len(history) and len(set(steps)) == len(steps)
