"""Labelled text tables (CSV, TSV, JSONL, Parquet) → label ids → fixed-width token arrays → Ray datasets.

Files are read with pyarrow. Tokenization happens once, in the driver, into arrays padded to `max_seq_length`
with each row's length kept; batches are cut back to the longest row (rounded up to a multiple of 8) when
collated, and rows of similar length are batched together (`length_grouped_order` for training,
`length_sorted_order` for evaluation and prediction), so little compute goes to padding. Every problem with the
input is a `DataError` naming file and column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from albert_dist.data.batching import EncodedSplit, encode_texts, encode_windows
from albert_dist.errors import ConfigError, DataError
from albert_dist.finetune import wsc
from albert_dist.text_encoding import first_undecodable, not_utf8_error

_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


def file_format(path: str | Path, fmt: str = "auto") -> str:
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in _FORMATS:
        raise DataError(
            f"{path}: cannot tell the format from {suffix or 'no extension'!r}; "
            f"use one of {', '.join(sorted(_FORMATS))} or set data.format"
        )
    return _FORMATS[suffix]


def read_table(location: str | Path, fmt: str = "auto") -> pa.Table:
    """The whole file (a local path or a URI: s3://, gs://, file://) as a table; a missing, empty or unparsable
    file is a DataError naming it."""
    import pyarrow.csv as pacsv
    import pyarrow.fs as pafs
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    from albert_dist.storage import filesystem

    location = str(location)
    fs, path = filesystem(location)
    kind = file_format(path, fmt)
    try:
        info = fs.get_file_info(path)
    except OSError as err:  # an unreachable server or refused credentials
        raise DataError(f"cannot read {location}: {err}") from None
    if info.type != pafs.FileType.File:
        raise DataError(f"data file not found: {location}")
    if info.size == 0:
        raise DataError(f"data file is empty: {location}")
    try:
        if kind == "parquet":
            table = pq.read_table(path, filesystem=fs)
        else:
            with fs.open_input_stream(path) as stream:
                raw = stream.read()
            # pyarrow would read a CSV column in another encoding as bytes, and JSON with its characters replaced
            undecodable = first_undecodable(raw)
            if undecodable:
                raise not_utf8_error(location, raw, undecodable)
            if kind == "jsonl":
                table = pajson.read_json(pa.BufferReader(raw))
            else:
                parse = pacsv.ParseOptions(delimiter="\t", quote_char=False) if kind == "tsv" else None
                table = pacsv.read_csv(pa.BufferReader(raw), parse_options=parse)
    except (pa.ArrowInvalid, OSError) as err:
        raise DataError(f"cannot read {location} as {kind}: {err}") from None
    if table.num_rows == 0:
        raise DataError(f"data file has no rows: {location}")
    repeated = sorted({name for name in table.column_names if table.column_names.count(name) > 1})
    if repeated:
        raise DataError(f"{location}: column {repeated[0]!r} appears more than once in the header")
    return table


def require_columns(table: pa.Table, path: str | Path, **roles: str | None) -> None:
    """Each `role=column` must exist; the error names the file, the role and the columns there are."""
    for role, column in roles.items():
        if column is not None and column not in table.column_names:
            raise DataError(
                f"{path}: no column {column!r} ({role}); the file has {', '.join(map(repr, table.column_names))}"
            )


def text_values(table: pa.Table, column: str) -> list[str]:
    """The column as texts; a list of strings (CSL's keywords) is joined with spaces, as CLUE's baselines do."""
    return [
        "" if v is None else " ".join(map(str, v)) if isinstance(v, list) else str(v)
        for v in table.column(column).to_pylist()
    ]


@dataclass
class Split:
    """Raw rows of one split: texts, optional pair texts, raw label values; `source` names where they came from."""

    source: str
    texts: list[str]
    pairs: list[str] | None
    labels: list[Any]

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, indices: np.ndarray, source: str) -> Split:
        pick = lambda values: [values[i] for i in indices]  # noqa: E731
        return Split(source, pick(self.texts), pick(self.pairs) if self.pairs is not None else None, pick(self.labels))


def read_split(path: str, data, label_column: str | None) -> Split:
    """Read one labelled (or, with `label_column=None`, unlabelled) file of a `TaskDataSection`; CLUEWSC2020's rows
    (`data.format: cluewsc`) are read as their texts with the spans marked (`wsc.marked_texts`)."""
    table = read_table(path, "jsonl" if data.format == "cluewsc" else data.format)
    require_columns(
        table, path, text_column=data.text_column, text_pair_column=data.text_pair_column, label_column=label_column
    )
    labels = table.column(label_column).to_pylist() if label_column else [None] * table.num_rows
    dropped = set(getattr(data, "drop_labels", ()))
    if label_column and dropped:
        kept = [i for i, v in enumerate(labels) if str(v) not in dropped]
        table, labels = table.take(kept), [labels[i] for i in kept]
        if not kept:
            raise DataError(f"{path}: every row has a label in data.drop_labels ({', '.join(sorted(dropped))})")
    if label_column and any(v is None for v in labels):
        row = labels.index(None)
        raise DataError(f"{path}: column {label_column!r} is empty in row {row + 1}")
    pairs = text_values(table, data.text_pair_column) if data.text_pair_column else None
    if data.format == "cluewsc":
        texts = wsc.marked_texts(table, str(path), data.text_column)
    else:
        texts = text_values(table, data.text_column)
    return Split(str(path), texts, pairs, labels)


def load_splits(data, read: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """train, dev and (when given or held out) test, each read by `read(path)` (default: `read_split`'s labelled
    rows); missing dev/test are seeded random shares of train."""
    if not data.train:
        raise ConfigError("data.train is not set: give the training file")
    read = read or (lambda path: read_split(path, data, data.label_column))
    splits = {"train": read(data.train)}
    for name in ("dev", "test"):
        if getattr(data, name):
            splits[name] = read(getattr(data, name))
    held_out = {
        name: fraction
        for name, fraction in (("test", data.test_fraction), ("dev", data.dev_fraction))
        if name not in splits and fraction > 0
    }
    if held_out:
        train = splits["train"]
        order = np.random.default_rng(data.split_seed).permutation(len(train))
        start = 0
        for name, fraction in held_out.items():
            count = max(1, round(len(order) * fraction))
            splits[name] = train.take(order[start : start + count], f"{train.source} ({name} share)")
            start += count
        if start >= len(order):
            raise DataError(
                f"{train.source}: {len(order)} rows leave nothing to train on after holding out {', '.join(held_out)}"
            )
        splits["train"] = train.take(np.sort(order[start:]), train.source)
    return splits


def label_names(train: Split, given: list[str] | None) -> list[str]:
    """Label names in id order: `given`, else the distinct train labels sorted (numerically when all numbers)."""
    if given:
        return list(given)
    values = sorted({str(v) for v in train.labels})
    try:
        return sorted(values, key=float)
    except ValueError:
        return values


def label_ids(split: Split, column: str, task: str, label2id: dict[str, int]) -> np.ndarray:
    """Class ids (classification) or float targets (regression); an unknown or non-numeric label names its row."""
    if task == "regression":
        try:
            return np.asarray([float(v) for v in split.labels], dtype=np.float32)
        except (TypeError, ValueError):
            bad = next(v for v in split.labels if not _is_number(v))
            raise DataError(f"{split.source}: column {column!r} holds {bad!r}, not a number (regression)") from None
    ids = np.empty(len(split.labels), dtype=np.int64)
    for row, value in enumerate(split.labels):
        if str(value) not in label2id:
            raise DataError(
                f"{split.source}: unknown label {value!r} in column {column!r} (row {row + 1}); "
                f"known labels: {', '.join(label2id)}"
            )
        ids[row] = label2id[str(value)]
    return ids


def _is_number(value: Any) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


def encode_split(
    split: Split, tokenizer, max_seq_length: int, labels: np.ndarray, window_overlap: int | None = None
) -> EncodedSplit:
    """Token arrays plus `label` and `row` (the row's index, which keys per-row evaluation tables); with a
    `window_overlap`, long texts as windows (`encode_windows`), each labelled with its text's label, and `document`
    (the text's row) keys the tables instead."""
    if window_overlap is None:
        arrays = encode_texts(tokenizer, split.texts, split.pairs, max_seq_length)
    else:
        arrays = encode_windows(tokenizer, split.texts, max_seq_length, window_overlap)
        labels = labels[arrays["document"]]
    arrays.update(label=labels, row=np.arange(len(labels), dtype=np.int64))
    return EncodedSplit(arrays)


def to_ray_dataset(encoded: EncodedSplit):
    """A Ray dataset of the arrays (2-D ones as tensor columns)."""
    import ray.data
    from ray.data.extensions import ArrowTensorArray

    columns = {k: ArrowTensorArray.from_numpy(v) if v.ndim > 1 else pa.array(v) for k, v in encoded.arrays.items()}
    return ray.data.from_arrow(pa.table(columns))
