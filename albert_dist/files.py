"""Small file helpers shared by the data pipeline and checkpointing."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO


def sha256_file(path: str | Path) -> str:
    """The file's sha256, read in 1 MiB blocks (checkpoints and tokenizers are too big to read at once)."""
    with open(path, "rb") as f:
        return sha256_stream(f)


def sha256_stream(stream: BinaryIO) -> str:
    """The sha256 of what is left to read in `stream` (a local file or a pyarrow stream of a remote one)."""
    digest = hashlib.sha256()
    for block in iter(lambda: stream.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()
