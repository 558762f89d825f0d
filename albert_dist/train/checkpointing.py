"""Training checkpoints: the model in the transformers layout plus the training state, with checksums.

Layout of a checkpoint directory:
    model/               config.json, model.safetensors, tokenizer files (loads in transformers)
    training_state.pt    optimizer, scheduler, scaler, step, data position, every rank's CPU and CUDA generator
                         states (tensors only)
    manifest.json        step and the sha256 of every file above, written last

A checkpoint is only valid once its manifest exists and every checksum matches; `load_training_state` refuses
anything else, so a half-written or corrupted checkpoint is never resumed from.

The manifest also records the run's fingerprint: the job settings that decide what is trained and the digest of the
data. A relaunch whose fingerprint differs from its checkpoint's would continue the old optimizer state under new
settings; `fingerprint_changes` names what changed so the relaunch can refuse (or record) it.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from albert_dist.errors import CheckpointError, disk_full_errors
from albert_dist.model.checkpoint import CONFIG_NAME
from albert_dist.storage import download_dir, is_uri, join_location, publish_bytes, publish_dir, read_bytes, sha256_file
from albert_dist.train.collectives import gather_objects

MANIFEST = "manifest.json"
#: job settings a relaunch may change and still resume: where outputs and tracking go, how often the run logs,
#: evaluates, checkpoints and retries, where its workers are placed, and how batches are laid out (data.packing: the
#: same instances and masks, the same losses), and whether kernels are deterministic (the same sums, reproducible).
#: Every other setting decides what is trained.
RELAUNCH_MAY_CHANGE = (
    "run.name",
    "run.output_dir",
    "run.resume_changes",
    "tracking.",
    "data.output",
    "data.cache",
    "data.packing",
    "scaling.use_gpu",
    "scaling.cpus_per_worker",
    "scaling.gpus_per_worker",
    "scaling.placement_strategy",
    "scaling.resize_check_s",
    "train.log_every",
    "train.eval_every",
    "train.eval_batches",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.max_failures",
    "train.resource_wait_attempts",
    "train.drain_check_every",
    "train.publish",
    "train.peak_tflops",
    "train.plateau_warning_after",
    "train.deterministic",
)
STATE_FILE = "training_state.pt"
MODEL_DIR = "model"
#: in a run's home: the model the job publishes (`train.publish` picks it) and, when that is the last one, the best
#: evaluation's model beside it
PUBLISHED_MODEL = "model"
BEST_MODEL = "best_model"


def fingerprint(
    settings: dict[str, Any], data_digest: str | None = None, defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What a checkpoint must have been trained with to be resumed: the flattened job `settings` that decide what
    is trained (all but `RELAUNCH_MAY_CHANGE`) and the digest of the training data, when the job has one; with
    the job's `defaults` (flattened), against which a key that a checkpoint's fingerprint lacks is compared."""

    def kept(values: dict[str, Any]) -> dict[str, Any]:
        chosen = {k: v for k, v in sorted(values.items()) if not k.startswith(RELAUNCH_MAY_CHANGE)}
        return json.loads(json.dumps(chosen, default=str))

    return {"settings": kept(settings), "data": data_digest, "defaults": kept(defaults or {})}


def fingerprint_changes(recorded: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """What differs between a checkpoint's fingerprint and the relaunch's, one readable line each ("train.
    learning_rate 0.001 → 0.002"); none for a checkpoint written before fingerprints were recorded. A key the
    checkpoint's fingerprint lacks (a setting added since it was written) had its default's effect: it changed
    only if the relaunch sets another value."""
    if not recorded:
        return []
    old = {**current.get("defaults", {}), **recorded.get("settings", {})}
    new = current["settings"]
    changes = [
        f"{key} {old.get(key, '(unset)')} → {new.get(key, '(unset)')}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]
    if recorded.get("data") != current["data"]:
        changes.append(f"the prepared data (digest {str(recorded.get('data'))[:12]} → {str(current['data'])[:12]})")
    return changes


def write_manifest(directory: Path, info: dict[str, Any]) -> None:
    """Checksum every file under `directory` and write the manifest last, atomically."""
    files = {
        str(p.relative_to(directory)): sha256_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    publish_bytes(directory / MANIFEST, json.dumps({**info, "files": files}, indent=2).encode())


def verify_manifest(directory: Path) -> dict[str, Any]:
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {directory} has no {MANIFEST} (incomplete write?)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {directory}: unreadable {MANIFEST}: {err}") from None
    for name, expected in manifest.get("files", {}).items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {directory}: {name} is missing")
        if sha256_file(path) != expected:
            raise CheckpointError(f"checkpoint {directory}: {name} does not match its checksum (corrupted)")
    return manifest


def save_training_state(directory: Path, state: dict[str, Any], info: dict[str, Any]) -> None:
    """Write `training_state.pt` and then the manifest over everything already in `directory`.

    The state is serialised in memory first: torch.save reports a full disk as an opaque RuntimeError, a plain
    write as ENOSPC, which callers turn into a clear message.
    """
    directory.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    publish_bytes(directory / STATE_FILE, buffer.getbuffer())
    write_manifest(directory, info)


def load_training_state(directory: Path) -> dict[str, Any]:
    """Verify the checkpoint and load its state with `weights_only=True`: tensors and plain values, no pickled code."""
    verify_manifest(directory)
    return torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)


def newest_verified(
    latest: Path | str | None, storage_dir: Path | str, say: Callable[[str], None] = print
) -> Path | str | None:
    """The newest checkpoint of the run under `storage_dir` (a local path or a URI) that passes its checksums,
    starting from `latest` (the one Ray Train recorded last); `local_copy` gives its files.

    A checkpoint that fails verification (truncated, corrupted) is skipped with a message naming it, and the
    previous one of the same run is used instead. A complete checkpoint that Ray had not registered yet when the
    driver died (its manifest is written before Ray records it) is used too. With none that verifies, a run Ray
    recorded a checkpoint of fails (its stored state is damaged); one it recorded none of starts again.
    """
    siblings = [p for p in _checkpoint_dirs(storage_dir) if p != latest]
    # newest first; at equal steps Ray's record first (a stable sort keeps it ahead)
    candidates = sorted(([latest] if latest else []) + siblings, key=_checkpoint_step, reverse=True)
    for candidate in candidates:
        try:
            verify_manifest(local_copy(candidate))
        except CheckpointError as err:
            say(f"warning: {err}; trying the previous checkpoint")
            continue
        if latest is not None and _checkpoint_step(candidate) < _checkpoint_step(latest):
            say(f"resuming from the previous good checkpoint {candidate}")
        return candidate
    if not candidates:
        return None
    if latest is None:  # nothing registered: a crash cut off the first checkpoint, there is nothing to lose
        say("warning: no checkpoint of this run was complete; training starts from the beginning")
        return None
    raise CheckpointError(f"no valid checkpoint under {storage_dir}: every one failed its checksums")


def _checkpoint_dirs(storage_dir: Path | str) -> list[Path | str]:
    if not is_uri(storage_dir):
        return [p for p in Path(storage_dir).glob("checkpoint_*") if p.is_dir()]
    import pyarrow.fs as pafs

    from albert_dist.storage import filesystem

    fs, path = filesystem(str(storage_dir))
    return [
        join_location(storage_dir, info.base_name)
        for info in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        if info.type == pafs.FileType.Directory and info.base_name.startswith("checkpoint_")
    ]


def local_copy(checkpoint: Path | str) -> Path:
    """The checkpoint's files on this machine: a local checkpoint as it is; one at a URI downloaded into its
    staging directory (`storage.staging_dir`; kept while its manifest is the same, verify it with
    `verify_manifest`), the run's other downloaded checkpoints removed from there."""
    if not is_uri(checkpoint):
        return Path(checkpoint)
    local = download_dir(str(checkpoint), complete=MANIFEST)
    for other in local.parent.glob("checkpoint_*"):
        if other.is_dir() and other != local:
            shutil.rmtree(other, ignore_errors=True)
    return local


def _checkpoint_step(path: Path | str) -> int:
    try:
        return int(json.loads(read_bytes(join_location(path, MANIFEST)))["step"])
    except (OSError, ValueError, KeyError):
        return -1


class CheckpointManager:
    """The checkpoint policy of one training run in one place (as torchtitan's checkpointer): when a checkpoint
    is due, what it holds (the model through the task, the trainer's state, the task's own state, every rank's
    RNG, the best metric so far), how it is written (staged in a temporary directory, checksummed, handed to
    `env.report`), which model the run publishes, and restoring all of it.

    Publishing (`publish`, the job's `train.publish`) puts one model in `<env.publish_to>/model`: the best
    evaluation's ("best") or the last step's ("last", with the best evaluation's kept in `best_model/` beside it).
    A published model is what `task.save_model` writes, without the task's training-only tensors.

    A checkpoint is staged on local disk and handed to `env.report`, which may store it in the background (Ray
    Train's asynchronous upload) and hand back a `Future` that is done once the checkpoint is durable in the run's
    storage; the staged copy is then the upload's to remove. The final model is published only once every
    checkpoint before it and its own are durable. A drain notice (`notice`) makes the next checkpoint the drain's,
    which training waits for (what it would train meanwhile is lost when the node goes, and on a busy node the
    upload competes with it): when it is durable the time since the notice is printed and logged as
    `drain_checkpoint_durable_s`; one still uploading at the notice's deadline is said not to be durable.

    Every rank calls `report` and `keep_best` alike; only rank 0 writes.
    """

    def __init__(self, task, env, every: int, publish: str = "best"):
        self.task, self.env, self.every, self.publish = task, env, every, publish
        self.best: float | None = None
        self._notice: tuple[float, float | None] | None = None
        self._drain: DrainUpload | None = None

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def keep_best(self, metrics: dict[str, float], model: torch.nn.Module) -> None:
        """Publish `model` as the best model when the task's best metric improved."""
        value = metrics.get(self.task.best_metric)
        if value is None or not math.isfinite(value):
            return
        if self.best is not None and (value <= self.best if self.task.best_mode == "max" else value >= self.best):
            return
        self.best = value
        self._publish(model, PUBLISHED_MODEL if self.publish == "best" else BEST_MODEL)

    def _publish(self, model: torch.nn.Module, name: str) -> None:
        if self.env.is_main and self.env.publish_to is not None:
            publish_dir(
                join_location(self.env.publish_to, name), lambda d: self.task.save_model(model, d), marker=CONFIG_NAME
            )

    def notice(self, deadline: float | None) -> None:
        """A node of the run was told to drain (by `deadline`, a UNIX time, when known): the next checkpoint is the
        drain's."""
        if self.env.is_main:
            self._notice = (time.perf_counter(), deadline)

    def settle(self) -> None:
        """Log `drain_checkpoint_durable_s` once the drain's checkpoint is durable (from the training thread: the
        metrics logger is not shared with the upload's)."""
        drain = self._drain
        if drain is None or drain.durable_s is None:
            return
        self._drain = None
        if self.env.log_metrics:
            self.env.log_metrics({"drain_checkpoint_durable_s": drain.durable_s}, drain.step)

    def report(
        self, metrics: dict[str, Any], model: torch.nn.Module, trainer_state: dict[str, Any] | None, final: bool = False
    ) -> None:
        """Report `metrics`, with a checkpoint of `model` and `trainer_state` when that is given; at the `final`
        step of the run, publish the last model when that is the policy, once its checkpoint is durable."""
        self._report(metrics, model, trainer_state, final)
        if final:
            self.settle()
            if self.publish == "last":
                self._publish(model, PUBLISHED_MODEL)

    def _report(
        self, metrics: dict[str, Any], model: torch.nn.Module, trainer_state: dict[str, Any] | None, final: bool
    ) -> None:
        if trainer_state is None:
            self.env.report(metrics, None)
            return
        rng_states = gather_objects(rng_state(self.env.device), self.env.world_size)
        if not self.env.is_main:
            self.env.report(metrics, None)
            return
        step = trainer_state["step"]
        state = {
            **trainer_state,
            "best": self.best if self.best is not None else float("nan"),
            "task": self.task.state(),
            "rng_states": rng_states,
        }
        directory = Path(tempfile.mkdtemp(prefix="albert-ckpt-"))
        try:
            with disk_full_errors(f"the checkpoint of step {step} ({directory}, then the run's storage)"):
                self.task.save_model(model, directory / MODEL_DIR)
                self.task.save_training_only(model, directory / MODEL_DIR)
                save_training_state(
                    directory,
                    state,
                    {"step": step, "epoch": trainer_state["epoch"], "fingerprint": self.env.fingerprint},
                )
                upload = self.env.report(metrics, directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        if upload is None:  # stored before `report` returned
            shutil.rmtree(directory, ignore_errors=True)
            upload = Future()
            upload.set_result(None)
        drain = self._notice is not None
        if drain:
            self._drain = DrainUpload(step, *self._notice, upload, self.env.print_fn)
            self._notice = None
        # the steps after a drain's checkpoint are lost with the node: the upload gets the CPUs to itself
        if final or drain:
            upload.result()

    def restore(self, model: torch.nn.Module, directory: Path) -> dict[str, Any]:
        """Load the checkpoint at `directory` into `model`, the task and this rank's RNG; returns the trainer's
        part of the state."""
        state = load_training_state(directory)
        self.task.load_weights(model, directory / MODEL_DIR)
        self.best = None if math.isnan(state["best"]) else state["best"]
        self.task.restore(state.get("task", {}))
        rng_states = state["rng_states"]
        if self.env.rank < len(rng_states):
            set_rng_state(rng_states[self.env.rank], self.env.device)
        return state


class DrainUpload:
    """The drain's checkpoint on its way to the run's storage: says when it became durable, counted from the
    notice, and whether that was before the notice's deadline; says so at the deadline if it is still uploading
    (a node gone at its deadline takes the local copy with it: that checkpoint does not count)."""

    def __init__(self, step: int, notice_at: float, deadline: float | None, upload: Future, say: Callable[[str], None]):
        self.step, self.notice_at, self.deadline, self.say = step, notice_at, deadline, say
        self.durable_s: float | None = None
        self._late = None
        if deadline is not None:
            self._late = threading.Timer(max(0.0, deadline - time.time()), self._at_deadline)
            self._late.daemon = True
            self._late.start()
        upload.add_done_callback(self._durable)

    def _durable(self, upload: Future) -> None:
        if upload.exception() is not None:
            return
        durable_s = time.perf_counter() - self.notice_at
        if self._late is not None:
            self._late.cancel()
        left = self.deadline - time.time() if self.deadline is not None else None
        left = "" if left is None else f", {abs(left):.1f} s {'before' if left >= 0 else 'after'} the deadline"
        self.say(f"step {self.step} | drain checkpoint durable {durable_s:.1f} s after the notice{left}")
        self.durable_s = durable_s

    def _at_deadline(self) -> None:
        if self.durable_s is None:
            self.say(
                f"step {self.step} | warning: the drain checkpoint is not durable at the deadline (still uploading): "
                f"a resume takes the checkpoint stored before it"
            )


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """Every generator a rank draws from (dropout, initialisation): the CPU's and, on a GPU, that of the rank's
    device. The data pipeline draws from seeded generators of its own, replayed on resume; nothing draws from
    Python's `random` or numpy's global generator."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor] | torch.Tensor, device: torch.device) -> None:
    """Restore what `rng_state` saved (a bare tensor: a checkpoint that holds the CPU generator only)."""
    if isinstance(state, torch.Tensor):
        state = {"cpu": state}
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
