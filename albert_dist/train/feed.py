"""Deterministic per-rank batches, for exact resume without replay.

Training reads an epoch in an order that is a pure function of (seed, epoch, row count): `EpochOrder`. A global
batch is `batch_size × slots` consecutive positions of that order, cut into `slots` micro-batches of `batch_size`
rows; each rank trains the slots `slot_range` gives it (one each when the run has as many workers as slots). So
the ranks' shares are disjoint, global batch N of an epoch starts at position N × batch_size × slots, a resumed
run starts reading at the window that holds it (of the rows it had trained on, it reads at most that window's and
masks none), and an elastic run (`slots` = its most
workers) trains the same micro-batches whatever its worker count. Ray Data's local shuffle buffer cannot seek:
the rows it yields depend on every row before them.

Evaluation reads a Ray dataset from its start (`rank_batches`): it never resumes mid-way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

#: consecutive stored rows whose order is shuffled together: the windows themselves come in a seeded order
WINDOW_ROWS = 8192
_ORDER_STREAM = 104729  # seeds the epoch order apart from the masks (`data.masking.batch_rng`)

Rows = dict[str, np.ndarray]


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


class EpochOrder:
    """The stored rows of one epoch in their training order: windows of `window` consecutive stored rows in a
    seeded order, the rows of each window in a seeded order of their own. Every window's rows take consecutive
    positions, so the rows of any positions are known, and read, without the rows before them."""

    def __init__(self, rows: int, seed: int, epoch: int, window: int = WINDOW_ROWS):
        self.rows, self.window, self._key = rows, window, [seed, epoch, _ORDER_STREAM]
        self.windows = np.random.default_rng(self._key).permutation(-(-rows // window))
        sizes = np.minimum(window, rows - self.windows * window)
        self.starts = np.concatenate([[0], np.cumsum(sizes)])  # the position of each window's first row

    def window_span(self, start: int, stop: int) -> range:
        """The indices into `windows` of the windows that hold positions [start, stop)."""
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        return range(first, int(np.searchsorted(self.starts, stop, side="left")))

    def stored_rows(self, index: int) -> np.ndarray:
        """The stored row numbers of window `windows[index]`, in their training order."""
        window = int(self.windows[index])
        first = window * self.window
        count = min(self.window, self.rows - first)
        return first + np.random.default_rng([*self._key, window]).permutation(count)

    def take(self, start: int, stop: int) -> np.ndarray:
        """The stored row numbers at positions [start, stop) of the epoch."""
        parts = [
            self.stored_rows(k)[max(0, start - self.starts[k]) : stop - self.starts[k]]
            for k in self.window_span(start, stop)
        ]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


class _Windows:
    """The rows of the windows the feed is in, read whole through `read(first, stop)` (stored rows [first, stop))
    when first needed and let go once the feed has moved past them: it never returns to a window."""

    def __init__(self, read: Callable[[int, int], Rows], order: EpochOrder):
        self.read, self.order = read, order
        self.held: dict[int, tuple[np.ndarray, Rows]] = {}

    def rows(self, start: int, stop: int) -> Rows:
        span = self.order.window_span(start, stop)
        self.held = {k: held for k, held in self.held.items() if k >= span.start}
        parts = []
        for k in span:
            if k not in self.held:
                stored = self.order.stored_rows(k)
                first = int(self.order.windows[k]) * self.order.window
                self.held[k] = stored - first, self.read(first, first + len(stored))
            within, rows = self.held[k]
            picked = within[max(0, start - self.order.starts[k]) : stop - self.order.starts[k]]
            parts.append({name: column[picked] for name, column in rows.items()})
        return parts[0] if len(parts) == 1 else {name: _concat([p[name] for p in parts]) for name in parts[0]}


def _concat(columns: list[np.ndarray]) -> np.ndarray:
    """Columns end to end; ragged ones (object arrays of 1-D arrays) stay one array per row."""
    if all(column.dtype != object for column in columns):
        return np.concatenate(columns)
    joined = np.empty(sum(len(column) for column in columns), dtype=object)
    joined[:] = [row for column in columns for row in column]
    return joined


def slot_batches(
    read: Callable[[int, int], Rows],
    order: EpochOrder,
    *,
    batch_size: int,
    slots: range,
    slot_count: int,
    start: int = 0,
) -> Iterator[tuple[int, int, Rows]]:
    """(global batch index, slot, rows) of each of this rank's `slots` in every full global batch of `batch_size ×
    slot_count` positions of `order`, from global batch `start` on: training's micro-batches, the same whatever the
    worker count. `read(first, stop)` gives stored rows [first, stop) (`data.loading.SplitRows.read`); only the
    windows that hold this rank's rows from `start` on are read."""
    size = batch_size * slot_count
    windows = _Windows(read, order)
    for index in range(start, order.rows // size):
        for slot in slots:
            first = index * size + slot * batch_size
            yield index, slot, windows.rows(first, first + batch_size)


def slot_shares(world_size: int, slots: int) -> str:
    """How many of each global micro-batch's `slots` every rank trains, in words: "each trains 2", or by runs of
    ranks when a worker count that does not divide the slots gives some ranks one more ("ranks 0-1 train 1, rank 2
    trains 2")."""
    shares = [len(slot_range(rank, world_size, slots)) for rank in range(world_size)]
    if len(set(shares)) == 1:
        return f"each trains {shares[0]}"
    runs = []
    for share, group in itertools.groupby(range(world_size), key=lambda rank: shares[rank]):
        ranks = list(group)
        who = f"rank {ranks[0]} trains" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]} train"
        runs.append(f"{who} {share}")
    return ", ".join(runs)


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

    `seed` seeds a local shuffle of `shuffle_buffer` rows; `limit` caps the number of global batches (evaluation).
    """
    size = batch_size * world_size
    shuffle = {"local_shuffle_buffer_size": shuffle_buffer, "local_shuffle_seed": seed} if shuffle_buffer else {}
    batches = source.iter_batches(batch_size=size, batch_format="numpy", drop_last=drop_last, **shuffle)
    for index, batch in enumerate(batches):
        if limit is not None and index >= limit:
            return
        part = rank_slice(len(next(iter(batch.values()))), rank, world_size)
        if part.start < part.stop:
            yield index * size + part.start, {k: v[part] for k, v in batch.items()}
