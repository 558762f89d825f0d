"""Training checkpoints: the model in the transformers layout plus the training state, with checksums.

Layout of a checkpoint directory:
    model/               config.json, model.safetensors, tokenizer files (loads in transformers)
    training_state.pt    optimizer, scheduler, scaler, step, data position, RNG states (tensors only)
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
from pathlib import Path
from typing import Any

import torch

from albert_dist.errors import CheckpointError
from albert_dist.files import publish_bytes, sha256_file

MANIFEST = "manifest.json"
#: job settings a relaunch may change and still resume: where outputs and tracking go, how often the run logs,
#: evaluates, checkpoints and retries, where its workers are placed, and how batches are laid out (data.packing: the
#: same instances and masks, the same losses). Every other setting decides what is trained.
RELAUNCH_MAY_CHANGE = (
    "run.name", "run.output_dir", "run.resume_changes", "tracking.", "data.output", "data.cache", "data.packing",
    "scaling.use_gpu", "scaling.cpus_per_worker", "scaling.gpus_per_worker", "scaling.placement_strategy",
    "train.log_every", "train.eval_every", "train.eval_batches", "train.checkpoint_every", "train.keep_checkpoints",
    "train.max_failures", "train.resource_wait_attempts", "train.peak_tflops", "train.plateau_warning_after",
    "train.lr_range_",
)
STATE_FILE = "training_state.pt"
MODEL_DIR = "model"


def fingerprint(settings: dict[str, Any], data_digest: str | None = None) -> dict[str, Any]:
    """What a checkpoint must have been trained with to be resumed: the flattened job `settings` that decide what
    is trained (all but `RELAUNCH_MAY_CHANGE`) and the digest of the training data, when the job has one."""
    kept = {k: v for k, v in sorted(settings.items()) if not k.startswith(RELAUNCH_MAY_CHANGE)}
    return {"settings": json.loads(json.dumps(kept, default=str)), "data": data_digest}


def fingerprint_changes(recorded: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """What differs between a checkpoint's fingerprint and the relaunch's, one readable line each ("train.
    learning_rate 0.001 → 0.002"); none for a checkpoint written before fingerprints were recorded."""
    if not recorded:
        return []
    old, new = recorded.get("settings", {}), current["settings"]
    changes = [f"{key} {old.get(key, '(unset)')} → {new.get(key, '(unset)')}"
               for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    if recorded.get("data") != current["data"]:
        changes.append(f"the prepared data (digest {str(recorded.get('data'))[:12]} → {str(current['data'])[:12]})")
    return changes


def write_manifest(directory: Path, info: dict[str, Any]) -> None:
    """Checksum every file under `directory` and write the manifest last, atomically."""
    files = {str(p.relative_to(directory)): sha256_file(p)
             for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST}
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
