"""MLflow: the driver creates (or reopens) the run, rank 0 of the workers logs metrics into it.

Every job's driver tracks itself through `job_run`, one `with` block from opening the run to ending it.
The run id is kept in the run directory, so a relaunch or a restarted worker continues the same MLflow run.
Metric logging never stops training: when the tracking server is unreachable, metrics are buffered and flushed
when it answers again.
"""

from __future__ import annotations

import contextlib
import logging
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from albert_dist.console import quiet_mlflow
from albert_dist.errors import StorageError, TrackingError
from albert_dist.redaction import redact, redact_url
from albert_dist.storage import join_location, publish_text, read_bytes

log = logging.getLogger(__name__)

RUN_ID_FILE = "mlflow_run_id"
JOB_TAG = "albert_dist.job"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_DEVELOPMENT = "custom_model_development"
ARTIFACTS_DIR = "mlartifacts"  # beside a SQLite store's database
DIGEST_CHARS = 12  # of a dataset digest (MLflow keeps at most 36)
DATASET_LOG_ATTEMPTS = 5  # concurrent runs logging one dataset: see log_datasets
# How a store reports a unique key taken by a concurrent insert (SQLite, PostgreSQL, MySQL; through a server too)
_KEY_COLLISION = re.compile(r"UNIQUE constraint failed|duplicate key|Duplicate entry|IntegrityError")


def mlflow_client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    if tracking_uri.startswith("sqlite:///"):  # SQLite creates its file, not the directory it sits in
        Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)

    quiet_mlflow()
    return MlflowClient(tracking_uri=tracking_uri)


def start_or_resume_run(
    tracking_uri: str, experiment: str, run_dir: Path | str, run_name: str, tags: dict[str, str] | None = None
) -> str:
    """The MLflow run of `run_dir` (a local path or a URI): the one recorded there if it still exists, else a new
    one (recorded).
    `tags` are set either way: a sweep creates its trials' runs before their jobs add what they know (lineage).
    Runs carry the source tags of the job named by the `albert_dist.job` tag."""
    client = mlflow_client(tracking_uri)
    tags = {**source_tags((tags or {}).get(JOB_TAG)), **(tags or {})}
    id_file = join_location(run_dir, RUN_ID_FILE)
    try:
        run_id = read_bytes(id_file).decode().strip()
    except FileNotFoundError:
        run_id = None
    if run_id is not None:
        if _run_is_live(client, run_id):
            from mlflow.entities import RunTag

            client.update_run(run_id, status="RUNNING")
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
            return run_id
        log.warning("MLflow run %s recorded in %s was deleted from the store; starting a new run", run_id, id_file)
    run = client.create_run(experiment_id(client, experiment), run_name=run_name, tags={**default_tags(), **tags})
    publish_text(id_file, run.info.run_id)
    return run.info.run_id


def _run_is_live(client, run_id: str) -> bool:
    """Whether the recorded run is in the store and not deleted. Only a definite "no" makes a new run: any other
    error (a server restarting, a timeout) propagates, as a second run would split the job's history in two."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise


def experiment_id(client, name: str) -> str:
    """The experiment `name`, created as a model-training experiment (the MLflow UI opens it on its runs, not in
    its GenAI view), with its artifacts beside the database when the store is a SQLite file (MLflow's default
    would be ./mlruns of whatever directory the command ran in). An experiment found without a kind gets it."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(
                name,
                artifact_location=artifact_location(client.tracking_uri),
                tags={EXPERIMENT_KIND_TAG: MODEL_DEVELOPMENT},
            )
        except MlflowException:  # created meanwhile by a parallel job (sweep trials start together)
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if EXPERIMENT_KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT)
    return exp.experiment_id


def artifact_location(tracking_uri: str) -> str | None:
    """`<directory of the database>/mlartifacts` for a SQLite store; None (the server decides) otherwise."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    database = Path(tracking_uri.removeprefix("sqlite:///").split("?")[0])
    return (database.resolve().parent / ARTIFACTS_DIR).as_uri()


def default_tags() -> dict[str, str]:
    tags = {"albert_dist.code_version": code_version()}
    try:
        import ray

        if ray.is_initialized():
            tags["ray.cluster_cpus"] = str(int(ray.cluster_resources().get("CPU", 0)))
            tags["ray.cluster_gpus"] = str(int(ray.cluster_resources().get("GPU", 0)))
            tags["ray.nodes"] = str(len([n for n in ray.nodes() if n.get("Alive")]))
    except Exception:  # noqa: BLE001 - tags are informative only
        pass
    return tags


def source_tags(job: str | None) -> dict[str, str]:
    """MLflow's source tags, shown in the runs list: the entry point (`albert-dist <job>`) and, in a git
    checkout, the commit."""
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE

    tags = {MLFLOW_SOURCE_NAME: " ".join(["albert-dist", *(job or "").split("-")]).strip(), MLFLOW_SOURCE_TYPE: "LOCAL"}
    commit = _git("rev-parse", "HEAD")
    if commit:
        tags[MLFLOW_GIT_COMMIT] = commit
    return tags


def _git(*args: str) -> str | None:
    """Output of a git command on the package's own checkout; None when the package is not one (installed)."""
    root = Path(__file__).resolve().parents[2]
    try:

        def run(*a: str) -> str:
            return subprocess.run(
                ["git", "-C", str(root), *a], capture_output=True, text=True, timeout=5, check=True
            ).stdout.strip()

        if Path(run("rev-parse", "--show-toplevel")).resolve() != root:
            return None  # installed inside some other repository (a virtualenv in a checkout)
        return run(*args)
    except (OSError, subprocess.SubprocessError):
        return None


def code_version() -> str:
    """The git commit of the package source (with `-dirty` when changed), or the package version."""
    commit = _git("rev-parse", "--short", "HEAD")
    if commit is None:
        from importlib.metadata import version

        return version("albert-dist")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return commit + ("-dirty" if dirty else "")


def log_params(tracking_uri: str, run_id: str, params: dict[str, Any]) -> None:
    """Log params once; on resume, params already logged (same values) are left alone."""
    from mlflow.entities import Param

    client = mlflow_client(tracking_uri)
    existing = client.get_run(run_id).data.params
    fresh = [Param(k, str(v)[:6000]) for k, v in redact(params).items() if k not in existing]
    for i in range(0, len(fresh), 100):
        client.log_batch(run_id, params=fresh[i : i + 100])


def set_tags(tracking_uri: str, run_id: str, tags: dict[str, str]) -> None:
    from mlflow.entities import RunTag

    mlflow_client(tracking_uri).log_batch(run_id, tags=[RunTag(k, redact_url(v)) for k, v in tags.items()])


def finish_run(tracking_uri: str, run_id: str, status: str = "FINISHED") -> None:
    mlflow_client(tracking_uri).set_terminated(run_id, status=status)


@contextlib.contextmanager
def tracking_errors(what: str) -> Iterator[None]:
    """An MLflow failure while doing `what` as one `TrackingError` line instead of a traceback from deep inside
    MLflow's client. The object store failing meanwhile (the run id is kept there) is said as itself."""
    try:
        yield
    except (TrackingError, StorageError):
        raise
    except Exception as err:
        raise TrackingError(f"MLflow failed {what} ({type(err).__name__}: {redact_url(str(err))[:300]})") from err


@dataclass
class JobRun:
    """The MLflow run of one job, as `job_run` opened it. Its `log_*` methods raise `TrackingError`."""

    uri: str
    run_id: str
    register_as: str | None = None  # tracking.register_model
    model_dir: Path | None = None  # the job's model, once published (`published`)
    model_location: str | None = None  # where it was published (its URI, or model_dir)

    def log_params(self, params: dict[str, Any]) -> None:
        with tracking_errors("logging params"):
            log_params(self.uri, self.run_id, params)

    def log_text(self, text: str, artifact_file: str) -> None:
        with tracking_errors(f"logging {artifact_file}"):
            log_text(self.uri, self.run_id, text, artifact_file)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        with tracking_errors(f"logging the artifacts of {local_dir}"):
            log_artifacts(self.uri, self.run_id, local_dir, artifact_path)

    def log_datasets(self, datasets: list[tuple[str, str, str | Path, str, dict]]) -> None:
        with tracking_errors("logging the datasets"):
            log_datasets(self.uri, self.run_id, datasets)

    def log_metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with tracking_errors("logging the final metrics"):
            mlflow_client(self.uri).log_batch(
                self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()]
            )

    def published(self, model_dir: Path, where: str | None = None) -> None:
        """The job's model is in place at `model_dir` (a local directory; published at the URI `where` too): a
        later failure says where."""
        self.model_dir = Path(model_dir)
        self.model_location = where or str(model_dir)

    def log_model(self, python_model, step: int, name: str, files: bool = True) -> None:
        """The published model as the run's MLflow model `name` (linked to the metrics of `step`), registered when
        `tracking.register_model` names a model; with `files`, its files also as the artifacts `model/`."""
        from albert_dist.tracking import models

        if files:
            self.log_artifacts(self.model_dir, "model")
        with tracking_errors("logging the model"):
            models.log_model(
                self.uri, self.run_id, self.model_dir, python_model, name, step=step, register_as=self.register_as
            )

    def end(self, status: str) -> None:
        with tracking_errors(f"marking the run {status}"):
            finish_run(self.uri, self.run_id, status)

    def mark_ended(self, status: str) -> str:
        """Mark the run `status` (FAILED, or KILLED: stopped by the user) if the store answers and nothing has ended
        it already; says which happened. (A sweep's driver ends a trial's run KILLED when its scheduler stops the
        trial, before the trial's own process stops with an exception: that status stays.)"""
        try:
            with tracking_errors("reading the run's status"):
                current = mlflow_client(self.uri).get_run(self.run_id).info.status
            if current != "RUNNING":
                return f"MLflow run {self.run_id} had already ended {current}"
            self.end(status)
        except TrackingError as err:
            log.warning("%s", err)
            return f"MLflow run {self.run_id} could not be marked {status} (the store did not answer)"
        return f"MLflow run {self.run_id} marked {status}"


@dataclass(frozen=True)
class RunTarget:
    """Where a job's MLflow run is recorded, resolved from its config before anything runs: the store, the
    experiment, the directory that keeps the run's id (a path or a URI), the run's name, and the name its model is
    registered under (None: not registered)."""

    uri: str
    experiment: str
    run_dir: Path | str
    name: str
    register_as: str | None = None
    system_metrics: bool = False  # tracking.system_metrics


@contextlib.contextmanager
def job_run(
    target: RunTarget, job: str, *, params: dict[str, Any], config_yaml: str, tags: dict[str, str] | None = None
) -> Iterator[JobRun]:
    """The tracked MLflow run of a job, around everything the job does once its input is validated.

    Opens the run of `target.run_dir` (resumes it on a relaunch), tagged `albert_dist.job=<job>` plus `tags`;
    logs the flat `params` (redacted) and the job's config as the artifact `config/<job>.yaml`. The run ends
    FINISHED when the block ends, KILLED when the user stops it (Ctrl-C), FAILED on any other exception (exit
    included).

    An MLflow failure after the job published its model (`JobRun.published`) is one `TrackingError` saying
    where the model is; another error then carries that as a note."""
    with tracking_errors(f"opening the run in {redact_url(target.uri)}"):
        run_id = start_or_resume_run(
            target.uri, target.experiment, target.run_dir, target.name, tags={JOB_TAG: job, **(tags or {})}
        )
    run = JobRun(target.uri, run_id, target.register_as)
    monitor = system_metrics_monitor(target.uri, run_id) if target.system_metrics else contextlib.nullcontext()
    try:
        run.log_params(params)
        run.log_text(config_yaml, f"config/{job.replace('-', '_')}.yaml")
        with monitor:
            yield run
        run.end("FINISHED")
    except BaseException as err:
        # Ctrl-C (SIGINT) is the user stopping the job: MLflow's KILLED; anything else FAILED
        marked = run.mark_ended("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        if run.model_location is None or not isinstance(err, Exception):
            raise
        if isinstance(err, TrackingError):
            raise TrackingError(
                f"the model is saved at {run.model_location}, but tracking failed: {err}; {marked}"
            ) from err
        err.add_note(f"the model is saved at {run.model_location}; {marked}")
        raise


@contextlib.contextmanager
def system_metrics_monitor(tracking_uri: str, run_id: str) -> Iterator[None]:
    """MLflow's system metrics (system/cpu_utilization_percentage, system/system_memory_usage_megabytes, disk,
    network, and the GPUs' where NVML or ROCm answers) of this node, logged into the run every
    $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL seconds (default 10) while the block runs; a relaunch goes on from the
    run's last step. The run is opened with MLflow's client, not `mlflow.start_run(log_system_metrics=True)`, hence
    MLflow's monitor by hand; it stops (logging nothing more) once the run is no longer RUNNING."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    quiet_mlflow()
    monitor = SystemMetricsMonitor(run_id, resume_logging=True, tracking_uri=tracking_uri)
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()


def log_artifacts(tracking_uri: str, run_id: str, local_dir: str | Path, artifact_path: str | None = None) -> None:
    mlflow_client(tracking_uri).log_artifacts(run_id, str(local_dir), artifact_path)


def log_text(tracking_uri: str, run_id: str, text: str, artifact_file: str) -> None:
    mlflow_client(tracking_uri).log_text(run_id, redact_url(text), artifact_file)


def where_to_find(tracking_uri: str, run_id: str) -> str:
    """The two lines a job ends on: its run in the (redacted) store, and how to open the MLflow UI on it."""
    return f"MLflow run {run_id} at {redact_url(tracking_uri)}\nMLflow UI: {ui_hint(tracking_uri)}"


def ui_hint(tracking_uri: str) -> str:
    if tracking_uri.startswith("sqlite:"):
        return f"mlflow ui --backend-store-uri {tracking_uri} --host 127.0.0.1 --port 5000"
    return f"open {redact_url(tracking_uri)} (through an SSH tunnel or port-forward when it is remote)"


def log_datasets(tracking_uri: str, run_id: str, datasets: list[tuple[str, str, str | Path, str, dict]]) -> None:
    """Record the run's inputs as MLflow datasets (the runs list's Dataset column): one
    (context, name, source path or URI, digest, profile) each; MLflow keeps a dataset once per run."""
    import json
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = []
    for context, name, source, digest, profile in datasets:
        with warnings.catch_warnings():  # a local path fits two source kinds, both local: MLflow warns
            warnings.simplefilter("ignore", UserWarning)
            resolved = resolve_dataset_source(str(source))
        dataset = Dataset(
            name=name,
            digest=digest[:DIGEST_CHARS],
            source_type=resolved._get_source_type(),
            source=resolved.to_json(),
            profile=json.dumps(profile),
        )
        inputs.append(DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, context)]))
    client = mlflow_client(tracking_uri)
    for attempt in range(DATASET_LOG_ATTEMPTS):
        try:
            client.log_inputs(run_id, inputs)
            return
        except Exception as err:
            # MLflow's store looks a dataset up, then inserts it: two runs of one experiment (a sweep's trials)
            # logging the same dataset at once collide on its unique key. The loser's transaction rolls back;
            # on the next try the lookup finds the winner's row. Any other failure is not retried.
            if attempt == DATASET_LOG_ATTEMPTS - 1 or not _KEY_COLLISION.search(str(err)):
                raise
            time.sleep(0.2 * (attempt + 1))


def path_digest(path: str | Path) -> str:
    """sha256 of a file, or of a directory's files (their relative paths and contents)."""
    import hashlib

    from albert_dist.storage import sha256_file

    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}\0{sha256_file(file)}\n".encode())
    return digest.hexdigest()


def prepared_data_input(data_dir: str | Path, manifest: dict[str, Any]) -> tuple[str, str, str | Path, str, dict]:
    """The prepared pretraining data as the run's training dataset (for `log_datasets`): its digest is the
    manifest's (which lists the shards, their row counts, the tokenizer's hash and the preparation config)."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    profile = {f"{split}_rows": info["rows"] for split, info in manifest["splits"].items()}
    return "training", Path(str(data_dir)).name, data_dir, digest, profile
