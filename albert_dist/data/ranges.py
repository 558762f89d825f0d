"""Input files cut into ranges that Ray tasks read and parse alone, so one big file is many tasks.

A text file is cut every `range_bytes` at the next place a document ends: the start of a line (lines, JSONL) or
of the line after a blank one (blocks, sentences), so every document is read whole by exactly one range. A
counting pass (Ray tasks, one per range: it decodes and splits lines, no tokenizing) tells each range how many
documents and lines of its file come before it, so documents keep the keys `name#index` of the whole file (the
keys seed their instances and the eval split; the name is the file's path below the inputs' common directory)
and a broken JSONL line is reported with its line in the file: the prepared data is the same however the files
are cut. A Parquet file is cut into row spans (its metadata gives the
row counts; a range reads only the row groups it overlaps). A gzip file is one range: a gzip stream cannot be
entered in the middle, so any range of it would first decompress all that precedes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from albert_dist.data.readers import (
    Document,
    decode,
    document_count,
    document_names,
    file_format,
    make_documents,
    parquet_texts,
    parse_file,
    parse_text,
)
from albert_dist.errors import DataError
from albert_dist.storage import filesystem

RANGES_PER_CPU = 4  # a few ranges per CPU so that fast and slow ranges even out across the actors
MIN_RANGE_BYTES = 256 * 2**10
MAX_RANGE_BYTES = 64 * 2**20
_SCAN_BYTES = 64 * 2**10


@dataclass(frozen=True)
class FileRange:
    """What one read task parses: bytes [start, end) of a text file, rows [start, end) of a Parquet file, or
    (`end` None) the whole file."""

    path: str
    name: str  # the file's name in its documents' keys (`document_names`)
    fmt: str
    start: int = 0
    end: int | None = None
    first_document: int = 0  # documents of the file before `start` (the keys of its own go on from there)
    first_line: int = 0  # lines of the file before `start` (for JSONL error messages)
    blank_file: bool | None = None  # a cut file is blank in all its ranges (known from the counting pass)


def auto_range_bytes(files: list[str], cpus: float) -> int:
    """About RANGES_PER_CPU ranges per CPU of the cluster over the files that can be cut, within limits that keep
    a range's task overhead small and its memory bounded."""
    total = sum(_size(path) for path in files if not path.lower().endswith(".gz"))
    return int(min(MAX_RANGE_BYTES, max(MIN_RANGE_BYTES, total / max(1.0, RANGES_PER_CPU * cpus))))


def plan_ranges(
    files: list[str], fmt: str, text_field: str, range_bytes: int, num_cpus: float | None = None
) -> list[FileRange]:
    """The ranges of every file, in file order; text files above `range_bytes` are counted by Ray tasks."""
    import ray

    scan = ray.remote(num_cpus=num_cpus)(_scan) if num_cpus is not None else ray.remote(_scan)
    names = document_names(files)
    planned: list[list[FileRange] | tuple[str, str, str, list]] = []
    for path in files:
        kind, size = file_format(path, fmt), _size(path)
        if path.lower().endswith(".gz") or size <= range_bytes:
            planned.append([FileRange(path, names[path], kind)])
        elif kind == "parquet":
            planned.append(_parquet_ranges(path, names[path], size, text_field, range_bytes))
        else:
            scans = [scan.remote(path, kind, size, p, p + range_bytes) for p in range(0, size, range_bytes)]
            planned.append((path, names[path], kind, scans))
    ranges: list[FileRange] = []
    for item in planned:
        ranges.extend(item if isinstance(item, list) else _text_ranges(*item[:3], ray.get(item[3])))
    return ranges


def _size(path: str) -> int:
    fs, location = filesystem(path)
    return fs.get_file_info(location).size


def _parquet_ranges(path: str, name: str, size: int, column: str, range_bytes: int) -> list[FileRange]:
    import pyarrow.parquet as pq

    fs, location = filesystem(path)
    with fs.open_input_file(location) as f:
        try:
            rows = pq.ParquetFile(f).metadata.num_rows
        except Exception as err:  # noqa: BLE001 - pyarrow's ArrowInvalid and friends
            raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    pieces = max(1, min(rows, -(-size // range_bytes)))
    cuts = [rows * i // pieces for i in range(pieces + 1)]
    return [FileRange(path, name, "parquet", a, b, first_document=a) for a, b in zip(cuts, cuts[1:])]


def _text_ranges(path: str, name: str, kind: str, scans: list[tuple[int, int, int, int, bool]]) -> list[FileRange]:
    """Ranges from the counting pass's (start, end, documents, lines, blank) of each nominal range; ranges left
    empty by a long document are dropped."""
    blank = all(s[4] for s in scans)
    ranges, documents, lines = [], 0, 0
    for start, end, n_documents, n_lines, _ in scans:
        if start < end or not ranges:
            ranges.append(FileRange(path, name, kind, start, end, documents, lines, blank))
        documents, lines = documents + n_documents, lines + n_lines
    return ranges


def _scan(path: str, kind: str, size: int, start: int, end: int) -> tuple[int, int, int, int, bool]:
    """The counting pass for the nominal range [start, end): its cut start and end, and the documents, lines and
    blankness between them."""
    fs, location = filesystem(path)
    with fs.open_input_file(location) as f:
        first, last = _cut(f, start, size, kind), _cut(f, end, size, kind)
        f.seek(first)
        data = f.read(last - first)
    text = decode(data, first == 0)
    return first, last, document_count(kind, text), len(text.splitlines()), not data.strip()


def _cut(f, position: int, size: int, kind: str) -> int:
    """The first place at or after `position` where a document may start: the start of a line, for blocks and
    sentences the start of a line after a blank one (EOF when there is none).

    Lines end at b"\\n" here, which always ends a line for `str.splitlines` too and never falls inside a UTF-8
    character; a line counts as blank when its decoded text strips to nothing, as the parsers decide."""
    if position <= 0 or position >= size:
        return min(max(position, 0), size)
    f.seek(position - 1)
    base, pending, line = position - 1, b"", None  # `line`: index in `pending` of the first whole line's start
    while chunk := f.read(_SCAN_BYTES):
        pending += chunk
        if line is None:
            newline = pending.find(b"\n")
            if newline < 0:
                base, pending = base + len(pending), b""
                continue
            line = newline + 1
            if kind not in ("blocks", "sentences"):
                return base + line
        while (newline := pending.find(b"\n", line)) >= 0:
            if not decode(pending[line:newline], False).strip():
                return base + newline + 1
            line = newline + 1
        base, pending, line = base + line, pending[line:], 0
    return size


def read_range(r: FileRange, text_field: str) -> tuple[list[Document], Counter]:
    """The documents of one range and its counters (`parse_file`'s; files and empty_files on a file's first
    range only)."""
    fs, location = filesystem(r.path)
    if r.end is None:
        with fs.open_input_stream(location, compression=None) as f:  # parse_file decompresses (and checks) gzip
            return parse_file(r.path, f.read(), r.fmt, text_field, r.name)
    counts: Counter = Counter(files=int(r.start == 0), empty_files=int(r.start == 0 and bool(r.blank_file)))
    if r.fmt == "parquet":
        with fs.open_input_file(location) as f:
            texts = parquet_texts(r.path, f, text_field, (r.start, r.end))
            counts["bytes"] = f.size() if r.start == 0 else 0
        return make_documents(r.name, texts, False, r.first_document, counts), counts
    with fs.open_input_file(location) as f:
        f.seek(r.start)
        data = f.read(r.end - r.start)
    documents, text_counts = parse_text(r.path, data, r.fmt, text_field, r.first_document, r.first_line, r.name)
    counts.update(text_counts)
    return documents, counts


def read_documents(
    ranges: list[FileRange],
    text_field: str,
    tally: Callable[[Counter], None] | None = None,
    num_cpus: float | None = None,
):
    """A Ray Dataset of documents (`doc_key`, `text`, `presplit`), one block per range at least, in file order
    when order is preserved."""
    import ray.data

    def parse(row: dict) -> list[Document]:
        documents, counts = read_range(FileRange(**row), text_field)
        if tally is not None:
            tally(counts)
        return documents

    items = [asdict(r) for r in ranges]
    return ray.data.from_items(items, override_num_blocks=len(items)).flat_map(parse, num_cpus=num_cpus)
