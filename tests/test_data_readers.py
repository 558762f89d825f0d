"""Corpus reading: formats, path expansion and every kind of bad input."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from albert_dist.data.ranges import plan_ranges, read_documents
from albert_dist.data.readers import document_names, file_format, parse_file, resolve_inputs
from albert_dist.errors import DataError


def texts(path, data, fmt, field="text"):
    docs, counts = parse_file(str(path), data, fmt, field)
    return [d["text"] for d in docs], counts


def test_documents_are_named_by_their_path_below_the_inputs_common_directory(tmp_path, monkeypatch):
    """The same corpus on another mount, relative to another working directory or in object storage: the same
    names, so the same document keys."""
    corpus = ["a/x.txt", "a/deeper/y.jsonl", "b/z.parquet"]
    names = dict(zip(corpus, corpus))
    assert document_names([f"/data/corpus/{f}" for f in corpus]) == {f"/data/corpus/{f}": n for f, n in names.items()}
    assert document_names([f"s3://bucket/run/{f}" for f in corpus]) == {
        f"s3://bucket/run/{f}": n for f, n in names.items()
    }
    monkeypatch.chdir(tmp_path)
    assert document_names(corpus) == names
    assert document_names(["/mnt/one/file.txt"]) == {"/mnt/one/file.txt": "file.txt"}
    assert document_names([]) == {}


def test_formats():
    raw = b"First one. Second.\nThird.\n\n\nNext doc.\n"
    assert texts("a.txt", raw, "sentences")[0] == ["First one. Second.\nThird.", "Next doc."]
    assert texts("a.txt", raw, "blocks")[0] == ["First one. Second.\nThird.", "Next doc."]
    lines, counts = texts("a.txt", raw, "lines")
    assert lines == ["First one. Second.", "Third.", "Next doc."] and counts["empty_documents"] == 2
    jsonl = b'{"text": "A doc."}\n\n{"body": 1, "text": "B doc."}\n{"text": ""}\n{"text": null}\n'
    docs, counts = texts("a.jsonl", jsonl, "auto")
    assert docs == ["A doc.", "B doc."] and counts["empty_documents"] == 2
    assert parse_file("a.txt", raw, "sentences", "text")[0][0]["presplit"]


def test_format_auto_by_extension():
    assert [file_format(p, "auto") for p in ("x.jsonl.gz", "x.json", "x.parquet", "x.txt", "x")] == [
        "jsonl",
        "jsonl",
        "parquet",
        "blocks",
        "blocks",
    ]
    assert file_format("x.jsonl", "lines") == "lines"


def test_gzip_and_parquet(tmp_path):
    docs, counts = texts("a.txt.gz", gzip.compress(b"Doc one.\n\nDoc two.\n"), "auto")
    assert docs == ["Doc one.", "Doc two."] and counts["bytes"] == 19
    with pytest.raises(DataError, match="a.txt.gz: not a valid gzip file"):
        parse_file("a.txt.gz", b"not gzip", "auto", "text")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": ["P one.", None, "P two."]}), path)
    docs, counts = texts(path, path.read_bytes(), "auto", "body")
    assert docs == ["P one.", "P two."] and counts["empty_documents"] == 1
    with pytest.raises(DataError, match=r"d.parquet: Parquet file has no column 'text' \(columns: body"):
        parse_file(str(path), path.read_bytes(), "auto", "text")


def test_undecodable_bytes_are_replaced_and_counted():
    raw = "Caf\u00e9 ok. Real \ufffd kept.".encode() + b" bad \xff\xfe here.\n"
    docs, counts = texts("a.txt", raw, "blocks")
    assert counts["replaced_chars"] == 2
    assert docs[0].endswith("bad \ufffd\ufffd here.")


CHINESE = "".join(f"第{i}段。今天天气很好，我们去公园散步。机器学习是人工智能的一个分支。\n\n" for i in range(40))


def test_a_corpus_in_another_encoding_is_refused_naming_it():
    """A Chinese corpus saved in GBK (Windows tools' default) would decode to replacement characters and train a
    tokenizer on them; it stops instead, with the conversion to run. Stray bad bytes stay counted (above)."""
    with pytest.raises(
        DataError,
        match=r"zh.txt: not UTF-8 text \(.* characters cannot be decoded or are NULs\); it reads as "
        r"Chinese in GB18030 .*iconv -f GB18030 -t UTF-8",
    ):
        texts("zh.txt", CHINESE.encode("gbk"), "blocks")
    latin = "Ça coûte très cher à Genève, déjà très élevé.\n".encode("latin-1") * 20
    with pytest.raises(DataError, match=r"fr.txt: not UTF-8 text .*iconv -f ENCODING -t UTF-8") as raised:
        texts("fr.txt", latin, "blocks")
    assert "GB18030" not in str(raised.value)
    # UTF-16, Windows Notepad's "Unicode": English in it is valid UTF-8, with a NUL after every character
    for name, encoding in (("en16.txt", "utf-16"), ("zh16.txt", "utf-16-le")):
        with pytest.raises(DataError, match=rf"{name}: not UTF-8 text .*it is UTF-16 .*iconv -f UTF-16 -t UTF-8"):
            texts(
                name, (CHINESE if name.startswith("zh") else "Plain English text.\n\n" * 40).encode(encoding), "blocks"
            )
    # the same text in UTF-8, with a byte-order mark and Windows line ends, is 40 documents
    docs, counts = texts("zh.txt", b"\xef\xbb\xbf" + CHINESE.replace("\n", "\r\n").encode(), "blocks")
    assert len(docs) == 40 and docs[0] == "第0段。今天天气很好，我们去公园散步。机器学习是人工智能的一个分支。"
    assert counts["replaced_chars"] == 0


def test_empty_file_and_blank_documents():
    docs, counts = texts("e.txt", b"", "blocks")
    assert docs == [] and counts["empty_files"] == 1
    docs, counts = texts("e.txt", b"  \n\n \n", "lines")
    assert docs == [] and counts["empty_files"] == 1 and counts["empty_documents"] == 3


def test_bad_jsonl_names_file_and_line():
    with pytest.raises(DataError, match=r"b.jsonl:3: not valid JSON"):
        parse_file("b.jsonl", b'{"text": "a"}\n\n{"text": oops}\n', "auto", "text")
    with pytest.raises(DataError, match=r"b.jsonl:1: record has no field 'text'"):
        parse_file("b.jsonl", b'{"body": "a"}\n', "auto", "text")
    with pytest.raises(DataError, match=r"b.jsonl:1: field 'text' is int"):
        parse_file("b.jsonl", b'{"text": 3}\n', "auto", "text")


def test_resolve_inputs(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.txt", "b.jsonl", "sub/c.txt.gz", ".hidden.txt"):
        (tmp_path / name).write_bytes(b"x")
    found = resolve_inputs([str(tmp_path)])
    assert [p.removeprefix(str(tmp_path)) for p in found] == ["/a.txt", "/b.jsonl", "/sub/c.txt.gz"]
    assert resolve_inputs([str(tmp_path / "*.txt"), str(tmp_path / "a.txt")]) == [str(tmp_path / "a.txt")]
    assert resolve_inputs([str(tmp_path / "**/*.gz")]) == [str(tmp_path / "sub/c.txt.gz")]
    with pytest.raises(DataError, match="path not found: .*missing.txt"):
        resolve_inputs([str(tmp_path / "missing.txt")])
    with pytest.raises(DataError, match="glob matches no file: .*nothing-"):
        resolve_inputs([str(tmp_path / "nothing-*.txt")])
    with pytest.raises(DataError, match="data.inputs is empty"):
        resolve_inputs([])


def test_read_through_ray_counts_and_orders(ordered_ray_data, tmp_path):
    (tmp_path / "a.txt").write_bytes(b"A one. A two.\n\nA three.\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "B one."}) + "\n")
    ds = read_documents(plan_ranges(resolve_inputs([str(tmp_path)]), "auto", "text", 2**20), "text")
    assert [r["text"] for r in ds.take_all()] == ["A one. A two.", "A three.", "B one."]
