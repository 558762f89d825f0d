"""Small file helpers shared by the data pipeline and checkpointing."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    """The file's sha256, read in 1 MiB blocks (checkpoints and tokenizers are too big to read at once)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
