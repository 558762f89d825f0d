"""Deterministic per-rank batches from a Ray dataset, for exact resume.

Every rank reads the same stream of global batches (`batch_size × world_size` rows, in a fixed, seeded order)
and keeps its own slice. So the ranks' shares are disjoint and equal, and a resumed run that skips the first
N global batches of an epoch sees exactly the rows it had not trained on. Ray Train's `streaming_split` is faster
to start on big clusters but hands rows to ranks in an order that varies between runs.
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
    shuffle = {"local_shuffle_buffer_size": shuffle_buffer, "local_shuffle_seed": seed} if shuffle_buffer else {}
    size = batch_size * world_size
    batches = source.iter_batches(batch_size=size, batch_format="numpy", drop_last=drop_last, **shuffle)
    for index, batch in enumerate(batches):
        if limit is not None and index >= limit:
            return
        part = rank_slice(len(next(iter(batch.values()))), rank, world_size)
        if part.start < part.stop:
            yield index * size + part.start, {k: v[part] for k, v in batch.items()}
