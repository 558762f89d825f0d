"""cluster/local/start.sh end to end: a real Ray cluster and MLflow server (token and basic auth), jobs submitted with
`albert-dist submit`, runs found on the server, nothing listening beyond loopback, no secret in logs or runs.

The cluster gets its own ports, state and temp dirs, so it runs beside any other Ray on the machine; the test
process talks to it only through subprocesses and HTTP.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from checkpoint_helpers import assert_mid_run, verifying_steps
from cluster_helpers import prepare_args, pretrain_args, sets
from finetune_helpers import single_rows, write_csv
from mlflow.exceptions import MlflowException
from process_helpers import beyond_loopback, listeners_of, listeners_sampled, train_workers_of, wait_until_gone

from albert_dist.cluster.submit import auth_headers

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# A cloud key in the submitter's environment must never travel anywhere (made here: the checkout is uploaded).
CANARY = f"canary-{uuid.uuid4().hex}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sourced_env(env_file: Path) -> dict[str, str]:
    """The environment after `source env.sh`."""
    out = subprocess.run(["bash", "-c", f"source {env_file} && env -0"], capture_output=True, check=True)
    return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)


@pytest.fixture(scope="module")
def cluster():
    state = Path(tempfile.mkdtemp(prefix="adc-", dir="/tmp"))
    ports = {"ALBERT_RAY_PORT": free_port(), "ALBERT_DASHBOARD_PORT": free_port(), "ALBERT_MLFLOW_PORT": free_port()}
    env = {**os.environ, "ALBERT_CLUSTER_STATE": str(state), **{k: str(v) for k, v in ports.items()}}
    env.pop("ALBERT_DIST_HOME", None)
    stop = ["bash", str(REPO / "cluster/local/stop.sh")]
    try:
        started = subprocess.run(
            ["bash", str(REPO / "cluster/local/start.sh")], env=env, capture_output=True, text=True, timeout=300
        )
        assert started.returncode == 0, started.stdout + started.stderr
        client_env = {**sourced_env(state / "env.sh"), "AWS_SECRET_ACCESS_KEY": CANARY}
        yield state, client_env
    finally:
        subprocess.run(stop, env=env, capture_output=True, timeout=120)
        assert not cluster_pids(state), "stop.sh left processes behind"
        shutil.rmtree(state, ignore_errors=True)


def cluster_pids(state: Path) -> set[int]:
    marker = f"ALBERT_LOCAL_CLUSTER={state}".encode()
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                pids.add(int(pid))
        except OSError:
            pass
    return pids


def submit(env: dict[str, str], *args: str, timeout: float = 400) -> str:
    out = subprocess.run(
        [str(BIN / "albert-dist"), "submit", *args, "--follow"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]
    return out.stdout


def job_status(env: dict[str, str], submission_id: str) -> str | None:
    """The job's status as the cluster's dashboard answers it (None: no such job), without a CLI's start-up."""
    request = urllib.request.Request(f"{env['RAY_ADDRESS']}/api/jobs/{submission_id}", headers=auth_headers(env))
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)["status"]
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise


def test_listeners_are_loopback_only(cluster):
    state, _ = cluster
    pids = cluster_pids(state)
    ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    ours = [line.split()[3] for line in ss.splitlines() if {int(p) for p in re.findall(r"pid=(\d+),", line)} & pids]
    assert len(ours) >= 4  # GCS, raylet, dashboard, MLflow at least
    for local in ours:
        host = local.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")
        assert host != "*" and ipaddress.ip_address(host).is_loopback, f"listening on {local}"


def test_a_training_job_listens_on_loopback_only(stopped_and_resubmitted):
    """The submitted job's training workers, sampled once mid-run and throughout its resubmission: the rendezvous of
    its two workers too (torch's store listens on every interface unless handed a socket; the job's worker setup
    hook hands it one)."""
    listening = stopped_and_resubmitted["listening_while_training"]
    assert [name for _, _, name in listening if "RayTrainWo" in name], sorted(listening)
    assert not beyond_loopback(listening), f"listening beyond loopback: {beyond_loopback(listening)}"


def test_without_credentials_nothing_is_served(cluster):
    _, env = cluster
    for url in (
        f"{env['RAY_ADDRESS']}/api/jobs/",
        f"{env['MLFLOW_TRACKING_URI']}/api/2.0/mlflow/experiments/search?max_results=1",
    ):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=30)
        assert refused.value.code == 401, url
    denied = subprocess.run(
        [str(BIN / "albert-dist"), "jobs", "list"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={k: v for k, v in env.items() if not k.startswith("RAY_AUTH")},
        timeout=120,
    )
    assert denied.returncode != 0


def mlflow_client(env: dict[str, str]):
    """A client of the cluster's MLflow server with the credentials in `env` (the submitter's: admin), set in this
    process's environment until the next call or the caller's `finally`: `forget_mlflow_credentials`."""
    from mlflow.tracking import MlflowClient

    os.environ.update({k: env[k] for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")})
    return MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])


def forget_mlflow_credentials() -> None:
    for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        os.environ.pop(k, None)


STOP_RESUME_STEPS = 120


@pytest.fixture(scope="module")
def stopped_and_resubmitted(cluster, stdlib_corpus):
    """The data prepared by a job; a pretraining job stopped (`albert-dist jobs stop`) after its first checkpoint
    and then submitted again, to the end. Its model is what the end-to-end test fine-tunes (one pretraining job
    serves both tests: every job costs minutes on 2 cores)."""
    state, env = cluster
    outputs = Path(env["ALBERT_DIST_HOME"])
    submit(env, "prepare_data", *prepare_args(stdlib_corpus), "--name", "prepare-1")
    # the stop lands ~15 steps after the first checkpoint here (5.5 s on a loaded 2-core machine): 120 steps leave
    # the job most of its run to be stopped in, and the resubmitted job little to train again
    args = [
        *pretrain_args("stop-resume", steps=STOP_RESUME_STEPS),
        *sets("train.checkpoint_every=10", "train.log_every=10", f"train.eval_every={STOP_RESUME_STEPS}"),
    ]
    cli = [str(BIN / "albert-dist")]
    started = subprocess.run(
        [*cli, "submit", "pretrain", *args, "--name", "pretrain-stop"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stdout + started.stderr

    # while it runs, the same submission again is refused (two drivers would share the run), before the job's
    # first checkpoint: in time it would spend waiting for it anyway
    deadline = time.time() + 400
    while job_status(env, "pretrain-stop") != "RUNNING":
        assert time.time() < deadline, job_status(env, "pretrain-stop")
        time.sleep(0.5)
    again = subprocess.run(
        [*cli, "submit", "pretrain", *args, "--name", "pretrain-stop"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode != 0 and "Traceback" not in again.stderr, again.stdout + again.stderr
    assert "job pretrain-stop is still RUNNING: stop it first (albert-dist jobs stop pretrain-stop)" in again.stderr
    assert job_status(env, "pretrain-stop-2") is None  # nothing submitted under the next attempt's name either

    storage = outputs / "runs" / "stop-resume" / "ray" / "stop-resume"
    while not list(storage.glob("checkpoint_*/manifest.json")):
        assert job_status(env, "pretrain-stop") == "RUNNING" and time.time() < deadline, "no checkpoint within 400 s"
        time.sleep(1)
    workers = set(train_workers_of(1)) & cluster_pids(state)  # the job's: no other runs on the cluster
    assert len(workers) == 2, workers
    listening = listeners_of(cluster_pids(state))  # the training rendezvous rank 0 serves among them
    stopped = subprocess.run(
        [*cli, "jobs", "stop", "pretrain-stop"], env=env, capture_output=True, text=True, timeout=120
    )
    assert "stop requested" in stopped.stdout, stopped.stdout + stopped.stderr
    while (
        status := subprocess.run(
            [*cli, "jobs", "status", "pretrain-stop"], env=env, capture_output=True, text=True, timeout=120
        )
    ).returncode == 0:
        assert time.time() < deadline + 120, status.stdout
        time.sleep(1)
    assert "STOPPED" in status.stdout, status.stdout
    assert not wait_until_gone(workers), "the stopped job's training workers are still running"
    verifying = verifying_steps(outputs / "runs" / "stop-resume")
    with listeners_sampled(lambda: cluster_pids(state)) as listening_when_resubmitted:
        out = submit(env, "pretrain", *args, "--name", "pretrain-stop", timeout=900)
    return {
        "out": out,
        "verifying": verifying,
        "model_dir": outputs / "runs" / "stop-resume" / "model",
        "listening_while_training": listening | listening_when_resubmitted,
    }


def test_stopped_job_resumes_when_submitted_again(cluster, stopped_and_resubmitted):
    """`albert-dist jobs stop` mid-run, then the same submission again: it runs as `<name>-2` and the training
    resumes from the stopped run's latest checkpoint, in the same MLflow run."""
    _, env = cluster
    out = stopped_and_resubmitted["out"]
    assert "submitting this attempt as pretrain-stop-2" in out
    resumed = [int(step) for step in re.findall(r"resumed from \S+ at step (\d+)", out)]
    assert resumed, out[-3000:]
    assert_mid_run(resumed[0], stopped_and_resubmitted["verifying"], STOP_RESUME_STEPS)
    assert "pretrain-stop-2 SUCCEEDED" in out
    final = json.loads((stopped_and_resubmitted["model_dir"] / "config.json").read_text())
    assert final["hidden_size"] == 64
    try:
        client = mlflow_client(env)
        runs = client.search_runs(
            [client.get_experiment_by_name("albert-pretrain").experiment_id],
            filter_string="attributes.run_name = 'stop-resume'",
        )
        assert len(runs) == 1 and runs[0].info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")]
        assert len(steps) == len(set(steps)) and max(steps) == STOP_RESUME_STEPS
    finally:
        forget_mlflow_credentials()


def test_jobs_run_and_land_in_mlflow_without_secrets(cluster, stopped_and_resubmitted, tmp_path):
    state, env = cluster
    outputs = Path(env["ALBERT_DIST_HOME"])
    model_dir = stopped_and_resubmitted["model_dir"]
    assert model_dir.is_relative_to(outputs)  # under the output root, not the job's temporary copy
    expected = {"albert-pretrain": "stop-resume"}

    write_csv(tmp_path / "train.csv", single_rows(96, seed=1))
    out = submit(
        env,
        "finetune",
        "--config",
        "albert_dist/configs/finetune.yaml",
        "--name",
        "finetune-1",
        *sets(
            "run.name=e2e-finetune",
            f"model.init_from={model_dir}",
            f"data.train={tmp_path / 'train.csv'}",
            "data.dev=",
            "data.text_column=text",
            "data.max_seq_length=32",
            "finetune.epochs=1",
            "scaling.use_gpu=false",
            "scaling.num_workers=1",
            "scaling.cpus_per_worker=0.5",
            "train.batch_size=16",
            "train.eval_every=100",
            "train.precision=fp32",
        ),
    )
    assert "finetune-1 SUCCEEDED" in out
    expected["albert-finetune"] = "e2e-finetune"

    jobs_user = {
        "MLFLOW_TRACKING_USERNAME": "albert-jobs",
        "MLFLOW_TRACKING_PASSWORD": (state / "mlflow_jobs_password").read_text().strip(),
    }
    secrets = {
        CANARY,
        env["MLFLOW_TRACKING_PASSWORD"],
        jobs_user["MLFLOW_TRACKING_PASSWORD"],
        (state / "ray_auth_token").read_text().strip(),
    }
    try:
        client = mlflow_client(env)
        admins_own = client.create_experiment("admins-own")
        # The jobs logged as albert-jobs, which sees the experiments it created and nothing else
        jobs_client = mlflow_client({**env, **jobs_user})
        for experiment in expected:
            assert jobs_client.get_experiment_by_name(experiment) is not None, experiment
        with pytest.raises(MlflowException, match="error code 403"):  # "Permission denied"
            jobs_client.get_experiment(admins_own)
        client = mlflow_client(env)
        for experiment, run_name in expected.items():
            runs = client.search_runs(
                [client.get_experiment_by_name(experiment).experiment_id],
                filter_string=f"attributes.run_name = '{run_name}'",
            )
            assert len(runs) == 1 and runs[0].info.status == "FINISHED"
            run = runs[0]
            assert {"loss"} <= set(run.data.metrics), run.data.metrics
            assert {"config.json", "model.safetensors"} <= {
                Path(a.path).name for a in client.list_artifacts(run.info.run_id, "model")
            }
            logged = " ".join(f"{k}={v}" for k, v in {**run.data.params, **run.data.tags}.items())
            assert not any(s in logged for s in secrets)
            for artifact in client.list_artifacts(run.info.run_id, "config"):
                text = Path(client.download_artifacts(run.info.run_id, artifact.path, str(tmp_path))).read_text()
                assert not any(s in text for s in secrets)
    finally:
        forget_mlflow_credentials()

    ray_tmp = Path((state / "ray_tmp").read_text().strip())
    searched = [ray_tmp / "session_latest", state / "logs", outputs, state / "mlflow" / "artifacts"]
    assert all(any(folder.rglob("*")) for folder in searched), "a folder to search is missing or empty"
    leaks = subprocess.run(
        ["grep", "-rlaF", *sum((["-e", s] for s in secrets), []), *map(str, searched)], capture_output=True, text=True
    )
    # grep's exit status 1 is "searched everything, found nothing"; 2 (a path it could not read) is no proof
    assert leaks.returncode == 1, f"secrets written to {leaks.stdout}" if leaks.stdout else leaks.stderr
