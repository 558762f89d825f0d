"""A tracking server that turns us away: a real `mlflow server --app-name basic-auth` whose training user loses
its permission on the experiment (403) or its password (401) mid-run, then gets it back. The metrics are kept
(in the logger and its state file) and sent once access returns; training never stops for it."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest
from fault_proxy import FaultProxy
from mlflow_server import free_port, start_server, stop_server
from test_cluster_multinode import basic_auth_config
from test_s3 import cli_args

from albert_dist.tracking.metrics_log import MetricsLogger

TRAINER = "trainer"
REFUSED = 3  # batches of metrics the server refuses before access is given back


pytestmark = pytest.mark.slow  # both tests talk to a real MLflow server


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """The server (only the admin may do anything by default) and a user `trainer` who creates experiments (and
    so manages them); yields its URI and the trainer's password. The test process acts as the admin."""
    from mlflow.server import get_app_client

    root = tmp_path_factory.mktemp("mlflow-auth")
    admin_password, password = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    port = free_port()
    server = start_server(root, port, basic_auth_config(root, admin_password))
    uri = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    os.environ.update(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=admin_password)
    try:
        get_app_client("basic-auth", tracking_uri=uri).create_user(TRAINER, password)
        yield uri, password
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stop_server(server)


def users(uri: str):
    from mlflow.server import get_app_client

    return get_app_client("basic-auth", tracking_uri=uri)


def loss_steps(uri: str, run_id: str) -> list[int]:
    from mlflow.tracking import MlflowClient

    return [m.step for m in MlflowClient(uri).get_metric_history(run_id, "loss")]


def test_metrics_refused_for_credentials_are_kept_and_sent_when_access_returns(auth_server, tmp_path, capsys):
    """The logger, as rank 0 runs it, against the real server: steps logged while the trainer's permission is
    removed (403), then while its password is changed (401), stay pending in the logger and its state file, with
    one warning each time; when access returns they are sent, every step exactly once."""
    from mlflow.tracking import MlflowClient

    uri, password = auth_server
    admin = users(uri)
    with pytest.MonkeyPatch.context() as trainer:
        trainer.setenv("MLFLOW_TRACKING_USERNAME", TRAINER)
        trainer.setenv("MLFLOW_TRACKING_PASSWORD", password)
        experiment = MlflowClient(uri).create_experiment("auth-faults-logger")
        run_id = MlflowClient(uri).create_run(experiment).info.run_id
    state = tmp_path / "tracked_metrics.json"

    def log(step: int) -> None:
        with pytest.MonkeyPatch.context() as trainer:  # the logger's requests carry the trainer's credentials
            trainer.setenv("MLFLOW_TRACKING_USERNAME", TRAINER)
            trainer.setenv("MLFLOW_TRACKING_PASSWORD", password)
            logger({"loss": 1.0 / step}, step)

    def pending() -> list[int]:
        return [step for _, _, _, step in json.loads(state.read_text())["pending"]]

    with pytest.MonkeyPatch.context() as trainer:
        trainer.setenv("MLFLOW_TRACKING_USERNAME", TRAINER)
        trainer.setenv("MLFLOW_TRACKING_PASSWORD", password)
        logger = MetricsLogger(uri, run_id, state_file=state)
    log(1)
    admin.revoke_user_permission(TRAINER, "experiment", experiment)
    log(2)
    log(3)
    assert pending() == [2, 3] and loss_steps(uri, run_id) == [1]
    admin.grant_user_permission(TRAINER, "experiment", experiment, "MANAGE")
    log(4)
    assert pending() == [] and loss_steps(uri, run_id) == [1, 2, 3, 4]
    admin.update_user_password(TRAINER, secrets.token_urlsafe(16))
    log(5)
    log(6)
    assert pending() == [5, 6] and loss_steps(uri, run_id) == [1, 2, 3, 4]
    admin.update_user_password(TRAINER, password)
    log(7)
    assert pending() == [] and loss_steps(uri, run_id) == list(range(1, 8))
    out = capsys.readouterr().out
    assert out.count("warning: MLflow refused our credentials") == 2, out
    assert "PERMISSION_DENIED" in out and "UNAUTHENTICATED" in out and "dropped" not in out
    assert out.count("MLflow accepts our metrics again") == 2
    assert password not in out


def test_training_goes_on_while_mlflow_refuses_its_user_and_loses_no_metric(auth_server, tmp_path, stdlib_corpus):
    """A real pretraining run (its own local Ray, the trainer's credentials) reaches the server through a proxy:
    once its first metrics are stored, and before the run has the server's answer, the trainer's permission on the
    experiment is removed; training goes on while the server refuses its next REFUSED batches of metrics (403),
    which rank 0 keeps in its state file; the permission is then given back. Once the next batch is stored, the
    trainer's password is changed: the next REFUSED batches are refused 401, kept, and sent once the password is
    back. A tracking outage never costs the training: the run says so once per refusal, every logged step is in
    MLflow exactly once, the run FINISHED, no traceback in the output. The proxy's triggers make this hold however
    fast the run."""
    from mlflow.tracking import MlflowClient

    uri, password = auth_server
    prepared, corpus = tmp_path / "prepared", tmp_path / "corpus.txt"
    corpus.write_bytes(stdlib_corpus.read_bytes()[:80_000])
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")} | {
        "MLFLOW_TRACKING_USERNAME": TRAINER,
        "MLFLOW_TRACKING_PASSWORD": password,
        "PYTHONUNBUFFERED": "1",
    }
    prepare = [
        "data",
        "prepare",
        f"run.output_dir={tmp_path / 'runs'}",
        f"data.output={prepared}",
        f"data.inputs=[{corpus}]",
        "tokenizer.vocab_size=300",
        "data.eval_fraction=0.1",
        "data.max_seq_length=64",
    ]
    proxy = FaultProxy(uri)
    pretrain = [
        "pretrain",
        f"run.output_dir={tmp_path / 'runs'}",
        "run.name=refused",
        f"tracking.tracking_uri={proxy.url}",
        "tracking.experiment=auth-faults-training",
        f"data.output={prepared}",
        "model.embedding_size=32",
        "model.hidden_size=64",
        "model.num_hidden_layers=2",
        "model.num_attention_heads=2",
        "model.intermediate_size=128",
        "scaling.num_workers=1",
        "train.precision=fp32",
        "train.max_steps=40",
        "train.warmup_steps=1",
        "train.batch_size=8",
        "train.log_every=2",
        "train.eval_every=20",
        "train.checkpoint_every=20",
        "train.eval_batches=2",
    ]
    script = f"import sys\nfrom albert_dist.cli import main\nsys.exit(main({cli_args(prepare)!r}) or main({cli_args(pretrain)!r}))"
    state = tmp_path / "runs" / "refused" / "ray" / "refused" / "tracked_metrics.json"
    admin, client = users(uri), MlflowClient(uri)
    log_batch = lambda method, path: method == "POST" and path.endswith("/runs/log-batch")  # noqa: E731
    refused, held = [], []

    def refuse_then_restore(refuse, restore, then=None) -> None:
        """Run `refuse`, then `restore` once the server has refused REFUSED batches, then `then` once a batch
        after them is stored."""
        refuse()
        episode = []

        def refused_batch() -> None:
            episode.append(proxy.requests[-1])
            if len(episode) < REFUSED:
                proxy.after(log_batch, refused_batch, any_status=True)
                return
            refused.append(episode)
            held.append(json.loads(state.read_text()))  # rank 0 waits for this answer: what it holds so far
            restore()
            if then:
                proxy.after(log_batch, then)

        proxy.after(log_batch, refused_batch, any_status=True)

    def experiment() -> str:
        return client.get_experiment_by_name("auth-faults-training").experiment_id

    def password_changed() -> None:
        refuse_then_restore(
            lambda: admin.update_user_password(TRAINER, secrets.token_urlsafe(16)),
            lambda: admin.update_user_password(TRAINER, password),
        )

    def permission_removed() -> None:
        refuse_then_restore(
            lambda: admin.revoke_user_permission(TRAINER, "experiment", experiment()),
            lambda: admin.grant_user_permission(TRAINER, "experiment", experiment(), "MANAGE"),
            then=password_changed,
        )

    proxy.after(log_batch, permission_removed, body_has=b'"mlm_loss"')  # rank 0's metrics, not the driver's params
    try:
        job = subprocess.run(
            [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900
        )
    finally:
        proxy.close()
    output = job.stdout + job.stderr
    assert job.returncode == 0, output[-3000:]
    assert [[r.status for r in episode] for episode in refused] == [[403] * REFUSED, [401] * REFUSED], refused
    assert all(len(state["pending"]) >= 1 and state["last_step"] < 40 for state in held), held
    # one warning per refusal, naming it, and one line when the metrics go through again
    warnings = [line for line in output.splitlines() if "warning: MLflow refused our credentials (" in line]
    assert len(warnings) == 2, output[-3000:]
    assert "PERMISSION_DENIED" in warnings[0] and "UNAUTHENTICATED" in warnings[1], warnings
    assert output.count("MLflow accepts our metrics again") == 2, output[-3000:]
    assert "Traceback" not in output and password not in output
    assert "done: step 40" in output
    [run] = client.search_runs([client.get_experiment_by_name("auth-faults-training").experiment_id])
    assert loss_steps(uri, run.info.run_id) == list(range(2, 41, 2))
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    assert json.loads(state.read_text())["pending"] == []
