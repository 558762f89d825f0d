"""Deterministic per-rank batches from a Ray dataset, for exact resume.

Every rank reads the same stream of global batches (`batch_size × slots` rows, in a fixed, seeded order) and keeps
its own part. A global batch is cut into `slots` micro-batches of `batch_size` rows; each rank trains the slots
`slot_range` gives it (one each when the run has as many workers as slots). So the ranks' shares are disjoint, a
resumed run that skips the first N global batches of an epoch sees exactly the rows it had not trained on, and an
elastic run (`slots` = its most workers) trains the same micro-batches whatever its worker count. Ray Train's
`streaming_split` is faster to start on big clusters but hands rows to ranks in an order that varies between runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


def rank_slice(rows: int, rank: int, world_size: int) -> slice:
    """This rank's consecutive part of a global batch of `rows` rows: a full batch splits into equal per-rank
    batches, a partial last one as evenly as it goes (a rank may get none). Every task slices its batches with it."""
    share = -(-rows // world_size)
    return slice(min(rank * share, rows), min((rank + 1) * share, rows))


def slot_range(rank: int, world_size: int, slots: int) -> range:
    """The consecutive slots of each global batch that `rank` of `world_size` trains: `slots // world_size` or
    one more (a worker count that does not divide the slots leaves some workers a micro-batch more per step)."""
    if not 1 <= world_size <= slots:
        raise ValueError(f"{world_size} workers for {slots} slots: a run has at least one and at most `slots` workers")
    return range(rank * slots // world_size, (rank + 1) * slots // world_size)


def rank_batches(
    source: Any,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int | None = None,
    shuffle_buffer: int = 0,
    drop_last: bool = True,
    limit: int | None = None,
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """This rank's slices of the global batches of `source` (a Ray `Dataset` or `DataIterator`), each with the
    position of its first row in the stream of rows (the first global batch's first row is 0).

    `seed` seeds the local shuffle (use seed + epoch for a new order each epoch); `limit` caps the number of
    global batches (evaluation).
    """
    for index, batch in enumerate(_global_batches(source, batch_size * world_size, seed, shuffle_buffer, drop_last)):
        if limit is not None and index >= limit:
            return
        part = rank_slice(len(next(iter(batch.values()))), rank, world_size)
        if part.start < part.stop:
            yield index * batch_size * world_size + part.start, {k: v[part] for k, v in batch.items()}


def slot_batches(
    source: Any, *, batch_size: int, slots: range, slot_count: int, seed: int, shuffle_buffer: int
) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
    """(global batch index, slot, rows) of each of this rank's `slots` in every full global batch of
    `batch_size × slot_count` rows of `source`: training's micro-batches, the same whatever the worker count."""
    for index, batch in enumerate(_global_batches(source, batch_size * slot_count, seed, shuffle_buffer, True)):
        for slot in slots:
            part = slice(slot * batch_size, (slot + 1) * batch_size)
            yield index, slot, {k: v[part] for k, v in batch.items()}


def _global_batches(source: Any, size: int, seed: int | None, shuffle_buffer: int, drop_last: bool):
    shuffle = {"local_shuffle_buffer_size": shuffle_buffer, "local_shuffle_seed": seed} if shuffle_buffer else {}
    return source.iter_batches(batch_size=size, batch_format="numpy", drop_last=drop_last, **shuffle)
