"""The prepared dataset's format and where a job finds it, and reading it back: manifest, tokenizer
(checksum-verified), Ray Datasets. `data prepare` (albert_dist/data/prepare.py) writes what this module reads.

Per-rank batching for training lives in `albert_dist.train.feed` (exact resume needs a fixed batch order); it
reads the training splits by row number (`SplitRows`), the held-out split through Ray Data.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs

from albert_dist.data.masking import MaskingCollator
from albert_dist.errors import DataError, TokenizerError
from albert_dist.storage import (
    filesystem,
    is_uri,
    join_location,
    publish_text,
    resolve_location,
    resolve_path,
    sha256_stream,
)

MANIFEST = "manifest.json"
FORMAT_VERSION = 2  # 2: text reaches the tokenizer unnormalized (format 1 applied NFKC first)

#: the largest share of the cluster's object store that `data.cache: auto` fills with a prepared dataset
CACHE_SHARE = 0.2


@contextlib.contextmanager
def parquet_reader_v1() -> Iterator[None]:
    """Ray Data's first Parquet reader for the `read_parquet` calls inside.

    Ray 2.60's default (v2) lists files on a pool of 32 footer-reading actors, started anew each time the read
    runs: every epoch and evaluation of a streamed split. For the few shards a prepared dataset has, that is seconds
    to minutes of worker start-up on a small machine (see benchmarks/bench_feed.py); v1 reads the footers inline.
    """
    from ray.data import DataContext

    context = DataContext.get_current()
    saved, context.use_datasource_v2 = context.use_datasource_v2, False
    try:
        yield
    finally:
        context.use_datasource_v2 = saved


@dataclass
class PreparedData:
    """A prepared dataset: its manifest, tokenizer and the `train` / `eval` splits as Ray Datasets."""

    location: str
    manifest: dict[str, Any]
    tokenizer: Any
    _fs: pafs.FileSystem = field(repr=False)
    _root: str = field(repr=False)

    @cached_property
    def train(self):
        return self.dataset("train")

    @cached_property
    def eval(self):
        """None when no document was held out (`eval_fraction` 0 or a tiny corpus)."""
        return self.dataset("eval") if self.rows("eval") else None

    def dataset(self, split: str):
        """`split` as a Ray Dataset whose rows come in instance-id order, however many tasks read it."""
        import ray.data

        with parquet_reader_v1():
            dataset = ray.data.read_parquet(self.shard_paths(split), filesystem=self._fs)
        dataset.context.execution_options.preserve_order = True
        return dataset

    def held_out(self, in_memory: bool) -> dict[str, Any]:
        """What training reads through Ray Data: the "eval" split when there is one, read once into Ray's object
        store when `in_memory`. The training splits are read by row number on the workers (`SplitRows`)."""
        if self.eval is None:
            return {}
        return {"eval": self.eval.materialize() if in_memory else self.eval}

    def fits_in_memory(self, cache: str = "auto") -> bool:
        """Whether to keep the held-out split in Ray's object store for training: `cache` "memory" or "stream", or
        "auto": when it takes at most `CACHE_SHARE` of the cluster's object store.

        Training evaluates over and over: from memory an evaluation starts within a second, a streamed split
        re-reads its Parquet shards each time (10-15 s with two workers on a 2-core machine, which dominated small
        runs). Streaming holds no memory. The training splits are read by row number (`SplitRows`) either way.
        """
        import ray

        if cache != "auto":
            return cache == "memory"
        capacity = ray.cluster_resources().get("object_store_memory", 0)
        return (self.in_memory_bytes("eval") if self.rows("eval") else 0) <= CACHE_SHARE * capacity

    def in_memory_bytes(self, split: str) -> int:
        """`split`'s estimated size once read: its rows times the Arrow bytes per row of the first shard's first
        row group (read to measure it: a few MB at most)."""
        import pyarrow.parquet as pq

        with self._fs.open_input_file(self.shard_paths(split)[0]) as f:
            sample = pq.ParquetFile(f).read_row_group(0)
        return int(sample.nbytes / max(1, sample.num_rows) * self.rows(split))

    def rows(self, split: str) -> int:
        return int(self.manifest["splits"][split]["rows"])

    def shard_paths(self, split: str) -> list[str]:
        """Paths inside the dataset's filesystem, in instance-id order."""
        return [f"{self._root}/{shard['path']}" for shard in self.manifest["splits"][split]["shards"]]

    def verify_shards(self, record: Path | None = None) -> int:
        """Check every shard against the sha256 the manifest records; returns how many shards were read to check.
        A dataset prepared before shards were checksummed has none to check.

        With `record` (a file of the run that trains on the data), a shard whose size and modification time are
        what they were when it last checked out is not read again: a relaunch does not hash a big corpus, or
        download one from object storage, every time. The record is rewritten after the shards it did read."""
        known = _read_record(record)
        checked = 0
        for split in ("train", "eval"):
            for shard, path in zip(self.manifest["splits"][split]["shards"], self.shard_paths(split)):
                if "sha256" not in shard:
                    continue
                info = self._fs.get_file_info(path)
                if info.type == pafs.FileType.NotFound:
                    raise DataError(f"{self.location}: shard {shard['path']} is missing")
                stamp = {"sha256": shard["sha256"], "size": info.size, "mtime_ns": info.mtime_ns}
                if known.get(path) == stamp:
                    continue
                with self._fs.open_input_stream(path) as f:
                    digest = sha256_stream(f)
                if digest != shard["sha256"]:
                    raise DataError(
                        f"{self.location}: shard {shard['path']} does not match its sha256 in the "
                        f"manifest (changed or corrupted since it was prepared): prepare the data again"
                    )
                known[path] = stamp
                checked += 1
        if record is not None and checked:
            publish_text(record, json.dumps(known, indent=1))
        return checked

    def digest(self) -> str:
        """What identifies the data a run trains on: the shards' and the tokenizer's checksums and the sequence
        length (not the manifest's creation time: data prepared again byte for byte is the same data)."""
        identity = {
            "splits": self.manifest["splits"],
            "tokenizer": self.manifest["tokenizer"]["sha256"],
            "max_seq_length": self.manifest["max_seq_length"],
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    def collator(self, masking=None) -> MaskingCollator:
        """The masking collator for this data (special ids and vocabulary from the manifest); `masking`, a
        `MaskingSection`, overrides the settings the data was prepared with."""
        return MaskingCollator.from_manifest(self.manifest, masking)


def _read_record(record: Path | None) -> dict[str, Any]:
    """The shards `verify_shards` checked before (none without a record, or with an unreadable one)."""
    if record is None:
        return {}
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError):
        return {}


def prepared_location(cfg, output: str | None = None) -> str:
    """Where the job `cfg` (data preparation or pretraining) keeps its prepared data: `output` (default
    `data.output`) under `run.output_dir` (a URI one too); absolute paths and URIs as given."""
    output = output or cfg.data.output
    if is_uri(output) or not is_uri(cfg.run.output_dir):
        return resolve_location(output, base=None if is_uri(output) else resolve_path(cfg.run.output_dir))
    if Path(output).expanduser().is_absolute():
        return str(Path(output).expanduser())
    return str(join_location(cfg.run.output_dir, *Path(output).parts))


class SplitRows:
    """One split of a prepared dataset by stored row number (instance-id order), read straight from its Parquet
    shards: `read` opens only the shards, and decodes only the row groups, that hold the rows asked for. The
    training feed (`train.feed.slot_batches`) reads through it, so a resumed run seeks to its position."""

    def __init__(self, location: str | Path, split: str = "train"):
        self.fs, root = filesystem(str(location))
        shards = read_manifest(self.fs, root, str(location))["splits"][split]["shards"]
        self.paths = [f"{root}/{shard['path']}" for shard in shards]
        self.starts = np.concatenate([[0], np.cumsum([int(shard["rows"]) for shard in shards])])
        self.rows = int(self.starts[-1])
        self._files: dict[int, tuple[Any, np.ndarray]] = {}  # shard → its reader and its row groups' first rows

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Stored rows [start, stop) as columns: numbers, or object arrays of 1-D arrays for list columns (what Ray
        Data's numpy batches hold)."""
        import pyarrow as pa

        pieces = []
        first_shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        for shard in range(first_shard, int(np.searchsorted(self.starts, stop, side="left"))):
            parquet, group_starts = self._file(shard)
            offset = self.starts[shard]
            lo, hi = max(start, offset) - offset, min(stop, self.starts[shard + 1]) - offset
            groups = range(
                int(np.searchsorted(group_starts, lo, side="right")) - 1,
                int(np.searchsorted(group_starts, hi, side="left")),
            )
            table = parquet.read_row_groups(list(groups))
            pieces.append(table.slice(lo - group_starts[groups.start], hi - lo))
        table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}

    def _file(self, shard: int):
        import pyarrow.parquet as pq

        if shard not in self._files:
            parquet = pq.ParquetFile(self.fs.open_input_file(self.paths[shard]))
            sizes = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
            self._files[shard] = parquet, np.concatenate([[0], np.cumsum(sizes)])
        return self._files[shard]


def read_manifest(fs: pafs.FileSystem, root: str, location: str) -> dict[str, Any]:
    """The manifest of the prepared dataset at `location` (`root` inside `fs`), refused when missing or corrupt."""
    try:
        with fs.open_input_stream(f"{root}/{MANIFEST}") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise DataError(
            f"no prepared dataset at {location}: {MANIFEST} is missing (run `albert-dist data prepare` first)"
        ) from None
    except json.JSONDecodeError as err:
        raise DataError(f"{location}/{MANIFEST} is corrupt: {err}") from None
    return manifest


def load_prepared(location: str | Path) -> PreparedData:
    """Open a prepared dataset (a local directory or a URI) written by `prepare_dataset`."""
    location = str(location)
    fs, root = filesystem(location)
    manifest = read_manifest(fs, root, location)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"{location} has dataset format {manifest.get('format_version')}, this version reads "
            f"{FORMAT_VERSION}: prepare it again"
        )
    return PreparedData(location, manifest, _load_tokenizer(fs, root, location, manifest["tokenizer"]), fs, root)


def _load_tokenizer(fs: pafs.FileSystem, root: str, location: str, info: dict[str, Any]):
    """The dataset's tokenizer, refused when its file is not the one the instances were tokenized with."""
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    path = f"{root}/{info['dir']}/{info['file']}"
    try:
        with fs.open_input_stream(path) as f:
            data = f.read()
    except FileNotFoundError:
        raise DataError(f"{location}: tokenizer file {info['dir']}/{info['file']} is missing") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != info["sha256"]:
        raise DataError(
            f"{location}: tokenizer {info['dir']}/{info['file']} does not match the manifest "
            f"(sha256 {digest[:12]}…, expected {info['sha256'][:12]}…): the data was tokenized "
            f"with another tokenizer"
        )
    try:
        if not is_uri(location):
            return load_tokenizer(path)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / info["file"]).write_bytes(data)
            return load_tokenizer(Path(tmp) / info["file"])
    except TokenizerError as err:
        raise DataError(f"{location}: {err}") from None
