"""Training checkpoints: the model in the transformers layout plus the training state, with checksums.

Layout of a checkpoint directory:
    model/               config.json, model.safetensors, tokenizer files (loads in transformers)
    training_state.pt    optimizer, scheduler, scaler, step, data position, RNG states (tensors only)
    manifest.json        step and the sha256 of every file above, written last

A checkpoint is only valid once its manifest exists and every checksum matches; `load_training_state` refuses
anything else, so a half-written or corrupted checkpoint is never resumed from.
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
STATE_FILE = "training_state.pt"
MODEL_DIR = "model"


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
