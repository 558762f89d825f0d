"""MLflow tracking against a real `mlflow server`: run reuse, secret redaction, metrics buffered while it is down."""

from __future__ import annotations

import pytest
from mlflow_server import free_port, start_server, stop_server

from albert_dist.tracking import run as tracking
from albert_dist.tracking.metrics_log import MetricsLogger


@pytest.fixture
def server(tmp_path):
    port = free_port()
    process = start_server(tmp_path, port)
    handle = {"process": process, "port": port, "uri": f"http://127.0.0.1:{port}", "store": tmp_path}
    yield handle
    if handle["process"].poll() is None:
        stop_server(handle["process"])


@pytest.mark.slow
def test_metrics_survive_a_tracking_outage(server, tmp_path, capsys, monkeypatch):
    # no retries: a call to the stopped server fails at once (connection refused); the timeout stays long, as a
    # freshly started server on a loaded machine may need seconds to answer its first writes
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    run_id = tracking.start_or_resume_run(server["uri"], "outage", tmp_path / "run", "outage")
    logger = MetricsLogger(server["uri"], run_id)
    logger({"loss": 3.0}, 1)

    stop_server(server["process"])
    logger({"loss": 2.0}, 2)
    logger({"loss": 1.5}, 3)
    assert len(logger.pending) == 2
    assert "MLflow unreachable" in capsys.readouterr().out

    server["process"] = start_server(server["store"], server["port"])
    step = 4  # the logger retries at each log step until the server answers
    logger({"loss": 1.0}, step)
    while logger.pending and step < 8:
        step += 1
        logger({"loss": 1.0}, step)
    assert logger.pending == []
    history = tracking.mlflow_client(server["uri"]).get_metric_history(run_id, "loss")
    expected = [(1, 3.0), (2, 2.0), (3, 1.5)] + [(s, 1.0) for s in range(4, step + 1)]
    assert sorted((m.step, m.value) for m in history) == expected
    assert "flushed" in capsys.readouterr().out

    # a restarted worker continues the run without logging the replayed steps again
    restarted = MetricsLogger(server["uri"], run_id, skip_replayed=True)
    restarted({"loss": 9.9}, 3)
    restarted({"loss": 0.5}, step + 1)
    steps = sorted(m.step for m in tracking.mlflow_client(server["uri"]).get_metric_history(run_id, "loss"))
    assert steps == list(range(1, step + 2))


def test_metrics_a_dead_worker_left_pending_are_sent_by_the_next_logger_and_not_logged_twice(tmp_path, monkeypatch):
    """The logger's state file keeps what the server did not get; a restarted worker's logger sends it, and does
    not log again the steps it trains a second time after resuming from its checkpoint, without asking the
    server (which may still be down when the worker restarts)."""
    from mlflow_server import free_port

    from albert_dist.tracking.metrics_log import send_left_behind

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_or_resume_run(store, "spill", tmp_path / "run", "spill")
    state = tmp_path / "run" / "tracked_metrics.json"
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every request is refused
    dead = MetricsLogger(down, run_id, state_file=state)
    for step in (1, 2, 3):
        dead({"loss": 4.0 - step}, step)
    assert len(dead.pending) == 3
    del dead  # the worker is gone; only its state file is left

    restarted = MetricsLogger(down, run_id, skip_replayed=True, state_file=state)
    assert restarted.resume_after == 3 and len(restarted.pending) == 3  # known without the server
    restarted({"loss": 9.9}, 2)  # trained again after resuming from the checkpoint of step 1: not logged
    restarted({"loss": 0.5}, 4)
    assert len(restarted.pending) == 4
    send_left_behind(store, run_id, state)  # the driver, once training ended, reaches the store
    history = tracking.mlflow_client(store).get_metric_history(run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 3.0), (2, 2.0), (3, 1.0), (4, 0.5)]
    assert MetricsLogger(store, run_id, state_file=state).pending == []  # nothing left to send twice
    other_run = MetricsLogger(store, "another-run", skip_replayed=True, state_file=state)
    assert other_run.resume_after == -1 and other_run.pending == []  # a state of another run is not taken


def checkout_head() -> str:
    """The commit of the checkout the tests (and the package beside them) are in."""
    import subprocess
    from pathlib import Path

    return subprocess.run(
        ["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_run_is_reused_from_the_run_directory_and_secrets_are_redacted(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = tracking.start_or_resume_run(uri, "exp", tmp_path / "run", "r")
    tracking.finish_run(uri, first)
    again = tracking.start_or_resume_run(uri, "exp", tmp_path / "run", "r", tags={"albert_dist.job": "finetune"})
    assert again == first
    client = tracking.mlflow_client(uri)
    assert client.get_run(first).info.status == "RUNNING"
    assert client.get_run(first).data.tags["albert_dist.job"] == "finetune"  # tags reach a reused run too
    commit = client.get_run(first).data.tags["albert_dist.code_version"].removesuffix("-dirty")
    assert len(commit) >= 7 and checkout_head().startswith(commit)  # the checkout's commit, not the package version
    assert client.get_run(again).data.tags["mlflow.source.git.commit"] == checkout_head()

    tracking.log_params(uri, first, {"train.lr": 0.1, "auth.api_key": "abc123", "env.RAY_AUTH_TOKEN": "t0k"})
    params = client.get_run(first).data.params
    assert params == {"train.lr": "0.1", "auth.api_key": "***", "env.RAY_AUTH_TOKEN": "***"}
    tracking.log_params(uri, first, {"train.lr": 0.1, "train.steps": 5})  # resume: only new keys are added
    assert client.get_run(first).data.params["train.steps"] == "5"


def test_a_new_run_replaces_a_deleted_one_but_not_one_the_store_failed_to_find(tmp_path):
    from mlflow.exceptions import MlflowException

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.mlflow_client(uri)
    first = tracking.start_or_resume_run(uri, "exp", tmp_path / "run", "r")
    client.delete_run(first)
    second = tracking.start_or_resume_run(uri, "exp", tmp_path / "run", "r")
    assert second != first and (tmp_path / "run" / tracking.RUN_ID_FILE).read_text() == second
    # any other error asking for the recorded run stops the job: a second run would split its history in two
    (tmp_path / "run" / tracking.RUN_ID_FILE).write_text("../not-a-run-id")
    with pytest.raises(MlflowException, match="not-a-run-id"):
        tracking.start_or_resume_run(uri, "exp", tmp_path / "run", "r")
    assert len(client.search_runs([client.get_experiment_by_name("exp").experiment_id], run_view_type=3)) == 2


def test_default_store_keeps_artifacts_beside_its_database(tmp_path, monkeypatch):
    from albert_dist.config import TrackingSection

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # MLflow's default would put artifacts in ./mlruns of this directory
    uri = TrackingSection().resolved_uri(str(tmp_path / "out"))
    run_id = tracking.start_or_resume_run(uri, "exp", tmp_path / "run", "r", tags={"albert_dist.job": "pretrain"})
    tracking.log_text(uri, run_id, "hello", "notes/hello.txt")

    client = tracking.mlflow_client(uri)
    experiment = client.get_experiment_by_name("exp")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens the runs view
    assert list((tmp_path / "out" / "mlartifacts").rglob("hello.txt"))
    assert not list(elsewhere.iterdir())
    tags = client.get_run(run_id).data.tags
    assert tags["mlflow.source.name"] == "albert-dist pretrain"

    # an experiment created without a kind (by MLflow itself, or an older albert-dist) gets it when reused
    bare = client.create_experiment("bare")
    tracking.start_or_resume_run(uri, "bare", tmp_path / "run2", "r2")
    assert client.get_experiment(bare).tags["mlflow.experimentKind"] == "custom_model_development"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite store for the job_run tests (each test its own run directories)."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


def job_config(store: str, tmp_path, name: str):
    from albert_dist.pretrain.config import PretrainJobConfig

    return PretrainJobConfig.model_validate(
        {"run": {"name": name, "output_dir": str(tmp_path / "runs")}, "tracking": {"tracking_uri": store}}
    )


def tracked(cfg, job: str, tags=None, extra_params=None):
    """The job run of `cfg` as a training job opens it: its run target, its flat params and its YAML."""
    from albert_dist.config import dump_yaml, flatten
    from albert_dist.train.plan import run_target

    params = {**flatten(cfg), **(extra_params or {})}
    return tracking.job_run(run_target(cfg), job, params=params, config_yaml=dump_yaml(cfg), tags=tags)


def test_job_run_ends_finished_and_a_relaunch_resumes_the_same_run(store, tmp_path):
    cfg = job_config(store, tmp_path, "ok")
    with tracked(cfg, "pretrain", tags={"albert_dist.source_model": "m"}, extra_params={"world_size": 2}) as run:
        client = tracking.mlflow_client(run.uri)
        assert client.get_run(run.run_id).info.status == "RUNNING"
    first = client.get_run(run.run_id)
    assert first.info.status == "FINISHED"
    assert first.data.params["run.name"] == "ok" and first.data.params["world_size"] == "2"
    assert first.data.tags["albert_dist.job"] == "pretrain" and first.data.tags["albert_dist.source_model"] == "m"
    (tmp_path / "artifacts").mkdir()
    config = client.download_artifacts(run.run_id, "config/pretrain.yaml", str(tmp_path / "artifacts"))
    assert "name: ok" in open(config).read()

    with tracked(cfg, "pretrain") as again:
        assert again.run_id == run.run_id
        assert client.get_run(run.run_id).info.status == "RUNNING"
    assert client.get_run(run.run_id).info.status == "FINISHED"


@pytest.mark.parametrize(
    "error, status", [(ValueError("bad input"), "FAILED"), (KeyboardInterrupt(), "KILLED"), (SystemExit(1), "FAILED")]
)
def test_job_run_marks_the_run_failed_on_any_exception_and_killed_on_ctrl_c(store, tmp_path, error, status):
    with pytest.raises(type(error)):
        with tracked(job_config(store, tmp_path, "broken"), "finetune") as run:
            raise error
    assert tracking.mlflow_client(run.uri).get_run(run.run_id).info.status == status


def test_a_run_ended_by_someone_else_keeps_its_status_when_the_job_then_fails(store, tmp_path):
    # a sweep's driver ends the run of a trial its scheduler stopped (KILLED) before the trial's process stops
    with pytest.raises(RuntimeError):
        with tracked(job_config(store, tmp_path, "stopped"), "finetune") as run:
            tracking.finish_run(run.uri, run.run_id, "KILLED")
            raise RuntimeError("the trial's workers were stopped")
    assert tracking.mlflow_client(run.uri).get_run(run.run_id).info.status == "KILLED"


def test_a_tracking_failure_after_publishing_names_the_saved_model(store, tmp_path):
    from albert_dist.errors import TrackingError

    model_dir = tmp_path / "runs" / "published" / "model"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    with pytest.raises(TrackingError) as raised:
        with tracked(job_config(store, tmp_path, "published"), "distill") as run:
            run.published(model_dir)
            run.log_artifacts(model_dir, "../outside")  # refused by MLflow: an artifact path out of the run
    message = str(raised.value)
    assert message.startswith(f"the model is saved at {model_dir}, but tracking failed: MLflow failed logging")
    assert message.endswith(f"MLflow run {run.run_id} marked FAILED") and "\n" not in message
    assert tracking.mlflow_client(run.uri).get_run(run.run_id).info.status == "FAILED"


def test_metrics_the_store_refuses_for_good_are_dropped_not_retried_forever(tmp_path, capsys):
    """An invalid value or a run deleted from the store is refused at every retry: such a batch is reported and
    dropped, so it cannot block the metrics logged after it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_or_resume_run(uri, "refused", tmp_path / "run", "refused")
    logger = MetricsLogger(uri, run_id)
    logger({"bad name!": 1.0}, 1)
    logger({"loss": 2.0}, 2)
    assert logger.pending == []
    assert "refused 1 metric value(s) of steps 1-1 for good (INVALID_PARAMETER_VALUE" in capsys.readouterr().out
    assert [(m.step, m.value) for m in tracking.mlflow_client(uri).get_metric_history(run_id, "loss")] == [(2, 2.0)]

    tracking.mlflow_client(uri).delete_run(run_id)
    logger({"loss": 1.0}, 3)
    assert logger.pending == [] and "for good" in capsys.readouterr().out


def test_a_job_says_where_its_run_is_without_the_stores_credentials():
    server = tracking.where_to_find("https://alice:s3cret@mlflow.example:5000", "abc123")
    assert server.splitlines() == [
        "MLflow run abc123 at https://***@mlflow.example:5000",
        "MLflow UI: open https://***@mlflow.example:5000 (through an SSH tunnel or port-forward when it is remote)",
    ]
    local = tracking.where_to_find("sqlite:////runs/mlflow.db", "abc123")
    assert local.endswith("mlflow ui --backend-store-uri sqlite:////runs/mlflow.db --host 127.0.0.1 --port 5000")


def test_runs_logging_one_dataset_at_once_all_record_it(tmp_path):
    """A sweep's trials log the same dataset into one experiment at the same moment: MLflow's SQL store looks the
    dataset up, then inserts it, so all but one collide on its unique key. Every run must still record it."""
    import threading

    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("sweep")
    runs = [client.create_run(experiment).info.run_id for _ in range(8)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("一句话。\n")
    together = threading.Barrier(len(runs))
    failures = []

    def log(run_id):
        together.wait()
        try:
            tracking.log_datasets(uri, run_id, [("train", "corpus", corpus, "0123456789abcdef", {"rows": 1})])
        except Exception as err:  # noqa: BLE001 - collected to assert on below
            failures.append(err)

    threads = [threading.Thread(target=log, args=(run_id,)) for run_id in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    for run_id in runs:
        assert [d.dataset.name for d in client.get_run(run_id).inputs.dataset_inputs] == ["corpus"]
