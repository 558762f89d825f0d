"""`albert-dist predict`'s large inputs: a CSV, TSV, JSONL or Parquet file (a path or a URI) as a Ray dataset read in
ranges, so that no process ever holds the whole file.

The driver looks at the file's first rows (`look`: its columns and their types, its bytes per row) and splits it
into ranges of `RANGE_BYTES` (Parquet: of row groups). Each range is one Ray task, which reads the lines that start
in it (from the first line start at or after its start to the first at or after its end) and parses them alone with
the first rows' columns and types, so that every block has one schema. Ray Data starts the next range's task once
its memory budget allows, which bounds what is in flight: through an 80 MB object store, a 121 MB file in 4 MiB
ranges peaked at 32 MiB and spilled nothing (16 MiB ranges spilled 147 MB). Ray Data's own readers read a file in
one task, which it does not hold back (the same file: 115 MB spilled); its JSONL reader takes no filesystem, and
none of them checks the encoding.

Lines end at b"\\n", which never falls inside a UTF-8 character; a quoted CSV value holding a line end would be cut
at it, so a large CSV must hold none (pyarrow's reader assumes the same at its block boundaries unless
`newlines_in_values` is set). Each range's bytes are checked for UTF-8, and an error names the file's line, as
`finetune.data.read_table`'s does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from albert_dist.errors import DataError
from albert_dist.storage import filesystem
from albert_dist.text_encoding import first_undecodable, not_utf8_error

#: bytes of a text file one read task parses (Parquet: of uncompressed row groups, one group at least)
RANGE_BYTES = 4 << 20
#: bytes of a text file's start the driver parses for its columns, their types and its bytes per row
HEAD_BYTES = 1 << 20
_SCAN_BYTES = 64 << 10


@dataclass(frozen=True)
class InputTable:
    """A file to read in ranges: its schema (every range is parsed to it), its row count where the file records
    one (Parquet), and its bytes per row (Parquet's uncompressed; the first rows' of a text file)."""

    location: str
    kind: str
    size: int
    schema: pa.Schema
    rows: int | None
    row_bytes: float

    def ranges(self) -> list[tuple[int, int]]:
        """[start, end) of each range: row groups of a Parquet file; bytes of a text file, whose range holds the
        lines that start in it (`read` finds them)."""
        if self.kind == "parquet":
            return _row_group_ranges(*filesystem(self.location))
        return [(start, min(start + RANGE_BYTES, self.size)) for start in range(0, self.size, RANGE_BYTES)]

    def read(self, start: int, end: int) -> Iterator[pa.Table]:
        """The rows of one range, with the file's schema."""
        fs, path = filesystem(self.location)
        try:
            if self.kind == "parquet":
                import pyarrow.parquet as pq

                with fs.open_input_file(path) as f:
                    yield pq.ParquetFile(f).read_row_groups(list(range(start, end)), use_threads=False)
                return
            with fs.open_input_file(path) as f:
                start, end = _line_start(f, start, self.size), _line_start(f, end, self.size)
                f.seek(start)
                data = f.read(end - start)
            undecodable = first_undecodable(data)
            if undecodable:
                raise _not_utf8(self.location, fs, path, start, data, undecodable)
            if data.strip():
                yield _parse(data, self.kind, self.schema, header=start == 0)
        except pa.ArrowInvalid as err:
            raise DataError(f"cannot read {self.location} as {self.kind}: {err}") from None

    def dataset(self, num_cpus: float):
        """The file as a Ray dataset of its rows in file order (with order preserved), a task per range; a local
        file is read on this node (another node of a cluster may not have it)."""
        import ray
        import ray.data

        fs, _ = filesystem(self.location)
        node = {"ray.io/node-id": ray.get_runtime_context().get_node_id()} if fs.type_name == "local" else None
        ranges = [{"start": start, "end": end} for start, end in self.ranges()]
        return ray.data.from_items(ranges, override_num_blocks=len(ranges)).map_batches(
            _read_ranges,
            fn_kwargs={"table": self},
            batch_size=1,
            batch_format="pyarrow",
            num_cpus=num_cpus,
            label_selector=node,
        )


def _read_ranges(ranges: pa.Table, table: InputTable) -> Iterator[pa.Table]:
    for item in ranges.to_pylist():
        yield from table.read(item["start"], item["end"])


def look(location: str, kind: str, size: int, text_columns: list[str]) -> InputTable:
    """Read the start of the file at `location` (Parquet: its footer) for the schema every range is read with:
    the types of its first rows, the text columns of a CSV or TSV as strings."""
    fs, path = filesystem(location)
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            with fs.open_input_file(path) as f:
                metadata = pq.ParquetFile(f).metadata
            return InputTable(
                location, kind, size, metadata.schema.to_arrow_schema(), metadata.num_rows, _row_bytes(metadata)
            )
        with fs.open_input_file(path) as f:
            head = f.read(HEAD_BYTES)
            while head.count(b"\n") < 2 and len(head) < size:  # a header and a row, however long
                head += f.read(HEAD_BYTES)
        if len(head) < size:
            head = head[: head.rfind(b"\n") + 1]
        undecodable = first_undecodable(head)
        if undecodable:
            raise not_utf8_error(location, head, undecodable)
        # a CSV column of digits in the first rows would be read as numbers, and a later word would fail the read;
        # JSON says what is a string itself
        strings = pa.schema([(name, pa.string()) for name in text_columns] if kind != "jsonl" else [])
        first = _parse(head, kind, strings, header=True, infer=True)
    except pa.ArrowInvalid as err:
        raise DataError(f"cannot read {location} as {kind}: {err}") from None
    if first.num_rows == 0:
        raise DataError(f"data file has no rows: {location}")
    # a column empty in the first rows is read as text: its type would refuse any later value
    schema = pa.schema(
        [field.with_type(pa.string()) if pa.types.is_null(field.type) else field for field in first.schema]
    )
    return InputTable(location, kind, size, schema, None, len(head) / first.num_rows)


def _parse(data: bytes, kind: str, schema: pa.Schema, header: bool, infer: bool = False) -> pa.Table:
    """CSV, TSV or JSONL bytes as a table: with `schema`'s columns and types, or (`infer`) with the types of
    `schema`'s columns and the others inferred."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    if kind == "jsonl":
        behaviour = "infer" if infer else "error"  # a field the first rows lack is refused, not dropped
        options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior=behaviour)
        return pajson.read_json(pa.BufferReader(data), pajson.ReadOptions(use_threads=False), options)
    return pacsv.read_csv(
        pa.BufferReader(data),
        pacsv.ReadOptions(use_threads=False, column_names=None if header else schema.names),
        pacsv.ParseOptions(delimiter="\t", quote_char=False) if kind == "tsv" else None,
        pacsv.ConvertOptions(column_types={field.name: field.type for field in schema}),
    )


def _line_start(f, position: int, size: int) -> int:
    """The first line start at or after `position` (`size` when there is none)."""
    if position <= 0 or position >= size:
        return min(max(position, 0), size)
    f.seek(position - 1)
    base = position - 1
    while chunk := f.read(_SCAN_BYTES):
        newline = chunk.find(b"\n")
        if newline >= 0:
            return base + newline + 1
        base += len(chunk)
    return size


def _not_utf8(location: str, fs, path: str, start: int, data: bytes, undecodable: str) -> DataError:
    """`read_table`'s error for an undecodable byte of the range at `start`: its line counted from the file's start
    (read again, on this rare path only), the encoding named from the file's start."""
    with fs.open_input_file(path) as f:
        head = f.read(1 << 16)
        f.seek(0)
        lines = sum(f.read(min(_SCAN_BYTES << 4, start - at)).count(b"\n") for at in range(0, start, _SCAN_BYTES << 4))
    line, byte = undecodable.removeprefix("line ").split(", ", 1)
    return not_utf8_error(location, head, f"line {lines + int(line)}, {byte}")


def _row_bytes(metadata) -> float:
    """A Parquet file's uncompressed bytes per row."""
    total = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    return max(1, total) / max(1, metadata.num_rows)


def _row_group_ranges(fs, path: str) -> list[tuple[int, int]]:
    """Consecutive row groups of about `RANGE_BYTES` uncompressed, one at least."""
    import pyarrow.parquet as pq

    with fs.open_input_file(path) as f:
        metadata = pq.ParquetFile(f).metadata
    ranges, start, size = [], 0, 0
    for group in range(metadata.num_row_groups):
        size += metadata.row_group(group).total_byte_size
        if size >= RANGE_BYTES or group == metadata.num_row_groups - 1:
            ranges.append((start, group + 1))
            start, size = group + 1, 0
    return ranges
