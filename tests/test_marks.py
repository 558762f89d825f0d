"""`-m "not slow"` is a quick run: a test that starts a Ray Train run, a Tune sweep, an MLflow server or a cluster
of its own without the mark that says so fails (conftest's `pytest_runtest_protocol`, `process_helpers.require_mark`).
These tests carry no mark, so each start is refused before anything starts."""

from __future__ import annotations

import pytest
from mlflow_server import start_server

NOT_MARKED = pytest.fail.Exception


def test_an_unmarked_test_cannot_start_ray_train():
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=1))
    with pytest.raises(NOT_MARKED, match="starts a Ray Train run but is not marked slow"):
        trainer.fit()


def test_an_unmarked_test_cannot_start_a_tune_sweep():
    from ray import tune

    with pytest.raises(NOT_MARKED, match="starts a Ray Tune sweep but is not marked slow"):
        tune.Tuner(lambda config: None).fit()


def test_an_unmarked_test_cannot_start_an_mlflow_server(tmp_path):
    with pytest.raises(NOT_MARKED, match="starts an MLflow server but is not marked slow"):
        start_server(tmp_path / "store", port=1)
    assert not (tmp_path / "store").exists()  # refused before anything was made


def test_an_unmarked_test_cannot_start_a_cluster():
    from cluster_helpers import loopback_cluster

    with pytest.raises(NOT_MARKED, match="starts a Ray cluster of its own but is not marked heavy"):
        loopback_cluster()
