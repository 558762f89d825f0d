"""`-m "not slow"` is a quick run: a test that starts a Ray Train run, a Tune sweep, an MLflow server or a cluster
of its own without the mark that says so fails (conftest's `pytest_runtest_protocol`, `process_helpers.require_mark`).
These tests carry no mark, so each start is refused before anything starts."""

from __future__ import annotations

import os

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


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_fail_on_skip_fails_a_module_skipped_at_collection(tmp_path, workers):
    """A module skipped whole while it is collected (`importorskip` of a module that does not import) runs none of
    its tests, so no test report shows them: `--fail-on-skip` still fails the run, with pytest-xdist too."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    shutil.copy(tests / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_vanishing.py").write_text(
        'import pytest\n\npytest.importorskip("no_module_of_that_name")\n\n\ndef test_never_run():\n    pass\n'
    )
    (tmp_path / "test_kept.py").write_text("def test_runs():\n    pass\n")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fail-on-skip", *workers]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run(
        [*command, "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert ran.returncode == pytest.ExitCode.TESTS_FAILED, ran.stdout + ran.stderr
    assert "skipped, which fails this run: test_vanishing.py" in ran.stdout
