"""Objects exchanged between the ranks of a training run (single-process runs pass them through)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def broadcast_object(obj: Any, world_size: int) -> Any:
    """Rank 0's `obj` on every rank."""
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        holder = [obj]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]
    return obj


def gather_objects(obj: Any, world_size: int) -> list[Any]:
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, obj)
        return gathered
    return [obj]
