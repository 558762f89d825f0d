"""Runs the training loop on Ray Train: one `TorchTrainer`, DDP across workers, checkpoints in `storage_path/name`
(a local or shared path, or a URI: `s3://bucket/prefix`, read and written through pyarrow's filesystems).

Relaunching with the same `name` and `storage_path` resumes from the latest valid checkpoint (Ray Train V2 keeps
the run's checkpoint history there); `FailureConfig(max_failures)` restarts failed workers the same way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError
from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.v2.api.exceptions import ControllerError, WorkerGroupError

from albert_dist.cluster.ray_init import PREEMPTION_WATCHER
from albert_dist.config import ScalingSection, TrainSection
from albert_dist.errors import AlbertDistError, ConfigError, disk_full_error, is_disk_full
from albert_dist.storage import filesystem, is_uri, join_location, object_store_error
from albert_dist.train import checkpointing
from albert_dist.train.collectives import broadcast_object
from albert_dist.train.loop import Trainer, WorkerEnv
from albert_dist.train.plan import Plan


class TrainingStalled(AlbertDistError):
    """The cluster never gave the workers their resources back (a lost node that did not return)."""


class TrainingDiverged(AlbertDistError):
    """The loss stayed non-finite; training stopped with the last good checkpoint kept."""


class WorkersLost(AlbertDistError):
    """A training worker's process or node died (killed, out of memory, preempted) with no restart left."""


@dataclass
class TrainingResult:
    metrics: dict[str, Any]
    checkpoint_dir: Path | None  # a local copy of it when the storage is a URI
    run_path: Path | str


def scaling_config(scaling: ScalingSection) -> ScalingConfig:
    """Ray Train's scaling; a [min, max] range is its elastic worker group, which restarts the workers from the
    latest checkpoint when it resizes (`PretrainScalingSection.resize_check_s` apart at most)."""
    resources = {"CPU": scaling.cpus_per_worker}
    if scaling.use_gpu:
        resources["GPU"] = scaling.gpus_per_worker
    fewest, most = scaling.worker_range
    elastic = {"elastic_resize_monitor_interval_s": scaling.resize_check_s} if fewest < most else {}
    return ScalingConfig(
        num_workers=(fewest, most) if fewest < most else most,
        use_gpu=scaling.use_gpu,
        resources_per_worker=resources,
        placement_strategy=scaling.placement_strategy,
        **elastic,
    )


def torch_threads(scaling: ScalingSection) -> int:
    """Intra-op threads of a training worker: the CPUs Ray reserved for it, at least one. torch would take every
    core of the machine in each worker (Ray's OMP_NUM_THREADS=1 comes after torch's import in the worker): two
    workers of half a CPU on 2 cores then ran 3.2x slower than with one thread each (benchmarks/bench_threads.py)."""
    return max(1, int(scaling.cpus_per_worker))


class InterruptibleTrainer(ray.train.torch.TorchTrainer):
    """Ctrl-C (SIGINT) stops the run as the user's. Ray Train's own handler aborts the run's controller and then
    exits the process (SystemExit, its status 0 or 1): the job would mark its MLflow run FAILED and print nothing.
    This one asks the controller to abort and raises KeyboardInterrupt in the driver, so the job marks its run KILLED
    and the command ends 130 saying so; checkpoints stored so far stay, for a relaunch to resume from."""

    def _register_sigint_handler(self, controller) -> None:
        def interrupted(signum, frame):
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C interrupts whatever runs then
            controller.abort.remote()
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, interrupted)


@contextlib.contextmanager
def _sigint_restored():
    """The driver's SIGINT handler as it was before the block (the trainer's handler outlives its run otherwise);
    only the main thread sets handlers, and only there does the trainer install one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_training(
    plan: Plan, *, tracking: tuple[str, str] | None = None, callbacks: list | None = None
) -> TrainingResult:
    """Fit the task of `plan` with the shared loop on its Ray Train workers; `tracking` is the MLflow run (store,
    run id) rank 0 logs metrics into, `callbacks` Ray Train callbacks (a sweep's trial passes Tune's).

    Each worker builds its `TrainingTask` from `plan.task` (`TaskSpec.build`). Datasets are passed whole to every
    worker: the tasks shard them themselves, deterministically, so a resumed run sees exactly the batches it had
    not trained on yet.

    `plan.fingerprint` (`checkpointing.fingerprint`) is recorded in every checkpoint; a relaunch whose fingerprint
    differs from its newest checkpoint's stops before training (`plan.resume_changes` "refuse") or resumes and
    records the changes as an MLflow tag ("allow").
    """
    from ray.data import DataContext

    name, storage_path, train, scaling = plan.name, plan.storage_path, plan.train, plan.scaling
    storage_dir = join_location(storage_path, name)
    _set_aside_unreadable_ray_record(storage_dir)
    if plan.fingerprint is not None:
        _check_relaunch(storage_dir, name, plan.fingerprint, plan.resume_changes, tracking)
    training_data_context()  # before the datasets are made: a dataset keeps the context it was made in
    datasets = plan.datasets()
    options = DataContext.get_current().execution_options
    # in object storage, Ray Train stores checkpoints through the same retrying filesystem as everything else
    storage_fs, storage_in_fs = filesystem(str(storage_path)) if is_uri(storage_path) else (None, str(storage_path))
    trainer = InterruptibleTrainer(
        _train_worker,
        train_loop_config={
            "task": plan.task,
            "train": train.model_dump(),
            "seed": plan.seed,
            "tracking": tracking,
            "storage_dir": str(storage_dir),
            "publish_to": str(plan.publish_to) if plan.publish_to else None,
            "torch_threads": torch_threads(scaling),
            "fingerprint": plan.fingerprint,
        },
        scaling_config=scaling_config(scaling),
        run_config=RunConfig(
            name=name,
            storage_path=storage_in_fs,
            storage_filesystem=storage_fs,
            checkpoint_config=CheckpointConfig(num_to_keep=train.keep_checkpoints),
            failure_config=FailureConfig(
                max_failures=train.max_failures, controller_failure_limit=train.resource_wait_attempts
            ),
            callbacks=callbacks or None,
        ),
        datasets=datasets or None,
        dataset_config=DataConfig(datasets_to_split=[], execution_options=options),
    )
    try:
        with _sigint_restored():
            result = trainer.fit()
    except WorkerGroupError as err:
        raise _user_error(err.worker_failures.values(), storage_dir) or err from None
    except ControllerError as err:
        raise _user_error([err.controller_failure], storage_dir) or TrainingStalled(
            f"training {name!r} could not get its workers' resources back ({train.resource_wait_attempts} attempts: "
            f"{err.controller_failure}); the last checkpoint is kept in {storage_dir}: relaunch the same "
            f"run.name to resume once the cluster has {scaling.worker_range[0]} worker slot(s) again"
        ) from None
    if tracking is not None:
        from albert_dist.tracking.metrics_log import STATE_FILE, send_left_behind

        send_left_behind(*tracking, join_location(storage_dir, STATE_FILE))
    # how rank 0's fit ended: Ray's `result.metrics` only holds what came with a checkpoint, and a diverged run
    # stops without one
    ended = result.return_value or {}
    if ended.get("status") == "diverged":
        raise TrainingDiverged(ended["message"])
    metrics = dict(result.metrics or {})
    # the newest checkpoint that passes its checksums (Ray's latest record, or a newer one it had not registered)
    checkpoint = resume_directory(result.checkpoint, storage_dir, _silent)
    return TrainingResult(metrics, checkpointing.local_copy(checkpoint) if checkpoint else None, storage_dir)


def _user_error(failures, storage_dir: Path | str) -> Exception | None:
    """The one-line error of a failed training, when the failures of its workers or controller show one: a
    worker's own `AlbertDistError` (a full disk while staging a checkpoint, bad data, the object store failing
    the run's own writes), a full disk or an object store failing while Ray Train stored a checkpoint into
    the run's storage, or a worker's process that died (no Python error of ours to show). None: Ray's error
    (a bug's traceback) says it best."""
    for failure in failures:
        cause = getattr(failure, "cause", failure)  # a RayTaskError carries the worker's exception as its cause
        # a worker found dead by Ray Train's health check carries Ray's error about the actor
        cause = getattr(cause, "health_check_failure", cause)
        if isinstance(cause, AlbertDistError):
            return cause
        kept = "the checkpoints stored before are kept: relaunch the same run.name to resume from them"
        if isinstance(cause, (RayActorError, NodeDiedError, WorkerCrashedError)):
            reason = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
            return WorkersLost(f"a training worker died ({reason}) with no restart left (train.max_failures); {kept}")
        if is_disk_full(cause):
            return disk_full_error(f"a checkpoint into the run's storage {storage_dir} ({kept})")
        stored = object_store_error(cause, storage_dir)
        if stored is not None:
            return type(stored)(f"{stored}; {kept}")
    return None


def _set_aside_unreadable_ray_record(storage_dir: Path | str) -> None:
    """Ray Train writes its record of a run's checkpoints (checkpoint_manager_snapshot.json) in place, so a disk
    that filled up or a crash while it was written can leave it empty, and Ray then refuses to start the run
    again. The checkpoints themselves carry their own checksums: set the record aside and resume from the newest
    checkpoint that verifies (`checkpointing.newest_verified` finds it without Ray's record). In object storage
    (a URI) an object is written whole or not at all: nothing to set aside."""
    if is_uri(storage_dir):
        return
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    record = storage_dir / CHECKPOINT_MANAGER_SNAPSHOT_FILENAME
    try:
        json.loads(record.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        aside = record.with_name(record.name + ".unreadable")
        record.replace(aside)
        print(
            f"warning: Ray Train's record of the run's checkpoints was unreadable (written while the disk was "
            f"full, or cut off by a crash); set aside as {aside}: resuming from the newest checkpoint that verifies"
        )


def training_data_context() -> None:
    """Ray Data settings for training: rows in a fixed order (exact resume reads the same batches again) and no
    progress bars (a bar per worker and evaluation would drown the progress lines). Call it before creating or
    materializing the datasets handed to `run_training`: a dataset keeps the context it was made in."""
    from ray.data import DataContext

    context = DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False


def _quiet_report_log() -> None:
    """Ray Train 2.60 logs every `ray.train.report` of every worker at INFO, metrics dict and all: a long line per
    evaluation and checkpoint between the progress lines. Its warnings stay."""
    context = sys.modules.get("ray.train.v2._internal.execution.context")  # the logger is named by its file
    if context is not None:
        logging.getLogger(context.__file__).setLevel(logging.WARNING)


class ChangedRelaunch(ConfigError):
    """A relaunch whose settings or data differ from what its checkpoints were trained with."""


def _check_relaunch(
    storage_dir: Path | str,
    name: str,
    fingerprint: dict[str, Any],
    resume_changes: str,
    tracking: tuple[str, str] | None,
) -> None:
    """Refuse (or, with `resume_changes` "allow", record in MLflow) a relaunch that would resume checkpoints
    trained with other settings or data."""
    latest = resume_directory(None, storage_dir, _silent) if is_uri(storage_dir) or storage_dir.is_dir() else None
    if latest is None:
        return
    # verified by resume_directory
    manifest = json.loads((checkpointing.local_copy(latest) / checkpointing.MANIFEST).read_text())
    changes = checkpointing.fingerprint_changes(manifest.get("fingerprint"), fingerprint)
    if not changes:
        return
    step = manifest["step"]
    if resume_changes != "allow":
        raise ChangedRelaunch(
            f"run {name!r} has checkpoints up to step {step} trained with other settings: "
            f"{'; '.join(changes)}. Resuming would continue their optimizer state under the new ones. Use another "
            f"run.name for a new run, or --set run.resume_changes=allow to resume anyway (the changes are recorded "
            f"in MLflow)."
        )
    print(f"resuming step {step} with changes (run.resume_changes=allow): {'; '.join(changes)}")
    if tracking is not None:
        from albert_dist.tracking import run as mlflow_tracking

        mlflow_tracking.set_tags(*tracking, {f"albert_dist.resume_changes.step_{step}": "; ".join(changes)})


def _train_worker(config: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(config["torch_threads"])
    _quiet_report_log()
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    task = config["task"].build(rank, world_size, ray.train.get_dataset_shard)
    logger = None
    if config["tracking"] and rank == 0:
        from albert_dist.tracking.metrics_log import STATE_FILE, MetricsLogger, quick_failing_requests

        quick_failing_requests()
        logger = MetricsLogger(
            *config["tracking"], skip_replayed=True, state_file=join_location(config["storage_dir"], STATE_FILE)
        )
    # rank 0 picks the checkpoint (verifying it) and every rank resumes from that one (downloaded to its machine
    # when the storage is a URI)
    storage_dir = join_location(config["storage_dir"])
    chosen = resume_directory(ray.train.get_checkpoint(), storage_dir) if rank == 0 else None
    chosen = broadcast_object(chosen, world_size)
    env = WorkerEnv(
        rank=rank,
        world_size=world_size,
        device=ray.train.torch.get_device(),
        wrap_model=ray.train.torch.prepare_model,
        report=_report,
        log_metrics=logger,
        publish_to=join_location(config["publish_to"]) if config["publish_to"] else None,
        resume_dir=checkpointing.local_copy(chosen) if chosen else None,
        fingerprint=config["fingerprint"],
        draining=_draining if os.environ.get(PREEMPTION_WATCHER, "1") != "0" else None,
    )
    train = TrainSection.model_validate(config["train"])
    result = Trainer(task, train, env, seed=config["seed"]).fit()
    if logger is not None:
        logger.flush()
    return {key: result[key] for key in ("status", "step", "message") if key in result}  # plain values only


def _draining() -> bool | float:
    info = ray.train.get_preemption_info()
    if info is None:
        return False
    return info.deadline_ms / 1000 if info.deadline_ms else True


#: "sync" makes `ray.train.report` wait until a checkpoint is stored (the step stalls for the upload); by default
#: the upload runs in the background
CHECKPOINT_UPLOAD = "ALBERT_DIST_CHECKPOINT_UPLOAD"


def _report(metrics: dict[str, Any], checkpoint_dir: Path | None) -> Future | None:
    """Report `metrics` with the checkpoint staged at `checkpoint_dir`, stored into the run's storage in the
    background (Ray Train's asynchronous upload, one at a time, in order; Ray registers a checkpoint only once it
    is stored); the future is done when it is durable."""
    from ray.train import CheckpointUploadMode

    # a report without a checkpoint goes the same way: Ray keeps reports in order, so a synchronous one would
    # wait for the upload before it
    mode = CheckpointUploadMode.SYNC if os.environ.get(CHECKPOINT_UPLOAD) == "sync" else CheckpointUploadMode.ASYNC
    if checkpoint_dir is None:
        ray.train.report(metrics, checkpoint_upload_mode=mode)
        return None
    storage = ray.train.get_context().get_storage()
    durable: Future = Future()
    ray.train.report(
        metrics,
        checkpoint=ray.train.Checkpoint.from_directory(str(checkpoint_dir)),
        checkpoint_upload_mode=mode,
        delete_local_checkpoint_after_upload=False,  # `_store` removes it
        checkpoint_upload_fn=lambda checkpoint, name: _store(storage, checkpoint, name, durable),
    )
    return durable


def _store(storage, checkpoint: ray.train.Checkpoint, name: str, durable: Future) -> ray.train.Checkpoint:
    """Store a staged checkpoint as Ray Train would, its manifest last: a checkpoint cut off while it was stored
    has no manifest, and a manifest in storage means every file it lists is there. The staged copy is removed
    once stored (kept if storing fails: Ray tries again from it)."""
    import pyarrow.fs as pafs

    staged = Path(checkpoint.path)
    manifest = staged.with_name(staged.name + "." + checkpointing.MANIFEST)
    if (staged / checkpointing.MANIFEST).exists():
        (staged / checkpointing.MANIFEST).replace(manifest)
    stored = storage.persist_current_checkpoint(checkpoint, name)
    pafs.copy_files(
        str(manifest),
        f"{stored.path}/{checkpointing.MANIFEST}",
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=storage.storage_filesystem,
    )
    shutil.rmtree(staged, ignore_errors=True)
    manifest.unlink(missing_ok=True)
    durable.set_result(None)
    return stored


def resume_directory(
    checkpoint: ray.train.Checkpoint | None, storage_dir: Path | str, say: Callable[[str], None] = print
) -> Path | str | None:
    """The newest checkpoint of the run that verifies, starting from the one Ray Train hands back (in a URI
    storage, its path is the bucket's: the checkpoint is found by name under `storage_dir`)."""
    if checkpoint is None:
        latest = None
    elif is_uri(storage_dir):
        latest = join_location(storage_dir, Path(checkpoint.path).name)
    else:
        latest = Path(checkpoint.path)
    return checkpointing.newest_verified(latest, storage_dir, say)


def _silent(_: str) -> None:
    pass
