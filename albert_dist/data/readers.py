"""Corpus files to documents: path expansion, decoding and the per-format parsers.

A file, or a range of it (`ranges.py` cuts big files where documents end), is parsed by one function, so
undecodable bytes can be counted and a broken JSONL line is reported with its file and line number.
Damage that loses little (a few bad bytes, empty files, blank documents) is counted; input the job cannot interpret
(text in another encoding than UTF-8, invalid JSON, a missing field or column, a corrupt gzip or Parquet file) stops
it with a `DataError`.
"""

from __future__ import annotations

import fnmatch
import gzip
import io
import json
import os
import posixpath
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from albert_dist.errors import DataError
from albert_dist.storage import filesystem
from albert_dist.text_encoding import refuse_other_encoding, undecodable_chars

_GLOB_CHARS = "*?["
_JSONL_EXTENSIONS = (".jsonl", ".json", ".ndjson")
_PARQUET_EXTENSIONS = (".parquet", ".pq")

Document = dict[str, Any]  # {"doc_key": str, "text": str, "presplit": bool}


def resolve_inputs(inputs: list[str]) -> list[str]:
    """Expand files, directories (recursively) and globs into a sorted, de-duplicated list of files.

    A missing path or a glob that matches nothing is an error: silently training on less data is worse.
    """
    if not inputs:
        raise DataError("data.inputs is empty: give files, directories or globs")
    files: set[str] = set()
    for item in inputs:
        fs, path = filesystem(item)
        prefix = item[: len(item) - len(path)] if "://" in item and item.endswith(path) else ""
        matched = _expand(fs, path)
        if not matched:
            what = "glob matches no file" if any(c in path for c in _GLOB_CHARS) else "path not found"
            raise DataError(f"data.inputs: {what}: {item}")
        files.update(prefix + m if prefix else m for m in matched)
    return sorted(files)


def document_names(files: list[str]) -> dict[str, str]:
    """Each file's name in its documents' keys: its path below the deepest directory holding every file. The keys
    seed the eval split and the instances, so the same corpus prepared from another place (another mount point, a
    copy in object storage) gives the same prepared data."""
    locations = ["/" + f.split("://", 1)[1] if "://" in f else os.path.abspath(f) for f in files]
    if not locations:
        return {}
    root = posixpath.commonpath([posixpath.dirname(location) for location in locations])
    return {f: posixpath.relpath(location, root) for f, location in zip(files, locations)}


def _expand(fs: pafs.FileSystem, path: str) -> list[str]:
    if any(c in path for c in _GLOB_CHARS):
        parts = path.split("/")
        fixed = next(i for i, part in enumerate(parts) if any(c in part for c in _GLOB_CHARS))
        base = "/".join(parts[:fixed]) or "/"
        if fs.get_file_info(base).type != pafs.FileType.Directory:
            return []
        pattern = path.replace("**/", "*")
        return [f for f in _list_files(fs, base) if fnmatch.fnmatch(f, pattern)]
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [path]
    if info.type == pafs.FileType.Directory:
        return _list_files(fs, path)
    return []


def _list_files(fs: pafs.FileSystem, directory: str) -> list[str]:
    """Files under `directory`, skipping hidden ones (.DS_Store, .crc, editor swap files)."""
    infos = fs.get_file_info(pafs.FileSelector(directory, recursive=True))
    return [
        i.path
        for i in infos
        if i.type == pafs.FileType.File
        and not any(part.startswith((".", "_")) for part in Path(i.path).relative_to(directory).parts)
    ]


def file_format(path: str, configured: str) -> str:
    """`configured` unless it is 'auto': then .jsonl/.json/.ndjson → jsonl, .parquet/.pq → parquet, any other
    text → blocks (blank-line separated documents, which also reads google's one-sentence-per-line files)."""
    if configured != "auto":
        return configured
    name = path.lower().removesuffix(".gz")
    if name.endswith(_JSONL_EXTENSIONS):
        return "jsonl"
    if name.endswith(_PARQUET_EXTENSIONS):
        return "parquet"
    return "blocks"


def parse_file(
    path: str, data: bytes, fmt: str, text_field: str, name: str | None = None
) -> tuple[list[Document], Counter]:
    """Documents of one whole file, keyed by `name` (`document_names`; the path if not given), and its counters
    (files, bytes, replaced_chars, empty_files, empty_documents)."""
    counts: Counter = Counter(files=1)
    if path.lower().endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(f"{path}: not a valid gzip file ({err})") from None
    if not data.strip():
        counts["empty_files"] = 1
    fmt = file_format(path, fmt)
    if fmt == "parquet":
        counts["bytes"] = len(data)
        texts = parquet_texts(path, io.BytesIO(data), text_field)
        return make_documents(name or path, texts, False, 0, counts), counts
    documents, text_counts = parse_text(path, data, fmt, text_field, name=name)
    counts.update(text_counts)
    return documents, counts


def parse_text(
    path: str,
    data: bytes,
    fmt: str,
    text_field: str,
    first_document: int = 0,
    first_line: int = 0,
    name: str | None = None,
) -> tuple[list[Document], Counter]:
    """Documents of a text file's bytes, whole or a range of whole lines (whole documents for blocks and
    sentences) that has `first_document` documents and `first_line` lines of the file before it; only the file's
    start (`first_line` 0) may hold a byte-order mark. Counters: bytes, replaced_chars, empty_documents."""
    counts: Counter = Counter(bytes=len(data))
    text = decode(data, first_line == 0)
    refuse_other_encoding(path, len(text), undecodable_chars(text, data), data)
    counts["replaced_chars"] = text.count("\ufffd") - data.count(b"\xef\xbf\xbd")
    texts = _TEXT_PARSERS[fmt](path, text, text_field, first_line)
    return make_documents(name or path, texts, fmt == "sentences", first_document, counts), counts


def decode(data: bytes, file_start: bool) -> str:
    """UTF-8 with undecodable bytes replaced; a byte-order mark dropped at the file's start only."""
    return data.decode("utf-8-sig" if file_start else "utf-8", errors="replace")


def document_count(fmt: str, text: str) -> int:
    """How many documents (kept or counted as empty) `parse_text` numbers in `text`, without parsing JSON."""
    if fmt == "jsonl":
        return sum(1 for line in text.splitlines() if line.strip())
    return len(_TEXT_PARSERS[fmt]("", text, "", 0))


def make_documents(
    name: str, texts: list[str | None], presplit: bool, first_document: int, counts: Counter
) -> list[Document]:
    """Documents keyed `name#index`, their index in the file (the key seeds their instances and the eval split)."""
    documents = []
    for index, text in enumerate(texts, start=first_document):
        if text is None or not text.strip():
            counts["empty_documents"] += 1
            continue
        documents.append({"doc_key": f"{name}#{index}", "text": text, "presplit": presplit})
    return documents


def _sentences(path: str, text: str, _: str, __: int) -> list[str]:
    """google-research format: one sentence per line, a blank line between documents."""
    return ["\n".join(ln.strip() for ln in block.splitlines() if ln.strip()) for block in _blocks(path, text, _, __)]


def _blocks(path: str, text: str, _: str, __: int) -> list[str]:
    documents, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line)
        elif current:
            documents.append("\n".join(current))
            current = []
    if current:
        documents.append("\n".join(current))
    return documents


def _lines(path: str, text: str, _: str, __: int) -> list[str]:
    return text.splitlines()


def _jsonl(path: str, text: str, text_field: str, first_line: int) -> list[str | None]:
    texts = []
    for number, line in enumerate(text.splitlines(), start=first_line + 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict) or text_field not in record:
            raise DataError(f"{path}:{number}: record has no field {text_field!r} (set data.text_field)")
        value = record[text_field]
        if value is not None and not isinstance(value, str):
            raise DataError(f"{path}:{number}: field {text_field!r} is {type(value).__name__}, not a string")
        texts.append(value)
    return texts


_TEXT_PARSERS: dict[str, Callable[[str, str, str, int], list]] = {
    "sentences": _sentences,
    "blocks": _blocks,
    "lines": _lines,
    "jsonl": _jsonl,
}


def parquet_texts(path: str, source, column: str, rows: tuple[int, int] | None = None) -> list[str | None]:
    """The `column` of a Parquet file (a path-less file object), or of its rows [start, end): only the row groups
    that hold them are read."""
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(source)
    except Exception as err:  # noqa: BLE001 - pyarrow's ArrowInvalid and friends
        raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    names = file.schema_arrow.names
    if column not in names:
        raise DataError(
            f"{path}: Parquet file has no column {column!r} (columns: {', '.join(names)}; set data.text_field)"
        )
    if rows is None:
        return file.read(columns=[column]).column(column).to_pylist()
    start, end = rows
    texts: list[str | None] = []
    first = 0
    for group in range(file.num_row_groups):
        size = file.metadata.row_group(group).num_rows
        if first < end and first + size > start:
            values = file.read_row_group(group, columns=[column]).column(column)
            texts.extend(values.slice(max(start - first, 0), min(end, first + size) - max(start, first)).to_pylist())
        first += size
    return texts
