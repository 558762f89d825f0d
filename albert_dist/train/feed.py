"""Deterministic per-rank batches from a Ray dataset, for exact resume.

Every rank reads the same stream of global batches (`batch_size × world_size` rows, in a fixed, seeded order)
and keeps its own slice. So the ranks' shares are disjoint and equal, and a resumed run that skips the first
N global batches of an epoch sees exactly the rows it had not trained on. Ray Train's `streaming_split` is faster
to start on big clusters but hands rows to ranks in an order that varies between runs.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np


def rank_batches(source: Any, *, batch_size: int, rank: int, world_size: int, seed: int | None = None,
                 shuffle_buffer: int = 0, drop_last: bool = True, limit: int | None = None
                 ) -> Iterator[dict[str, np.ndarray]]:
    """This rank's slices of the global batches of `source` (a Ray `Dataset` or `DataIterator`).

    `seed` seeds the local shuffle (use seed + epoch for a new order each epoch); `limit` caps the number of
    global batches (evaluation).
    """
    shuffle = {"local_shuffle_buffer_size": shuffle_buffer, "local_shuffle_seed": seed} if shuffle_buffer else {}
    lo, hi = rank * batch_size, (rank + 1) * batch_size
    batches = source.iter_batches(batch_size=batch_size * world_size, batch_format="numpy", drop_last=drop_last,
                                  **shuffle)
    for index, batch in enumerate(batches):
        if limit is not None and index >= limit:
            return
        piece = {k: v[lo:hi] for k, v in batch.items()}
        if len(next(iter(piece.values()))):
            yield piece
