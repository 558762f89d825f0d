"""Model and tokenizer locations that name a Hugging Face Hub model (`org/name`, `org/name@revision`): resolved to a
snapshot in huggingface_hub's cache, downloaded once, and read there again by every later load, offline included
(`HF_HUB_OFFLINE=1`). A local path that exists is always taken as the path."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from albert_dist.errors import CheckpointError

logger = logging.getLogger(__name__)

# org/name with the Hub's characters, an optional @revision (branch, tag or commit); a local path of the same
# form that exists wins, so a relative directory is never mistaken for a hub model
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")

# what a model directory is read for: config, weights, tokenizer; other frameworks' weights stay on the Hub
MODEL_FILES = [
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "model-*.safetensors",
    "pytorch_model.bin",
    "vocab.txt",
    "spiece.model",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "model.onnx",  # an export's graph and record (albert-dist predict --backend onnx)
    "export.json",
]


def hub_id(location: str | os.PathLike) -> tuple[str, str | None] | None:
    """(repo id, revision) when `location` names a hub model rather than an existing local path, else None."""
    text = str(location)
    if Path(text).expanduser().exists():
        return None
    match = _HUB_ID.match(text)
    return (match["repo"], match["revision"]) if match else None


def local_dir(location: str | os.PathLike) -> Path:
    """`location` as a local directory: a hub id's snapshot (downloaded into huggingface_hub's cache unless there),
    any other location as the path it is."""
    found = hub_id(location)
    if found is None:
        return Path(location)
    repo, revision = found
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo, revision=revision, allow_patterns=MODEL_FILES))
    except (HfHubHTTPError, LocalEntryNotFoundError, HFValidationError, OSError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"{location} is neither a local directory nor a model the Hugging Face Hub gave "
            f"({'offline: not in the cache' if _offline() else 'download failed'}: {reason})"
        ) from None
    logger.info("%s: the Hugging Face Hub snapshot %s", location, path)
    return path


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)
