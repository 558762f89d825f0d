"""Reading a prepared dataset back: manifest, tokenizer (checksum-verified), Ray Datasets, per-rank batches.

Exact resume needs every rank to see the same batches in the same order each time. Ray Train's
`streaming_split` does not promise that, so `iter_rank_batches` reads the rank's rows (`instance_id % world ==
rank`) straight from the shards, in an order fixed by (seed, epoch), and can skip to a batch index.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from albert_dist.config import is_uri
from albert_dist.data.masking import MaskingCollator
from albert_dist.data.prepare import FORMAT_VERSION, MANIFEST
from albert_dist.data.readers import filesystem
from albert_dist.errors import DataError, TokenizerError


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
        import ray.data

        return ray.data.read_parquet(self.shard_paths(split), filesystem=self._fs)

    def rows(self, split: str) -> int:
        return int(self.manifest["splits"][split]["rows"])

    def shard_paths(self, split: str) -> list[str]:
        """Paths inside the dataset's filesystem, in instance-id order."""
        return [f"{self._root}/{shard['path']}" for shard in self.manifest["splits"][split]["shards"]]

    def collator(self, masking=None) -> MaskingCollator:
        """The masking collator for this data (special ids and vocabulary from the manifest); `masking`, a
        `MaskingSection`, overrides the settings the data was prepared with."""
        return MaskingCollator.from_manifest(self.manifest, masking)


def load_prepared(location: str | Path) -> PreparedData:
    """Open a prepared dataset (a local directory or a URI) written by `prepare_dataset`."""
    location = str(location)
    fs, root = filesystem(location)
    try:
        with fs.open_input_stream(f"{root}/{MANIFEST}") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise DataError(f"no prepared dataset at {location}: {MANIFEST} is missing "
                        f"(run `albert-dist data prepare` first)") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{location}/{MANIFEST} is corrupt: {err}") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{location} has dataset format {manifest.get('format_version')}, this version reads "
                        f"{FORMAT_VERSION}: prepare it again")
    return PreparedData(location, manifest, _load_tokenizer(fs, root, location, manifest["tokenizer"]), fs, root)


def _load_tokenizer(fs: pafs.FileSystem, root: str, location: str, info: dict[str, Any]):
    """The dataset's tokenizer, refused when its file is not the one the instances were tokenized with."""
    import hashlib

    from albert_dist.tokenizer import load_tokenizer

    path = f"{root}/{info['dir']}/{info['file']}"
    try:
        with fs.open_input_stream(path) as f:
            data = f.read()
    except FileNotFoundError:
        raise DataError(f"{location}: tokenizer file {info['dir']}/{info['file']} is missing") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != info["sha256"]:
        raise DataError(f"{location}: tokenizer {info['dir']}/{info['file']} does not match the manifest "
                        f"(sha256 {digest[:12]}…, expected {info['sha256'][:12]}…): the data was tokenized "
                        f"with another tokenizer")
    try:
        if not is_uri(location):
            return load_tokenizer(path)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / info["file"]).write_bytes(data)
            return load_tokenizer(Path(tmp) / info["file"])
    except TokenizerError as err:
        raise DataError(f"{location}: {err}") from None


def rank_shard(dataset, rank: int, world_size: int):
    """The rows of a Ray Dataset with `instance_id % world_size == rank`: disjoint across ranks, covering all."""
    def keep(batch: pa.Table) -> pa.Table:
        return batch.filter(pa.array(batch["instance_id"].to_numpy() % world_size == rank))

    return dataset.map_batches(keep, batch_format="pyarrow")


def batches_per_rank(data: PreparedData, split: str, world_size: int, batch_size: int) -> int:
    """Every rank yields this many full batches (the smallest rank's share decides), so ranks stay in step."""
    return (data.rows(split) // world_size) // batch_size


def iter_rank_batches(data: PreparedData, split: str = "train", *, rank: int, world_size: int, batch_size: int,
                      epoch: int = 0, seed: int = 0, start_batch: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """This rank's batches for `epoch`, as `iter_batches(batch_format="numpy")` would give them (object arrays
    of per-row arrays), identical on every call with the same arguments.

    Shards are visited in an order drawn from (seed, epoch) and each shard's rows shuffled by (seed, epoch,
    shard); batches before `start_batch` are skipped (resume). Every rank yields `batches_per_rank` batches.
    """
    total = batches_per_rank(data, split, world_size, batch_size)
    paths = data.shard_paths(split)
    order = np.random.default_rng([seed, epoch]).permutation(len(paths))
    pending: list[pa.Table] = []
    pending_rows = produced = 0
    for shard in order:
        table = pq.read_table(paths[shard], filesystem=data._fs)
        ids = table.column("instance_id").to_numpy()
        rows = np.flatnonzero(ids % world_size == rank)
        rows = np.random.default_rng([seed, epoch, int(shard)]).permutation(rows)
        pending.append(table.take(rows))
        pending_rows += len(rows)
        while pending_rows >= batch_size and produced < total:
            merged = pa.concat_tables(pending)
            batch, rest = merged.slice(0, batch_size), merged.slice(batch_size)
            pending, pending_rows = [rest], rest.num_rows
            if produced >= start_batch:
                yield {name: _numpy_column(batch.column(name)) for name in batch.column_names}
            produced += 1
        if produced >= total:
            return


def _numpy_column(column: pa.ChunkedArray) -> np.ndarray:
    """A list column as an object array of numpy views, a scalar column as a numpy array."""
    array = column.combine_chunks()
    if not pa.types.is_list(array.type):
        return array.to_numpy(zero_copy_only=False)
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    out = np.empty(len(array), object)
    for i, row in enumerate(np.split(values, offsets[1:-1] - offsets[0])):
        out[i] = row  # element-wise: equal-length rows must not become one 2-D block
    return out
