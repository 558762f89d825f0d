"""The MLflow model served where only its logged requirements are installed: a tiny classifier is logged and
registered as a job logs its model (`tracking.models.log_model`), a fresh virtual environment outside the checkout
gets torch's CPU wheel and the model's `requirements.txt` and nothing else (albert-dist comes from the wheel logged
with the model), and `mlflow models serve -m models:/NAME/1 --env-manager local` from that environment answers real
HTTP `/invocations` requests on 127.0.0.1 with the `Predictor`'s predictions."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import pytest
import tomllib
import torch
from mlflow_server import free_port
from packaging.requirements import Requirement
from process_helpers import is_loopback, listeners_of, process_tree
from test_serve import TEXTS, assert_same_predictions, classifier_dir, reference
from venv_helpers import clean_env, fresh_venv, run

from albert_dist.finetune.mlflow_model import SequenceClassifierModel
from albert_dist.tracking import models
from albert_dist.tracking.models import CODE_DIR, log_model

REPO = Path(__file__).resolve().parent.parent
NAME = "tiny-classifier"


def fresh_env(tracking_uri: str) -> dict[str, str]:
    # the reference below computes with this process's torch threads: the same count gives the same sums
    return clean_env(MLFLOW_TRACKING_URI=tracking_uri, OMP_NUM_THREADS=str(torch.get_num_threads()))


@pytest.mark.slow
@pytest.mark.heavy
def test_the_registered_model_serves_from_a_fresh_environment(stdlib_corpus, tmp_path, monkeypatch):
    start = time.perf_counter()
    model_dir = classifier_dir(tmp_path / "classifier", stdlib_corpus)
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri)
    experiment = client.create_experiment("serve", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    log_model(tracking_uri, run_id, model_dir, SequenceClassifierModel(), "classifier", step=0, register_as=NAME)
    uri = f"models:/{NAME}/1"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)  # the registry's too, as for `mlflow models serve`
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    logged = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "logged")))
    requirements = (logged / "requirements.txt").read_text().split()
    wheels = [r for r in requirements if r.startswith(f"{CODE_DIR}/albert_dist-")]
    assert len(wheels) == 1 and (logged / wheels[0]).is_file()  # albert-dist travels with the model

    venv = tmp_path / "venv"  # outside the checkout, as tmp_path is
    assert REPO not in venv.parents
    env = fresh_env(tracking_uri)
    pip = fresh_venv(venv, env, tmp_path)
    run([*pip, "-r", "requirements.txt"], logged, env, 1500)  # its lines name the wheel relative to the model
    installed = run(
        [str(venv / "bin" / "python"), "-c", "import albert_dist; print(albert_dist.__file__)"], tmp_path, env, 120
    )
    assert Path(installed.strip()).is_relative_to(venv)
    setup_s = time.perf_counter() - start

    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"  # as activating it does: MLflow runs `uvicorn` by name
    port = free_port()
    server = subprocess.Popen(
        [str(venv / "bin" / "mlflow"), "models", "serve", "-m", uri, "--env-manager", "local"]
        + ["-h", "127.0.0.1", "-p", str(port), "-w", "1"],
        cwd=tmp_path,
        env=env,
        stdout=(tmp_path / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=10).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("mlflow models serve did not come up:\n" + (tmp_path / "serve.log").read_text()[-4000:])
                time.sleep(0.5)
        body = json.dumps({"dataframe_records": [{"text": text} for text in TEXTS]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            predictions = json.loads(response.read())["predictions"]
        # the pyfunc model predicts as `albert-dist predict` does by default: "auto" precision, batches of 64
        expected = reference(model_dir, TEXTS, precision="auto")
        assert_same_predictions(predictions, expected)
        listeners = listeners_of(process_tree(server.pid))
        assert listeners and all(is_loopback(ip) for ip, _, _ in listeners), listeners
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        shutil.rmtree(venv, ignore_errors=True)
    print(f"fresh environment ready in {setup_s:.0f} s; whole test {time.perf_counter() - start:.0f} s")


def test_the_model_carries_the_wheel_of_the_sources_it_runs_from(monkeypatch, tmp_path):
    """From a source tree: the wheel, built from it, is the model's code and its first requirement, with the
    requirements of the pyproject.toml it was built from. Installed without its sources: albert-dist by version."""
    import zipfile
    from importlib.metadata import version

    code_paths, requirements = models._package()
    wheel = Path(code_paths[0])
    assert requirements[0] == f"{CODE_DIR}/{wheel.name}"
    with zipfile.ZipFile(wheel) as built:
        assert built.read("albert_dist/serve/server.py") == (REPO / "albert_dist/serve/server.py").read_bytes()
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [r.replace(" ", "") for r in requirements[1:]] == [str(Requirement(r)).replace(" ", "") for r in declared]
    monkeypatch.setattr(models, "SOURCE_ROOT", tmp_path)  # no pyproject.toml beside the package
    code_paths, requirements = models._package()
    assert code_paths is None and requirements[0] == f"albert-dist=={version('albert-dist')}"
