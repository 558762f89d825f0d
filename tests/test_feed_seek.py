"""The training feed's epoch order and its seek: which rows each position holds, that a resumed run reads only the
windows from its position on (and each rank only those of its own slots), that the Parquet shards are read by row
number, and that the loop resumes through the seek to the same weights, bit for bit, as a run never stopped."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from test_loop import Checkpoints, KeywordTask, settings, weights

from albert_dist.data.loading import SplitRows
from albert_dist.train.feed import WINDOW_ROWS, EpochOrder, slot_batches, slot_range
from albert_dist.train.loop import Trainer, WorkerEnv


class CountingRows:
    """Stored rows 0..rows-1 as an `id` column, recording every range read."""

    def __init__(self, rows: int):
        self.rows, self.reads = rows, []

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        self.reads.append((start, stop))
        return {"id": np.arange(start, stop)}

    def rows_read(self) -> set[int]:
        return {row for start, stop in self.reads for row in range(start, stop)}


def test_an_epoch_is_a_permutation_of_every_row_new_each_epoch_and_the_same_for_the_same_seed():
    rows, window = 1000, 64  # the last window is partial (1000 = 15 x 64 + 40)
    first = EpochOrder(rows, seed=3, epoch=0, window=window).take(0, rows)
    assert sorted(first.tolist()) == list(range(rows))
    assert np.array_equal(first, EpochOrder(rows, seed=3, epoch=0, window=window).take(0, rows))
    assert not np.array_equal(first, EpochOrder(rows, seed=3, epoch=1, window=window).take(0, rows))
    assert not np.array_equal(first, EpochOrder(rows, seed=4, epoch=0, window=window).take(0, rows))
    order = EpochOrder(rows, seed=3, epoch=0, window=window)
    for start, stop in np.random.default_rng(0).integers(0, rows, (50, 2)):
        start, stop = sorted((int(start), int(stop)))
        assert np.array_equal(order.take(start, stop), first[start:stop])  # any position, without the ones before
    # each window's rows take consecutive positions, shuffled inside: a window is read once and let go
    spans = [set((first[a:b] // window).tolist()) for a, b in zip(order.starts[:-1], order.starts[1:])]
    assert all(len(span) == 1 for span in spans) and len({s.pop() for s in spans}) == len(spans)
    assert not np.array_equal(np.sort(first[:window]), first[:window])


def test_a_resume_mid_epoch_reads_only_the_windows_from_its_position_and_trains_the_same_micro_batches():
    rows, window, batch, slots = 512, 24, 8, 2  # 32 global batches of 16 rows; 22 windows, the last one of 8 rows
    order = EpochOrder(rows, seed=0, epoch=2, window=window)
    whole = CountingRows(rows)
    full = [
        (i, s, r["id"].tolist())
        for i, s, r in slot_batches(whole.read, order, batch_size=batch, slots=range(2), slot_count=slots)
    ]
    assert len(full) == rows // batch and len(whole.rows_read()) == rows
    for start in (3, 16, 29):  # 16: its position, 256, falls 8 rows into a window
        resumed = CountingRows(rows)
        tail = [
            (i, s, r["id"].tolist())
            for i, s, r in slot_batches(
                resumed.read, order, batch_size=batch, slots=range(2), slot_count=slots, start=start
            )
        ]
        assert tail == full[start * slots :]
        position = start * batch * slots
        first = order.starts[order.window_span(position, position + 1).start]  # where its window begins
        trained_before = set(order.take(0, position).tolist())
        # of the rows trained before, only those of the position's own window are read (and none is masked)
        assert resumed.rows_read() & trained_before == set(order.take(first, position).tolist())
        assert len(resumed.rows_read()) == rows - first


def test_each_rank_reads_only_the_windows_of_its_own_slots():
    rows, window, batch, slots = 256, 8, 8, 2
    order = EpochOrder(rows, seed=1, epoch=0, window=window)
    read = []
    for rank in range(2):
        source = CountingRows(rows)
        ids = [
            r["id"]
            for _, _, r in slot_batches(
                source.read, order, batch_size=batch, slots=slot_range(rank, 2, slots), slot_count=slots
            )
        ]
        assert source.rows_read() == set(np.concatenate(ids).tolist())
        read.append(source.rows_read())
    assert not read[0] & read[1] and len(read[0] | read[1]) == rows  # disjoint shares, every row once


def test_split_rows_reads_any_row_range_across_shards_and_row_groups(tmp_path):
    ids, shards, start = np.arange(700), [], 0
    (tmp_path / "train").mkdir()
    for number, count in enumerate((300, 250, 150)):
        part = ids[start : start + count]
        table = pa.table({"instance_id": part, "input_ids": [list(range(i % 7 + 1)) for i in part]})
        pq.write_table(table, tmp_path / "train" / f"part-{number}.parquet", row_group_size=64)
        shards.append({"path": f"train/part-{number}.parquet", "rows": count})
        start += count
    (tmp_path / "manifest.json").write_text(json.dumps({"splits": {"train": {"rows": 700, "shards": shards}}}))
    split = SplitRows(tmp_path)
    assert split.rows == 700
    for lo, hi in [(0, 700), (0, 1), (299, 301), (64, 128), (290, 560), (699, 700)]:
        rows = split.read(lo, hi)
        assert rows["instance_id"].tolist() == list(range(lo, hi))
        assert [len(r) for r in rows["input_ids"]] == [i % 7 + 1 for i in range(lo, hi)]


class SeekingTask(KeywordTask):
    """test_loop's task reading its rows through the feed's seek: (epoch, start, rows read) of each epoch begun."""

    slot_count = 2
    slots_held = 2

    def __init__(self):
        super().__init__()
        self.epochs: list[tuple[int, int, CountingRows]] = []

    def train_batches(self, epoch, phase=0):
        return self.train_batches_from(epoch, phase, 0)

    def train_batches_from(self, epoch, phase, start):
        source = CountingRows(224)
        self.epochs.append((epoch, start, source))
        order = EpochOrder(224, seed=5, epoch=epoch, window=32)
        for _, _, rows in slot_batches(source.read, order, batch_size=8, slots=range(2), slot_count=2, start=start):
            ids = torch.as_tensor(rows["id"])
            yield {
                "input_ids": self.x[ids],
                "attention_mask": torch.ones(len(ids), 16, dtype=torch.long),
                "labels": self.y[ids],
            }


def test_the_loop_resumes_through_the_seek_to_the_same_weights(tmp_path: Path):
    """14 global batches of 16 rows an epoch: step 10 (one global batch a step) is epoch 0's batch 10."""
    short = settings(max_steps=20, checkpoint_every=10, eval_every=20, log_every=10)
    full = Trainer(SeekingTask(), short, WorkerEnv(report=Checkpoints(tmp_path)))
    full.fit()
    task = SeekingTask()
    resumed = Trainer(task, short, WorkerEnv(resume_dir=tmp_path / "step10", print_fn=lambda s: None))
    assert (resumed.position.epoch, resumed.position.batch_in_epoch) == (0, 10)
    resumed.fit()
    for (name, a), b in zip(weights(full).items(), weights(resumed).values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert [(epoch, start) for epoch, start, _ in task.epochs] == [(0, 10), (1, 0)]
    trained_before = set(EpochOrder(224, seed=5, epoch=0, window=32).take(0, 10 * 16).tolist())
    read = task.epochs[0][2].rows_read()
    assert not read & trained_before and len(read) == 224 - 10 * 16


def test_fine_tuning_resumes_at_its_global_batch_and_collates_none_before_it(monkeypatch):
    """The classification task (and the token, QA and distillation tasks built on it) cuts its epoch's order at the
    position: the same batches as the epoch read from its start, none of the earlier ones collated."""
    from types import SimpleNamespace

    from albert_dist.data import batching
    from albert_dist.finetune.task import SequenceClassificationTask

    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 16, 100)
    rows = {
        "row": np.arange(100),
        "length": lengths,
        "input_ids": np.repeat(np.arange(100)[:, None], 16, axis=1),  # each row's id in its every piece
        "token_type_ids": np.zeros((100, 16), np.int64),
        "label": rng.integers(0, 2, 100),
    }
    collated = []
    collate = batching.collate
    monkeypatch.setattr(batching, "collate", lambda batch, multiple: collated.append(1) or collate(batch, multiple))
    for group_by_length in (False, True):
        for rank in range(2):
            task = SequenceClassificationTask.__new__(SequenceClassificationTask)
            task.spec = SimpleNamespace(seed=3, batch_size=4, group_by_length=group_by_length, pad_to_multiple_of=8)
            task.rank, task.world_size, task._cache = rank, 2, {"train": rows}
            whole = [b["input_ids"][:, 0].tolist() for b in task.train_batches(1)]  # 12 global batches of 8 rows
            collated.clear()
            tail = [b["input_ids"][:, 0].tolist() for b in task.train_batches_from(1, 0, 5)]
            assert len(whole) == 12 and tail == whole[5:] and len(collated) == 7


def test_pretraining_resumes_mid_epoch_reading_and_masking_only_from_its_position(tmp_path):
    """The pretraining task on Parquet shards in the prepared layout: from global batch `start` it serves the same
    micro-batches and masks as the epoch read from its start, masks only those, reads only rows from the window of
    its position on, and one worker holding both slots serves what two workers serve between them."""
    from albert_dist.data.config import MaskingSection
    from albert_dist.pretrain.task import PretrainingSpec

    rng, rows = np.random.default_rng(0), 9000  # two windows: 8,192 rows and 808
    lengths = rng.integers(5, 12, rows)
    ids = [rng.integers(5, 100, n).tolist() for n in lengths]
    (tmp_path / "train").mkdir()
    shards = []
    for number, (lo, hi) in enumerate([(0, 5000), (5000, rows)]):
        table = pa.table(
            {
                "instance_id": np.arange(lo, hi),
                "input_ids": pa.array(ids[lo:hi], pa.list_(pa.int32())),
                "token_type_ids": pa.array([[0] * len(row) for row in ids[lo:hi]], pa.list_(pa.int8())),
                "word_start": pa.array([[True] * len(row) for row in ids[lo:hi]], pa.list_(pa.bool_())),
                "sop_label": pa.array(rng.integers(0, 2, hi - lo), pa.int8()),
            }
        )
        pq.write_table(table, tmp_path / "train" / f"part-{number}.parquet", row_group_size=1024)
        shards.append({"path": f"train/part-{number}.parquet", "rows": hi - lo})
    manifest = {
        "splits": {"train": {"rows": rows, "shards": shards}},
        "tokenizer": {"vocab_size": 100, "pad_id": 0, "mask_id": 4, "special_ids": [0, 1, 2, 3, 4]},
        "config": {"masking": MaskingSection().model_dump()},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    spec = PretrainingSpec(
        prepared_dir=str(tmp_path),
        manifest=manifest,
        model_config={},
        masking=MaskingSection(),
        batch_size=32,
        max_seq_length=16,
        seed=0,
        eval_batches=0,
        has_eval=False,
        slots=2,
    )

    def served(task, epoch, start=0, count=None):
        batches = itertools.islice(task.train_batches_from(epoch, 0, start), count)
        return [(b["input_ids"].tolist(), b["labels"].tolist(), b["sentence_order_label"].tolist()) for b in batches]

    whole = served(spec.build(0, 1, dataset=None), 1)  # 140 global batches of 2 slots of 32 rows
    assert len(whole) == 280
    pair = [spec.build(rank, 2, dataset=None) for rank in range(2)]
    assert served(pair[0], 1, 0, 10) == whole[0:20:2] and served(pair[1], 1, 0, 10) == whole[1:20:2]

    task = spec.build(0, 1, dataset=None)
    masked, read = [], []
    collate, split = task.collate, task.split_rows(0)
    task.collate = lambda *args, **kw: masked.append(1) or collate(*args, **kw)
    read_rows = split.read
    split.read = lambda start, stop: read.append((start, stop)) or read_rows(start, stop)
    for start in (0, 131):
        masked.clear(), read.clear()
        tail = served(task, 1, start)
        assert tail == whole[2 * start :] and len(masked) == len(tail)
        order = EpochOrder(rows, 0, 1)
        windows = order.window_span(start * 64, rows)  # from the window that holds the position on, each read once
        stored = [int(order.windows[k]) * WINDOW_ROWS for k in windows]
        assert read == [(first, min(rows, first + WINDOW_ROWS)) for first in stored]
    assert len(windows) == 1 and len(read) == 1 and len(masked) == 18  # position 8,384: the second window
