"""End to end through Ray Data: prepare English and Chinese corpora, load them back, shard them per worker."""

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_data_support import chinese_corpus, english_tokenizer  # noqa: F401 - fixtures

from albert_dist.data.config import DataJobConfig
from albert_dist.data.loading import load_prepared
from albert_dist.data.masking import MaskingCollator, batch_rng
from albert_dist.data.prepare import prepare_dataset
from albert_dist.errors import DataError
from albert_dist.train.feed import rank_batches


def config(tmp_path, inputs, **data):
    return DataJobConfig.model_validate(
        {
            "run": {"output_dir": str(tmp_path)},
            "data": {
                "inputs": [str(p) for p in inputs],
                "rows_per_shard": 400,
                "eval_fraction": 0.05,
                "tokenizer_actors": 2,
                **data,
            },
            "tokenizer": {"vocab_size": 1000},
        }
    )


@pytest.fixture(scope="module")
def english(ray_session, stdlib_corpus, english_tokenizer, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prep-en")
    tok_dir = english_tokenizer.save(tmp / "tok")
    cfg = config(tmp, [stdlib_corpus], max_seq_length=64)
    cfg.tokenizer.path = str(tok_dir)
    summary = prepare_dataset(cfg, log=lambda _: None)
    return cfg, summary, load_prepared(tmp / "data/prepared")


def test_english_manifest_and_summary(english, english_tokenizer):
    cfg, summary, data = english
    m = data.manifest
    assert m["summary"] == summary
    assert summary["files"] == 1 and summary["documents"] > 500 and summary["sentences"] > 3 * summary["documents"]
    assert (
        summary["instances"]
        == summary["train_instances"] + summary["eval_instances"]
        == data.train.count() + data.eval.count()
    )
    assert 0 < summary["eval_documents"] < 0.1 * summary["documents"]
    assert sum(s["rows"] for s in m["splits"]["train"]["shards"]) == summary["train_instances"]
    assert all(s["rows"] == 400 for s in m["splits"]["train"]["shards"][:-1])
    assert data.verify_shards() == len(m["splits"]["train"]["shards"]) + len(m["splits"]["eval"]["shards"])
    assert m["tokenizer"]["vocab_size"] == english_tokenizer.vocab_size and m["config"]["data"]["max_seq_length"] == 64
    assert (data.tokenizer.special_ids, data.tokenizer.vocab_size) == (english_tokenizer.special_ids, 2000)
    rows = data.train.take_batch(2000, batch_format="numpy")
    assert max(len(x) for x in rows["input_ids"]) <= 64
    assert abs(rows["sop_label"].mean() - 0.5) < 0.05
    assert len(set(rows["instance_id"])) == 2000 and rows["instance_id"].max() < summary["train_instances"]
    out = data.collator()(rows, batch_rng(0, 0, 0, 0))
    assert out["input_ids"].shape[0] == len(rows["input_ids"])


def test_shards_that_checked_out_are_not_read_again_until_they_change(english, tmp_path):
    """A relaunch of a run does not hash the whole corpus again: its record names the shards that checked out,
    with their size and modification time; a shard changed since is read and refused."""
    copy = tmp_path / "prepared"
    shutil.copytree(english[2].location, copy)
    data, record = load_prepared(copy), tmp_path / "run" / "verified_shards.json"
    shards = len(data.shard_paths("train")) + len(data.shard_paths("eval"))
    assert data.verify_shards(record) == shards and data.verify_shards(record) == 0

    shard = copy / "train" / "part-00000.parquet"
    original = shard.read_bytes()
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0xFF  # same size, another modification time
    shard.write_bytes(bytes(damaged))
    with pytest.raises(DataError, match=r"shard train/part-00000\.parquet does not match its sha256"):
        data.verify_shards(record)
    shard.write_bytes(original)
    assert data.verify_shards(record) == 1  # the rewritten shard only
    record.write_text("{cut off")  # an unreadable record: every shard is read again
    assert data.verify_shards(record) == shards


def test_same_seed_same_shards(english, tmp_path):
    cfg, _, data = english
    again = cfg.model_copy(deep=True)
    again.run.output_dir = str(tmp_path)
    again.data.tokenizer_actors = 1  # another partitioning of the work
    prepare_dataset(again, log=lambda _: None)
    other = load_prepared(tmp_path / "data/prepared")
    for split in ("train", "eval"):
        assert data.manifest["splits"][split] == other.manifest["splits"][split]
        for a, b in zip(data.shard_paths(split), other.shard_paths(split)):
            assert pq.read_table(a).equals(pq.read_table(b))


def test_training_keeps_a_small_held_out_split_in_memory(english, monkeypatch):
    import ray

    import albert_dist.data.loading as loading

    _, _, data = english
    splits = data.held_out(in_memory=True)
    assert set(splits) == {"eval"}  # the training split is read by row number on the workers
    actual = splits["eval"].size_bytes()
    estimate = data.in_memory_bytes("eval")
    assert 0.5 * actual < estimate < 2 * actual, (estimate, actual)
    assert splits["eval"].take_batch(3)["instance_id"].tolist() == data.eval.take_batch(3)["instance_id"].tolist()
    assert data.fits_in_memory("auto") and data.fits_in_memory("memory") and not data.fits_in_memory("stream")
    object_store = ray.cluster_resources()["object_store_memory"]
    monkeypatch.setattr(loading, "CACHE_SHARE", 0.5 * estimate / object_store)
    assert not data.fits_in_memory("auto") and data.fits_in_memory("memory")


def test_ray_train_split_is_disjoint_and_covers(english):
    _, summary, data = english
    world = 3
    # streaming_split's iterators must be consumed concurrently, as Ray Train's workers do.
    with ThreadPoolExecutor(world) as pool:
        split = list(
            pool.map(
                lambda it: {i for b in it.iter_batches(batch_format="numpy") for i in b["instance_id"]},
                data.train.streaming_split(world, equal=False),
            )
        )
    assert sum(map(len, split)) == summary["train_instances"]
    assert set().union(*split) == set(range(summary["train_instances"]))


def test_rank_batches_are_disjoint_equal_and_repeatable(english, ordered_ray_data):
    """The pretraining feed: each rank's slice of the same seeded global batches (what exact resume relies on),
    with the stream position of its first row; without drop_last the partial last batch is split evenly."""
    _, summary, data = english
    world, size = 2, 16

    def pieces(rank, seed=1, limit=None, drop_last=True):
        return [
            (first, b["instance_id"].tolist())
            for first, b in rank_batches(
                data.train,
                batch_size=size,
                rank=rank,
                world_size=world,
                seed=seed,
                shuffle_buffer=64,
                limit=limit,
                drop_last=drop_last,
            )
        ]

    def ids(rank, **kwargs):
        return [batch for _, batch in pieces(rank, **kwargs)]

    r0, r1 = ids(0), ids(1)
    assert ids(0) == r0 and ids(0, limit=2) == r0[:2] and ids(0, seed=2) != r0
    whole = [pieces(rank, drop_last=False) for rank in range(world)]
    assert len(r0) == len(r1) == summary["train_instances"] // (size * world) > 5
    assert all(len(batch) == size for batch in r0 + r1)
    flat0, flat1 = sum(r0, []), sum(r1, [])
    assert len(set(flat0)) == len(flat0) and not set(flat0) & set(flat1)
    # every row once, at the stream position the slice names
    positions = [first + i for rank in whole for first, batch in rank for i in range(len(batch))]
    assert sorted(positions) == list(range(summary["train_instances"]))
    shares = [{first // (size * world): len(batch) for first, batch in rank} for rank in whole]
    for index in range(-(-summary["train_instances"] // (size * world))):  # a rank's share is missing when empty
        assert max(share.get(index, 0) for share in shares) - min(share.get(index, 0) for share in shares) <= 1


def test_rank_slices_split_full_batches_equally_and_partial_ones_evenly():
    from albert_dist.train.feed import rank_slice

    assert [rank_slice(32, rank, 2) for rank in range(2)] == [slice(0, 16), slice(16, 32)]
    assert [rank_slice(5, rank, 2) for rank in range(2)] == [slice(0, 3), slice(3, 5)]
    assert [rank_slice(1, rank, 3) for rank in range(3)] == [slice(0, 1), slice(1, 1), slice(1, 1)]


def test_load_errors(english, tmp_path):
    with pytest.raises(DataError, match="manifest.json is missing"):
        load_prepared(tmp_path / "nothing")
    _, _, data = english
    copy = tmp_path / "copy"
    shutil.copytree(data.location, copy)
    (copy / "tokenizer/spiece.model").write_bytes(b"another model")
    with pytest.raises(DataError, match="does not match the manifest"):
        load_prepared(copy)


def test_chinese_with_trained_tokenizer_and_static_masks(ray_session, chinese_corpus, tmp_path):
    cfg = config(tmp_path, [chinese_corpus], output=str(tmp_path / "zh"), tokenizer_actors=1)
    cfg.tokenizer.character_coverage = 0.9995
    cfg.masking.static = True
    summary = prepare_dataset(cfg, log=lambda _: None)
    data = load_prepared(tmp_path / "zh")
    assert summary["documents"] == 1500 and summary["sentences"] > 8000
    assert (tmp_path / "zh/tokenizer/spiece.model").exists() and data.manifest["static_masking"]
    rows = data.train.take_batch(500, batch_format="numpy")
    # Every CJK character is a word for whole-word masking: nearly every non-special token starts a word.
    starts = np.concatenate(list(rows["word_start"]))
    assert starts.mean() > 0.9
    out = MaskingCollator.from_manifest(data.manifest)(rows, batch_rng(0, 0, 0, 0))
    assert ((out["labels"] != -100).sum(1) >= 1).all()
    assert not list(tmp_path.glob(".zh.tmp-*")), "staging directory removed"


def test_bad_input_fails_cleanly_and_keeps_the_old_output(english, ray_session, tmp_path):
    cfg, _, data = english
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "Fine. Really."}\n{"text": broken\n')
    broken = cfg.model_copy(deep=True)
    broken.data.inputs = [str(bad)]
    broken.data.output = data.location
    before = data.manifest
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        prepare_dataset(broken, log=lambda _: None)
    assert load_prepared(data.location).manifest == before


def test_an_output_naming_the_corpus_or_its_directory_is_refused_and_deletes_nothing(english, ray_session, tmp_path):
    """data.output mistyped as the corpus's own directory, or the corpus file: publishing replaces its target whole,
    so it is refused, before the work, and every input is kept byte for byte."""
    cfg, _, _ = english
    corpus_dir = Path(cfg.data.inputs[0]).parent
    before = {p: p.read_bytes() for p in corpus_dir.rglob("*") if p.is_file()}
    for output, what in ((corpus_dir, "holds files and no manifest.json"), (cfg.data.inputs[0], "is a file")):
        mistyped = cfg.model_copy(deep=True)
        mistyped.data.output = str(output)
        with pytest.raises(DataError, match=f"refusing to publish to {output}: it {what}"):
            prepare_dataset(mistyped, log=lambda _: None)
    assert {p: p.read_bytes() for p in corpus_dir.rglob("*") if p.is_file()} == before


def test_messy_text_is_counted(ray_session, english_tokenizer, tmp_path):
    corpus = tmp_path / "messy.txt"
    runaway = ("word " * 400_000).encode()  # a 2 MB line without a sentence end (1,000 times max_sentence_chars)
    corpus.write_bytes(
        b"Good first. Good second.\n\n   \n\nOnly one sentence here.\n\n"
        + runaway
        + b"\n\nBad \xff bytes. More text.\n"
    )
    (tmp_path / "empty.txt").write_bytes(b"")
    cfg = config(tmp_path, [corpus, tmp_path / "empty.txt"], eval_fraction=0.0)
    cfg.tokenizer.path = str(english_tokenizer.save(tmp_path / "tok"))
    s = prepare_dataset(cfg, log=lambda _: None)
    assert (s["files"], s["empty_files"], s["documents"], s["replaced_chars"]) == (2, 1, 4, 1)
    assert s["one_sentence_documents"] == 1 and s["long_sentences_cut"] == 1 and s["sentences_cut_in_two"] >= 1
    assert s["tokens"] > 400_000 and s["train_instances"] > 100


def test_the_summary_prints_in_two_lines_with_only_the_counters_that_are_not_zero():
    from albert_dist.data.prepare import format_summary

    summary = {
        "files": 2,
        "bytes": 12_345,
        "documents": 40,
        "eval_documents": 2,
        "sentences": 300,
        "tokens": 9_000,
        "instances": 120,
        "train_instances": 114,
        "eval_instances": 6,
        "empty_files": 0,
        "tokens_truncated": 1_234,
        "replaced_chars": 0,
        "one_sentence_documents": 3,
        "seconds": 1.5,
        "tokens_per_second": 6000.0,
        "instances_per_second": 80.0,
    }
    headline, counters = format_summary(summary).splitlines()
    assert (
        "2 file(s), 12,345 bytes → 40 documents (2 held out)" in headline
        and "120 instances (114 train, 6 eval)" in headline
        and "6,000 tokens/s" in headline
    )
    assert counters == "data: tokens_truncated 1,234, one_sentence_documents 3"
    assert len(format_summary({**summary, "tokens_truncated": 0, "one_sentence_documents": 0}).splitlines()) == 1
