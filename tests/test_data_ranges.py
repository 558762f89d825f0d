"""One big corpus file is many read tasks: ranges cut where documents end read like the whole file, through Ray
Data and through the whole preparation (same instances, same counters, same error lines)."""

from __future__ import annotations

import gzip
import json
import shutil
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_data_support import english_tokenizer  # noqa: F401 - fixture

from albert_dist.data.config import DataJobConfig
from albert_dist.data.prepare import TIMINGS, prepare_dataset
from albert_dist.data.ranges import _scan, _text_ranges, plan_ranges, read_documents, read_range
from albert_dist.data.readers import parse_file
from albert_dist.errors import DataError

PIECES = st.sampled_from(
    [
        "Dr. Smith",
        " went home.",
        " 他说：“好。”",
        "\n",
        "\n\n",
        "\r\n",
        "\r",
        "\t",
        "\u3000\n",
        "\ufeff",
        "\u2028",
        "\x0c\n",
        " \n",
        '{"text": "a. b."}\n',
        '{"text": null}\n',
        '{"text": 3}\n',
        "{\n",
        "\ufffd",
    ]
)
corpus_bytes = st.tuples(
    st.lists(PIECES, max_size=30).map(lambda parts: "".join(parts).encode("utf-8")),
    st.sampled_from([b"", b"\xff", b"\xe4\xb8", b"\n\xe4\xb8\n"]),
).map(lambda p: p[0] + p[1])


def outcome(read):
    """Documents and counters, or the DataError's message."""
    try:
        documents, counts = read()
    except DataError as err:
        return str(err)
    return documents, +counts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=corpus_bytes, fmt=st.sampled_from(["blocks", "sentences", "lines", "jsonl"]), range_bytes=st.integers(1, 40)
)
def test_cut_ranges_read_exactly_as_the_whole_file(tmp_path, data, fmt, range_bytes):
    """Whatever the bytes and the cut size: the same documents with the same keys, the same counters and the same
    first error (its line numbered in the file) as the whole file parsed at once."""
    path = tmp_path / "c.txt"
    path.write_bytes(data)
    scans = [_scan(str(path), fmt, len(data), p, p + range_bytes) for p in range(0, len(data), range_bytes)]
    ranges = _text_ranges(str(path), str(path), fmt, scans) if data else []

    def cut():
        documents, counts = [], Counter()
        for r in ranges:
            part, part_counts = read_range(r, "text")
            documents += part
            counts.update(part_counts)
        return documents, counts

    if data:
        assert outcome(cut) == outcome(lambda: parse_file(str(path), data, fmt, "text"))


def test_a_gzip_file_is_one_range_read_whole(tmp_path):
    path = tmp_path / "c.txt.gz"
    raw = b"Doc one.\n\nDoc two.\n\n" * 200
    path.write_bytes(gzip.compress(raw))
    (r,) = plan_ranges([str(path)], "auto", "text", 100)
    assert (r.start, r.end) == (0, None)
    documents, counts = read_range(r, "text")
    assert len(documents) == 400 and documents[-1]["doc_key"] == "c.txt.gz#399" and counts["bytes"] == len(raw)


def documents_text(n_docs: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega".split()
    return [
        " ".join(f"{' '.join(rng.choice(words, int(rng.integers(3, 12))))}." for _ in range(int(k)))
        for k in rng.integers(2, 9, n_docs)
    ]


def test_a_big_text_file_is_many_blocks_with_each_document_whole_once(ordered_ray_data, tmp_path):
    docs = documents_text(120)
    long_doc = "A long one that straddles. " * 300  # 8 kB: over two cut sizes
    docs.insert(60, long_doc.strip())
    path = tmp_path / "big.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    ranges = plan_ranges([str(path)], "auto", "text", 2000)
    assert len(ranges) > 5 and {r.path for r in ranges} == {str(path)}
    dataset = read_documents(ranges, "text").materialize()
    assert dataset.num_blocks() >= len(ranges)
    whole, _ = parse_file(str(path), path.read_bytes(), "auto", "text", name="big.txt")
    assert dataset.take_all() == whole and len(whole) == 121
    assert [d["text"] for d in whole].count(long_doc.strip()) == 1


def test_parquet_is_cut_into_row_spans(ordered_ray_data, tmp_path):
    path = tmp_path / "rows.parquet"
    texts = documents_text(500, seed=1)
    texts[7] = None
    pq.write_table(pa.table({"body": texts}), path, row_group_size=150)
    ranges = plan_ranges([str(path)], "auto", "body", -(-path.stat().st_size // 6))
    assert len(ranges) == 6 and [r.first_document for r in ranges] == [r.start for r in ranges]
    whole, whole_counts = parse_file(str(path), path.read_bytes(), "auto", "body", name="rows.parquet")
    assert read_documents(ranges, "body").take_all() == whole
    counts = Counter()
    for r in ranges:
        counts.update(read_range(r, "body")[1])
    assert +counts == +whole_counts and whole_counts["empty_documents"] == 1


def config(tmp_path, inputs, tokenizer_dir, **data):
    return DataJobConfig.model_validate(
        {
            "run": {"output_dir": str(tmp_path)},
            "data": {
                "inputs": [str(p) for p in inputs],
                "rows_per_shard": 300,
                "eval_fraction": 0.1,
                "tokenizer_actors": 2,
                "max_seq_length": 64,
                "output": str(tmp_path / "out"),
                **data,
            },
            "tokenizer": {"path": str(tokenizer_dir)},
        }
    )


def test_prepared_data_is_the_same_however_the_files_are_cut_and_wherever_they_lie(
    ray_session, english_tokenizer, tmp_path
):
    """Text (with undecodable bytes), JSONL and Parquet, each over the cut size: the shards are byte-identical to
    those of reading every file whole, and to those of the same files in another directory (the keys that seed the
    eval split and the masks hold no absolute path); the counters too, and Ray Data never reports an actor pool
    short of input."""
    docs = documents_text(600, seed=2)
    text = tmp_path / "a.txt"
    text.write_bytes("\n\n".join(docs[:200]).encode() + b"\n\nBad \xff bytes. Here \xfe too.\n")
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[200:400]), encoding="utf-8")
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": docs[400:]}), parquet, row_group_size=80)
    tok_dir = english_tokenizer.save(tmp_path / "tok")
    cut_size = 4096
    for path in (text, jsonl, parquet):
        assert path.stat().st_size > 3 * cut_size and len(plan_ranges([str(path)], "auto", "text", cut_size)) > 3

    elsewhere = tmp_path / "mounted" / "elsewhere"
    elsewhere.mkdir(parents=True)
    moved = [Path(shutil.copy(path, elsewhere)) for path in (text, jsonl, parquet)]

    results = {}
    for name, inputs, range_bytes in (
        ("cut", [text, jsonl, parquet], cut_size),
        ("whole", [text, jsonl, parquet], 10**9),
        ("moved", moved, cut_size),
    ):
        cfg = config(tmp_path / name, inputs, tok_dir, range_bytes=range_bytes)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summary = prepare_dataset(cfg, log=lambda _: None)
        manifest = json.loads((tmp_path / name / "out/manifest.json").read_text())
        results[name] = summary, manifest["splits"], [str(w.message) for w in caught]
    (cut_summary, cut_splits, cut_warnings), (whole_summary, whole_splits, _) = results["cut"], results["whole"]
    how_it_ran = (*TIMINGS, "ranges", "tokenizer_actors")
    assert {k: v for k, v in cut_summary.items() if k not in how_it_ran} == {
        k: v for k, v in whole_summary.items() if k not in how_it_ran
    }
    assert cut_summary["ranges"] > 3 * whole_summary["ranges"] == 9
    assert cut_summary["files"] == 3 and cut_summary["replaced_chars"] == 2 and cut_summary["documents"] == 601
    assert cut_splits == whole_splits and cut_splits["train"]["rows"] > 300  # the shards' sha256 are in the splits
    assert results["moved"][1] == cut_splits
    assert not [w for w in cut_warnings if "input(s)" in w]


def test_a_broken_jsonl_line_is_named_by_its_line_in_the_file(ray_session, english_tokenizer, tmp_path):
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": d}) for d in documents_text(300, seed=3)]
    lines.insert(199, "")  # a blank line is skipped but still counted
    lines[250] = '{"text": broken'
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ranges = plan_ranges([str(bad)], "auto", "text", 8000)
    assert len(ranges) > 5 and max(r.first_line for r in ranges if r.first_line < 251) > 200  # a late range
    cfg = config(tmp_path, [bad], english_tokenizer.save(tmp_path / "tok"), range_bytes=8000)
    with pytest.raises(DataError, match=r"bad.jsonl:251: not valid JSON") as raised:
        prepare_dataset(cfg, log=lambda _: None)
    assert str(raised.value) == f"{bad}:251: not valid JSON (Expecting value at column 10)"  # no Ray layers
