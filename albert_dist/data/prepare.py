"""`albert-dist data prepare`: corpus → Parquet shards of SOP instances, a manifest and the tokenizer.

    read files (Ray Data) → documents → [actor pool] split, tokenize, instances → driver writes shards

The driver writes the shards from the ordered stream, numbering instances as they come (`instance_id`, dense
per split), so the same corpus, config and seed give byte-identical shards however Ray partitions the work.
Everything is built in a staging directory next to the output and renamed into place only on success.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from albert_dist.data.config import DataJobConfig
from albert_dist.data.instances import InstanceSpec
from albert_dist.data.loading import FORMAT_VERSION, MANIFEST, prepared_location
from albert_dist.data.masking import MaskingCollator
from albert_dist.data.process import (
    INSTANCE_SCHEMA,
    STATIC_MASK_SCHEMA,
    THROUGHPUT_COUNTS,
    DocumentProcessor,
    ProcessSettings,
    document_sentences,
    summarize_counts,
)
from albert_dist.data.ranges import FileRange, auto_range_bytes, plan_ranges, read_documents
from albert_dist.data.readers import resolve_inputs
from albert_dist.errors import DataError, disk_full_errors, raised_in_a_task
from albert_dist.jobs.registry import Command
from albert_dist.storage import (
    check_replaceable,
    filesystem,
    is_uri,
    publishing_dir,
    resolve_location,
    resolve_path,
    sha256_file,
    upload_dir,
)

_DOCS_PER_BATCH = 64
_READ_CPUS = 0.25  # reading is light; leave the CPUs to the tokenizer actors
_ROW_GROUP_ROWS = 8192
#: the summary's figures of how fast it ran, which differ between two preparations of the same corpus
TIMINGS = ("seconds", "tokens_per_second", "instances_per_second")


def run_prepare(cfg: DataJobConfig) -> int:
    """CLI entry point: prepare with progress bars, print the summary."""
    summary = prepare_dataset(cfg, progress_bars=True)
    print(format_summary(summary))
    return 0


def prepare_dataset(
    cfg: DataJobConfig, *, progress_bars: bool = False, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Prepare the dataset `cfg` describes; returns the summary (also stored in the manifest)."""
    from albert_dist.cluster.ray_init import ensure_ray

    user_dict = _read_user_dict(cfg.data.user_dict)
    ensure_ray()
    started = time.perf_counter()
    location = prepared_location(cfg)
    files = resolve_inputs(cfg.data.inputs)
    ranges = _ranges(cfg, files)
    log(f"data: {len(files)} input file(s) in {len(ranges)} range(s) → {location}")
    with _staging(location) as stage, _execution_context(progress_bars):
        tokenizer = _tokenizer(cfg, ranges, stage / "tokenizer", log)
        tally = Tally.create()
        actors = _actor_pool(cfg, len(ranges))
        instances = _instances(cfg, ranges, tokenizer, tally, user_dict, actors)
        splits = _write_shards(instances, stage, cfg.data.rows_per_shard, cfg.masking.static, log)
        counts = Counter(tally.total())
        counts.update(
            train_instances=splits["train"]["rows"],
            eval_instances=splits["eval"]["rows"],
            instances=splits["train"]["rows"] + splits["eval"]["rows"],
        )
        counts.update(ranges=len(ranges), tokenizer_actors=actors[0])
        summary = summarize_counts(counts)
        if not summary["instances"]:
            raise DataError(f"no instances: the corpus ({len(files)} file(s)) holds no document with two tokens")
        elapsed = time.perf_counter() - started
        summary |= {
            "seconds": round(elapsed, 2),
            "tokens_per_second": round(summary["tokens"] / elapsed, 1),
            "instances_per_second": round(summary["instances"] / elapsed, 1),
        }
        _write_manifest(stage, cfg, tokenizer, splits, summary, files)
    log(f"data: wrote {summary['instances']:,} instances to {location}")
    return summary


class Tally:
    """Counters summed across Ray tasks and actors by a small actor; picklable, so stages can carry it."""

    def __init__(self, actor):
        self._actor = actor

    @classmethod
    def create(cls) -> Tally:
        import ray

        @ray.remote(num_cpus=0)
        class _Counts:
            def __init__(self):
                self.counts = Counter()

            def add(self, counts):
                self.counts.update(counts)

            def total(self):
                return dict(self.counts)

        return cls(_Counts.remote())

    def __call__(self, counts: Counter) -> None:
        import ray

        if counts:
            ray.get(self._actor.add.remote(dict(counts)))

    def total(self) -> dict[str, int]:
        import ray

        return ray.get(self._actor.total.remote())


def _ranges(cfg: DataJobConfig, files: list[str]) -> list[FileRange]:
    """The files cut into ranges read by separate tasks (`data.range_bytes`, by default a few per cluster CPU)."""
    import ray

    d = cfg.data
    range_bytes = d.range_bytes or auto_range_bytes(files, ray.cluster_resources().get("CPU", 1.0))
    return plan_ranges(files, d.format, d.text_field, range_bytes, num_cpus=_READ_CPUS)


def _instances(
    cfg: DataJobConfig,
    ranges: list[FileRange],
    tokenizer,
    tally: Tally,
    user_dict: str | None,
    actor_pool: tuple[int, float],
):
    import ray

    d = cfg.data
    settings = ProcessSettings(
        spec=InstanceSpec(d.max_seq_length, d.short_seq_prob, tokenizer.cls_id, tokenizer.sep_id),
        language=d.language,
        max_sentence_chars=d.max_sentence_chars,
        dupe_factor=d.dupe_factor,
        eval_fraction=d.eval_fraction,
        seed=d.seed,
        word_segmenter=d.word_segmenter,
        user_dict=user_dict,
    )
    collator = MaskingCollator.from_tokenizer(tokenizer, cfg.masking) if cfg.masking.static else None
    documents = read_documents(ranges, d.text_field, tally, num_cpus=_READ_CPUS)
    actors, cpus_each = actor_pool
    # max_restarts=0: the tokenizer makes the actors' arguments big enough to live in the object store, and Ray
    # cannot restart such actors reliably (ray-project/ray#53727; it says so at error level for each one). A lost
    # actor fails the preparation, which is published atomically and runs again whole. Ray Data 2.60 deprecates
    # passing it as a remote argument but has no named parameter for it yet: its warning is not shown.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        return documents.map_batches(
            DocumentProcessor,
            fn_constructor_kwargs={"tokenizer": tokenizer, "settings": settings, "collator": collator, "tally": tally},
            compute=ray.data.ActorPoolStrategy(size=actors),
            batch_size=_DOCS_PER_BATCH,
            num_cpus=cpus_each,
            max_restarts=0,
        )


def _actor_pool(cfg: DataJobConfig, ranges: int) -> tuple[int, float]:
    """How many tokenizer actors and the CPUs each asks for: `data.tokenizer_actors`, by default the cluster's
    CPUs less the reads' share but no more than the ranges (each range is a block; an actor without one would only
    cost its start-up)."""
    import ray

    cpus, reserve = ray.cluster_resources().get("CPU", 1.0), _read_reserve()
    actors = cfg.data.tokenizer_actors or max(1, min(ranges, math.ceil(cpus - reserve)))
    return actors, min(1.0, max(0.1, (cpus - reserve) / actors))


def _read_reserve() -> float:
    """The CPUs the tokenizer actors leave to the read tasks: one read's worth on every node with CPUs. Reserved
    once for the whole cluster, the actors spread over the nodes would leave each a fraction too small for any
    read, and the preparation would wait for ever (on two 1-CPU nodes it did)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    return _READ_CPUS * max(1, len(nodes))


def _read_user_dict(path: str | None) -> str | None:
    """The jieba user dictionary's text, read on the driver so that actors on any node get it."""
    if not path:
        return None
    fs, location = filesystem(resolve_location(path))
    try:
        with fs.open_input_stream(location) as f:
            return f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read data.user_dict {path}: {err}") from None


def _tokenizer(cfg: DataJobConfig, ranges: list[FileRange], out_dir: Path, log: Callable[[str], None]):
    """The configured tokenizer, or one trained on the corpus's sentences; saved into `out_dir`."""
    from albert_dist.hub.download import hub_id
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
    from albert_dist.tokenizer.training import train_sentencepiece, train_wordpiece

    t = cfg.tokenizer
    if t.path:
        local = resolve_path(t.path)
        tokenizer = load_tokenizer(t.path if hub_id(t.path) and not local.exists() else local)
        if tokenizer.kind != t.kind:
            raise DataError(f"tokenizer.path {t.path} holds a {tokenizer.kind} tokenizer, not kind={t.kind}")
    else:
        with tempfile.TemporaryDirectory(prefix="albert-tok-") as tmp:
            sample = Path(tmp) / "sentences.txt"
            lines = _write_sentence_sample(cfg, ranges, sample, limit=4 * t.input_sentence_size)
            log(f"data: training a {t.vocab_size}-token {t.kind} tokenizer on {lines:,} sentences")
            if t.kind == "wordpiece":
                train_wordpiece(
                    [sample],
                    out_dir,
                    t.vocab_size,
                    input_sentence_size=t.input_sentence_size,
                    seed=cfg.data.seed,
                    progress=log,
                )
            else:
                train_sentencepiece(
                    [sample],
                    out_dir,
                    t.vocab_size,
                    character_coverage=t.character_coverage,
                    model_type=t.model_type,
                    input_sentence_size=t.input_sentence_size,
                    seed=cfg.data.seed,
                    progress=log,
                )
        tokenizer = load_tokenizer(out_dir)
    tokenizer.save(out_dir)
    return tokenizer


def _write_sentence_sample(cfg: DataJobConfig, ranges: list[FileRange], path: Path, limit: int) -> int:
    """The corpus's first `limit` sentences, one per line (the trainer reservoir-samples from them)."""
    d = cfg.data

    def sentences(batch: dict) -> dict:
        out: list[str] = []
        for text, presplit in zip(batch["text"], batch["presplit"]):
            out.extend(document_sentences(str(text), bool(presplit), d.language, d.max_sentence_chars, Counter()))
        return {"sentence": out}

    documents = read_documents(ranges, d.text_field, num_cpus=_READ_CPUS)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        for batch in documents.map_batches(sentences, batch_size=_DOCS_PER_BATCH).iter_batches(
            batch_size=None, batch_format="numpy"
        ):
            for sentence in batch["sentence"]:
                f.write(str(sentence) + "\n")
                written += 1
                if written >= limit:
                    return written
    return written


class _ShardWriter:
    """Parquet shards of `rows_per_shard` rows, `instance_id` numbered in arrival order, in row groups of
    `_ROW_GROUP_ROWS` rows whatever the sizes of the batches that arrive, so the shards' bytes do not depend on how
    the corpus was cut into ranges."""

    def __init__(self, directory: Path, rows_per_shard: int, schema: pa.Schema):
        self.directory, self.rows_per_shard = directory, rows_per_shard
        self.schema = pa.schema([("instance_id", pa.int64()), *schema])
        self.shards: list[dict[str, Any]] = []
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._in_shard = 0
        self._pending: list[pa.Table] = []
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, table: pa.Table) -> None:
        while table.num_rows:
            if self._writer is None:
                name = f"part-{len(self.shards):05d}.parquet"
                self._writer = pq.ParquetWriter(self.directory / name, self.schema, compression="zstd")
                self.shards.append({"path": f"{self.directory.name}/{name}", "rows": 0})
            take = min(table.num_rows, self.rows_per_shard - self._in_shard)
            part = table.slice(0, take)
            ids = pa.array(range(self.rows, self.rows + take), pa.int64())
            self._pending.append(pa.Table.from_arrays([ids, *part.columns], schema=self.schema))
            self._write_row_groups(whole_only=True)
            self.rows += take
            self._in_shard += take
            self.shards[-1]["rows"] += take
            table = table.slice(take)
            if self._in_shard == self.rows_per_shard:
                self.close()

    def close(self) -> None:
        """Close the open shard and record its sha256 (pretraining verifies the shards against it)."""
        if self._writer is not None:
            self._write_row_groups(whole_only=False)
            self._writer.close()
            self._writer, self._in_shard = None, 0
            self.shards[-1]["sha256"] = sha256_file(self.directory.parent / self.shards[-1]["path"])

    def _write_row_groups(self, whole_only: bool) -> None:
        pending = pa.concat_tables(self._pending).combine_chunks() if self._pending else None
        while pending is not None and pending.num_rows and (pending.num_rows >= _ROW_GROUP_ROWS or not whole_only):
            group = pending.slice(0, _ROW_GROUP_ROWS)
            self._writer.write_table(group, row_group_size=group.num_rows)
            pending = pending.slice(group.num_rows)
        self._pending = [pending] if pending is not None and pending.num_rows else []


def _write_shards(
    instances, stage: Path, rows_per_shard: int, static: bool, log: Callable[[str], None] = print
) -> dict[str, dict[str, Any]]:
    import pyarrow.compute as pc

    from albert_dist.console import ProgressLine

    progress = ProgressLine("data", unit="instances", print_fn=log)

    schema = pa.unify_schemas([INSTANCE_SCHEMA, STATIC_MASK_SCHEMA]) if static else INSTANCE_SCHEMA
    writers = {name: _ShardWriter(stage / name, rows_per_shard, schema) for name in ("train", "eval")}
    try:
        for batch in instances.iter_batches(batch_size=None, batch_format="pyarrow"):
            is_eval = batch.column("is_eval")
            columns = batch.select(schema.names)
            writers["train"].write(columns.filter(pc.invert(is_eval)))
            writers["eval"].write(columns.filter(is_eval))
            progress.update(batch.num_rows)
    finally:
        for writer in writers.values():
            writer.close()
    return {name: {"rows": w.rows, "shards": w.shards} for name, w in writers.items()}


def _write_manifest(stage: Path, cfg: DataJobConfig, tokenizer, splits: dict, summary: dict, files: list[str]) -> None:
    vocab_file = next(p for p in (stage / "tokenizer" / n for n in ("spiece.model", "vocab.txt")) if p.exists())
    manifest = {
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "inputs": files,
        "config": cfg.model_dump(),
        "max_seq_length": cfg.data.max_seq_length,
        "static_masking": cfg.masking.static,
        "tokenizer": {
            "dir": "tokenizer",
            "file": vocab_file.name,
            "sha256": sha256_file(vocab_file),
            "vocab_size": tokenizer.vocab_size,
            "pad_id": tokenizer.pad_id,
            "unk_id": tokenizer.unk_id,
            "cls_id": tokenizer.cls_id,
            "sep_id": tokenizer.sep_id,
            "mask_id": tokenizer.mask_id,
            "special_ids": sorted(tokenizer.special_ids),
        },
        "splits": splits,
        "summary": summary,
    }
    (stage / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _staging(location: str):
    """A local staging directory, published to `location` on success (replacing what was there), else removed.

    Local outputs are staged next to the target and swapped in (`storage.publishing_dir`); URIs are staged locally
    and uploaded (`storage.upload_dir`, the manifest last: a dataset is only read through its manifest).
    """
    with disk_full_errors(f"the prepared data for {location}", DataError):
        if not is_uri(location):
            with publishing_dir(location, marker=MANIFEST, error=DataError) as stage:
                yield stage
            return
        check_replaceable(location, MANIFEST, DataError)  # before the work, as a local output is
        stage = Path(tempfile.mkdtemp(prefix="albert-data-"))
        try:
            yield stage
            upload_dir(stage, location, last=MANIFEST, error=DataError)
        finally:
            shutil.rmtree(stage, ignore_errors=True)


@contextlib.contextmanager
def _execution_context(progress_bars: bool):
    """Ray Data keeps block order (so the output is deterministic), raises a UDF's own exception, and shows
    progress bars only when asked. A DataError raised inside a Ray task, in any stage (the tokenizer's sentence
    sample as well as the instances), leaves as itself: its one-line message, not Ray's layers of tracebacks."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    saved = (ctx.execution_options.preserve_order, ctx.raise_original_map_exception, ctx.enable_progress_bars)
    ctx.execution_options.preserve_order, ctx.raise_original_map_exception = True, True
    ctx.enable_progress_bars = progress_bars
    try:
        yield
    except Exception as err:  # noqa: BLE001 - any stage's task error, unwrapped when it carries ours
        cause = raised_in_a_task(err)
        if cause is not None and cause is not err:
            raise cause from None
        raise
    finally:
        (ctx.execution_options.preserve_order, ctx.raise_original_map_exception, ctx.enable_progress_bars) = saved


#: the summary's headline figures, as `format_summary` words them; its other counters are printed when not zero
_HEADLINE = (*THROUGHPUT_COUNTS, *TIMINGS)


def format_summary(summary: dict[str, Any]) -> str:
    """Two lines: what went in and came out, then the counters of what was cut, skipped or replaced (those not
    zero). The whole summary is in the manifest and the MLflow run."""
    s = {k: summary.get(k, 0) for k in _HEADLINE}
    lines = [
        f"data: {s['files']:,} file(s), {s['bytes']:,} bytes → {s['documents']:,} documents "
        f"({s['eval_documents']:,} held out), {s['sentences']:,} sentences, {s['tokens']:,} tokens → "
        f"{s['instances']:,} instances ({s['train_instances']:,} train, {s['eval_instances']:,} eval) in "
        f"{s['seconds']:g} s ({s['tokens_per_second']:,.0f} tokens/s)"
    ]
    counters = [
        f"{k} {v:,}" if isinstance(v, (int, float)) else f"{k} {v}"
        for k, v in summary.items()
        if k not in _HEADLINE and v
    ]
    if counters:
        lines.append("data: " + ", ".join(counters))
    return "\n".join(lines)


PREPARE_DATA = Command(run_prepare)
