"""`albert-dist predict`: labels and probabilities (or regression scores) for every row of a table.

An input under `ACTOR_THRESHOLD` bytes is read whole and predicted in this process. A larger one is streamed: Ray
tasks read it in ranges (`predict_input`), a pool of actors predicts them, each loading the model and tokenizer
once, and the driver writes the blocks out in input order as they come, so neither the driver nor Ray's object
store ever holds the whole input. Ray is started, or joined, as every command
does (`cluster.ray_init.ensure_ray`: 127.0.0.1, a token made for the run). Both paths print a progress line (rows,
rows/s, share, ETA) at most every 10 s and once at the end.

Rows are predicted in chunks sorted by length (little padding) and written back in input order, every input column
as it was read, plus `predicted_label` and one `prob_<label>` column per class (`predicted_score` for regression);
texts are truncated at the `max_seq_length` the model was fine-tuned with (saved with it). The output (CSV, TSV,
JSONL or Parquet, by extension) is written to a temporary file beside the target, then renamed, so it appears whole
or not at all.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from albert_dist.console import ProgressLine, verbose
from albert_dist.data import batching
from albert_dist.errors import ConfigError, DataError, raised_in_a_task
from albert_dist.finetune import data, inference, predict_input, qa_task, token_task
from albert_dist.hub.download import local_dir
from albert_dist.model.checkpoint import load_config
from albert_dist.storage import filesystem, publish_file
from albert_dist.train.precision import resolve_precision

#: inputs of this many bytes or more are streamed through Ray's actor pool; smaller ones are read whole and predicted
#: here. A file's size costs one stat (a HEAD request in object storage), where its row count would cost reading it.
#: Streaming pays Ray's start and the actors' model loads, ~30 s more than in process for 100-200 rows on 2 loaded
#: cores, and then ran 2.3-2.5x the rows/s of one process there (benchmarks/README.md#bench_predict): below about
#: 1 MiB (3,000 lines of 350 bytes) that start is most of the run, above it the pool wins it back.
ACTOR_THRESHOLD = 1 << 20
#: the most bytes of rows one actor call takes
CHUNK_BYTES = 4 << 20
#: CPUs a read task asks for: reading and parsing is light next to inference
READ_CPUS = 0.25
DEVICES = ("auto", "cpu", "cuda")


class Predictor:
    """Model + tokenizer loaded once, on `device` (`local_device`; the CPU unless asked: a Ray worker given no GPU
    still sees its node's); maps a batch of rows (column → array) to the rows plus their prediction columns.

    The head saved in the model's config.json decides what is predicted: a sentence classifier (or regressor) labels
    and probabilities (a model fine-tuned with `data.long_text: windows` reads long texts as it was trained to, the
    mean of their windows' logits); a token classifier each text's `entities`; a reader (question answering) the
    `answer` to `text_column` (the question) in `text_pair_column` (the context). `backend="onnx"` runs an
    `albert-dist export` directory with onnxruntime instead of PyTorch (CPU)."""

    def __init__(
        self,
        model_dir: str | Path,
        text_column: str,
        text_pair_column: str | None,
        batch_size: int,
        precision: str = "auto",
        on_batch: Callable[[int], None] | None = None,
        device: str = "cpu",
        backend: str = "torch",
    ):
        from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

        model_dir = local_dir(model_dir)  # a hub id: its snapshot, which every file below is read from
        self.device = torch.device(local_device(device))
        self.model = load_model(model_dir, backend, self.device)
        self.head = head_of(self.model.config)
        if self.head == QUESTION_HEAD and not text_pair_column:
            raise ConfigError(f"{model_dir} answers questions: give the context column as --text-pair-column")
        self.tokenizer = load_tokenizer(model_dir)
        self.text_column, self.text_pair_column = text_column, text_pair_column
        self.batch_size, self.precision, self.on_batch = batch_size, precision, on_batch
        self.max_seq_length = min(inference.saved_max_seq_length(model_dir), self.model.config.max_position_embeddings)
        self.overlap = inference.saved_window_overlap(model_dir)

    def __call__(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = ["" if v is None else str(v) for v in rows[self.text_column]]
        pairs = ["" if v is None else str(v) for v in rows[self.text_pair_column]] if self.text_pair_column else None
        settings = {"batch_size": self.batch_size, "precision": self.precision, "on_batch": self.on_batch}
        overlap = self.max_seq_length // 4 if self.overlap is None else self.overlap
        if self.head == TOKEN_HEAD:
            found = token_task.text_entities(
                self.model, self.tokenizer, texts, self.max_seq_length, overlap, **settings
            )
            return {**rows, ENTITIES: np.asarray([json.dumps(e, ensure_ascii=False) for e in found], dtype=object)}
        if self.head == QUESTION_HEAD:
            answers = qa_task.answer_questions(
                self.model,
                self.tokenizer,
                texts,
                pairs,
                self.max_seq_length,
                overlap,
                batch_size=self.batch_size,
                precision=self.precision,
            )
            if self.on_batch:
                self.on_batch(len(texts))
            return {
                **rows,
                **{name: np.asarray([getattr(a, field) for a in answers]) for name, field in ANSWER.items()},
            }
        if self.overlap is not None and pairs is None:
            arrays = batching.encode_windows(self.tokenizer, texts, self.max_seq_length, self.overlap)
            logits = inference.split_logits(self.model, batching.EncodedSplit(arrays), **settings)
            return {**rows, **self.columns(batching.document_means(logits, arrays["document"]))}
        encoded = batching.EncodedSplit(batching.encode_texts(self.tokenizer, texts, pairs, self.max_seq_length))
        return {**rows, **self.columns(inference.split_logits(self.model, encoded, **settings))}

    def columns(self, logits: np.ndarray) -> dict[str, np.ndarray]:
        config = self.model.config
        if is_regression(config):
            return {"predicted_score": logits[:, 0]}
        shifted = np.exp(logits - logits.max(-1, keepdims=True))
        probabilities = shifted / shifted.sum(-1, keepdims=True)
        names = [config.id2label[i] for i in range(config.num_labels)]
        out = {"predicted_label": np.asarray(names, dtype=object)[probabilities.argmax(-1)]}
        out.update({f"prob_{name}": probabilities[:, i] for i, name in enumerate(names)})
        return out


TOKEN_HEAD, QUESTION_HEAD, SEQUENCE_HEAD = "AlbertForTokenClassification", "AlbertForQuestionAnswering", "sequence"
#: a token classifier's column: each text's entities as JSON, [{"type", "start", "end", "text", "score"}] with
#: character offsets (end excluded), in the layout of transformers' token-classification pipeline; tags read
#: strictly, as the entity metrics read them (`token_task.text_entities`)
ENTITIES = "entities"
#: a reader's columns, from its answers' fields: the answer's text, its character offsets in the context (end
#: excluded; -1 for none) and its score
ANSWER = {"answer": "text", "answer_start": "start", "answer_end": "end", "answer_score": "score"}
BACKENDS = ("torch", "onnx")


def head_of(config) -> str:
    """What a model predicts, from config.json's architectures: TOKEN_HEAD, QUESTION_HEAD or SEQUENCE_HEAD."""
    architecture = (config.architectures or [SEQUENCE_HEAD])[0]
    return architecture if architecture in (TOKEN_HEAD, QUESTION_HEAD) else SEQUENCE_HEAD


def load_model(model_dir: str | Path, backend: str, device: torch.device):
    """The model of `model_dir` for inference: the PyTorch head its config names, or with `backend="onnx"` the
    directory's `model.onnx` (an `albert-dist export`) in onnxruntime."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend}: use one of {', '.join(BACKENDS)}")
    if backend == "onnx":
        if device.type != "cpu":
            raise ConfigError("--backend onnx runs on the CPU: use --device cpu")
        from albert_dist.model.onnx_runtime import OnnxModel

        return OnnxModel(model_dir, intra_op_num_threads=torch.get_num_threads())
    from albert_dist.model import (
        AlbertForQuestionAnswering,
        AlbertForSequenceClassification,
        AlbertForTokenClassification,
    )

    heads = {TOKEN_HEAD: AlbertForTokenClassification, QUESTION_HEAD: AlbertForQuestionAnswering}
    return (
        heads.get(head_of(load_config(model_dir)), AlbertForSequenceClassification)
        .from_pretrained(model_dir)
        .to(device)
    )


def is_regression(config) -> bool:
    return config.num_labels == 1 or config.problem_type == "regression"


def output_columns(config) -> list[str]:
    """The columns prediction adds, in the order `Predictor` writes them."""
    head = head_of(config)
    if head == TOKEN_HEAD:
        return [ENTITIES]
    if head == QUESTION_HEAD:
        return list(ANSWER)
    if is_regression(config):
        return ["predicted_score"]
    return ["predicted_label"] + [f"prob_{config.id2label[i]}" for i in range(config.num_labels)]


def local_device(device: str) -> str:
    """`--device` for this process: "auto" is a GPU where torch sees one."""
    if device not in DEVICES:
        raise ConfigError(f"--device {device}: use one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this process sees no GPU (torch.cuda.is_available() is false)")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@dataclass(frozen=True)
class ActorPool:
    """How many actors predict, what each asks Ray for, and the device it predicts on."""

    size: int
    num_cpus: float
    num_gpus: float
    device: str


def actor_pool(device: str, num_actors: int | None, cluster: Mapping[str, float], nodes: int = 1) -> ActorPool:
    """The actors for `--device` and `--num-actors` on a Ray cluster of `nodes` nodes with `cluster` resources
    (`ray.cluster_resources()`).

    A fixed pool keeps its resources to the end, so one read task's CPUs (`READ_CPUS`) stay free on every node: a
    read with none left would wait for ever. GPU actors ("cuda", or "auto" where the cluster has a GPU) take a GPU
    and a CPU each (tokenization), one per GPU unless fewer are asked. CPU actors share the other CPUs: one per CPU
    by default (single-threaded, a small model's fastest use of a core); fewer asked get more threads each."""
    if device not in DEVICES:
        raise ConfigError(f"--device {device}: use one of {', '.join(DEVICES)}")
    if num_actors is not None and num_actors < 1:
        raise ConfigError(f"--num-actors {num_actors}: at least 1")
    cpus, gpus = cluster.get("CPU", 0.0), int(cluster.get("GPU", 0))
    free = cpus - READ_CPUS * max(1, nodes)
    if device == "cuda" and gpus == 0:
        raise ConfigError("--device cuda: the Ray cluster has no GPU")
    if device == "cuda" or (device == "auto" and gpus):
        size = num_actors or gpus
        if size > gpus:
            raise ConfigError(f"--num-actors {size}: each actor takes a GPU, and the Ray cluster has {gpus}")
        if size > free:
            raise ConfigError(f"--num-actors {size}: each GPU actor takes a CPU too, and the Ray cluster has {cpus:g}")
        return ActorPool(size, num_cpus=1, num_gpus=1, device="cuda")
    if free <= 0:
        raise ConfigError(f"the Ray cluster has {cpus:g} CPUs: none left for actors beside the read")
    size = num_actors or math.ceil(free)
    return ActorPool(size, num_cpus=free / size, num_gpus=0, device="cpu")


def run_predict(
    model_dir: str | Path,
    input_path: str | Path,
    output_path: str | Path,
    *,
    text_column: str = "text",
    text_pair_column: str | None = None,
    batch_size: int = 64,
    precision: str = "auto",
    device: str = "auto",
    num_actors: int | None = None,
    actor_threshold: int = ACTOR_THRESHOLD,
    backend: str = "torch",
) -> int:
    """Predict every row of `input_path` (a path or a URI) into `output_path`; returns the number of rows written.
    Inputs of `actor_threshold` bytes or more go to a Ray actor pool of `num_actors` (default: `actor_pool`'s)."""
    output_kind = data.file_format(output_path)
    location = str(input_path)
    device = "cpu" if backend == "onnx" and device == "auto" else device  # onnxruntime runs here on the CPU
    columns = TextColumns(text_column, text_pair_column, output_columns(load_config(model_dir)))
    predictor_args = (str(model_dir), text_column, text_pair_column, batch_size)
    size = _file_size(location)
    if size is None or size < actor_threshold:  # no file there (or none reachable): read_table's error says so
        table = data.read_table(location)
        columns.check(table.schema, location)
        on_device = local_device(device)
        resolve_precision(precision, torch.device(on_device))  # fp16 on a CPU is refused before the model loads
        progress = ProgressLine("predict", total=table.num_rows)
        predictor = Predictor(
            *predictor_args, precision=precision, on_batch=progress.update, device=on_device, backend=backend
        )
        blocks = (_with_predictions(predictor, chunk) for chunk in table.to_batches(_chunk_rows(batch_size)))
    else:
        blocks, progress = _predicted_by_actors(
            location, size, columns, predictor_args, precision, device, num_actors, backend
        )
    rows = 0

    def write(tmp: Path) -> None:
        nonlocal rows
        rows = _write_tables(blocks, tmp, output_kind)
        if rows == 0:
            raise DataError(f"data file has no rows: {location}")

    publish_file(output_path, write, error=DataError)
    progress.finish()
    print(f"predicted {rows} rows of {input_path} with {model_dir} → {output_path}")
    return rows


@dataclass(frozen=True)
class TextColumns:
    """The columns prediction reads, and those it adds."""

    text: str
    pair: str | None
    added: list[str]

    @property
    def read(self) -> list[str]:
        return [self.text] + ([self.pair] if self.pair else [])

    def check(self, schema: pa.Schema, location: str) -> None:
        """The input holds the text columns, none of the columns prediction writes, and no column twice."""
        repeated = sorted({name for name in schema.names if schema.names.count(name) > 1})
        if repeated:
            raise DataError(f"{location}: column {repeated[0]!r} appears more than once in the header")
        data.require_columns(schema.empty_table(), location, text_column=self.text, text_pair_column=self.pair)
        taken = [name for name in self.added if name in schema.names]
        if taken:
            raise DataError(f"{location}: its column {taken[0]!r} would be overwritten by the prediction; rename it")


def _chunk_rows(batch_size: int, row_bytes: float = 0) -> int:
    """Rows one Predictor call sorts by length and predicts: more rows, less padding; no more than `CHUNK_BYTES` of
    rows of `row_bytes` each."""
    rows = max(16 * batch_size, 1024)
    return max(1, min(rows, int(CHUNK_BYTES / row_bytes))) if row_bytes else rows


def _with_predictions(predictor: Predictor, rows: pa.RecordBatch | pa.Table) -> pa.Table:
    """`rows` with the predictor's columns added; the input columns pass through as read (types, nulls)."""
    inputs = [name for name in (predictor.text_column, predictor.text_pair_column) if name]
    texts = {name: rows.column(name).to_numpy(zero_copy_only=False) for name in inputs}
    table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
    for name, values in predictor(texts).items():
        if name not in texts:
            table = table.append_column(name, pa.array(values))
    return table


class _ActorPredictor:
    """A Ray Data actor: the Predictor over pyarrow batches."""

    def __init__(self, *args, **kwargs):
        self.predictor = Predictor(*args, **kwargs)

    def __call__(self, rows: pa.Table) -> pa.Table:
        return _with_predictions(self.predictor, rows)


def _file_size(location: str) -> int | None:
    """The size of the file at `location`; None where there is no file (or it cannot be reached)."""
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    try:
        info = fs.get_file_info(path)
    except OSError:
        return None
    return info.size if info.type == pafs.FileType.File else None


def _predicted_by_actors(
    location: str,
    size: int,
    columns: TextColumns,
    predictor_args: tuple,
    precision: str,
    device: str,
    num_actors: int | None,
    backend: str,
) -> tuple[Iterator[pa.Table], ProgressLine]:
    """The input streamed through Ray Data and a pool of predicting actors: the output blocks in input order, and
    the progress line they advance."""
    import ray
    import ray.data

    from albert_dist.cluster.ray_init import ensure_ray

    table = predict_input.look(location, data.file_format(location), size, columns.read)
    columns.check(table.schema, location)
    ensure_ray()
    nodes = sum(1 for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU"))
    pool = actor_pool(device, num_actors, ray.cluster_resources(), nodes)
    resolve_precision(precision, torch.device(pool.device))
    chunk_rows = _chunk_rows(predictor_args[3], table.row_bytes)
    dataset = table.dataset(READ_CPUS)
    dataset.context.execution_options.preserve_order = True  # blocks out in input order
    dataset.context.enable_progress_bars = verbose()  # the progress line says it in one line
    # max_restarts=0: Ray Data puts an actor's arguments in the object store, and Ray cannot restart such actors
    # reliably (ray-project/ray#53727; it says so at error level for each one). A lost actor fails the prediction,
    # which is published atomically and runs again whole. Ray Data 2.60 has no named parameter for it: its
    # deprecation warning of the remote argument is not shown.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        predicted = dataset.map_batches(
            _ActorPredictor,
            fn_constructor_args=predictor_args,
            fn_constructor_kwargs={"precision": precision, "device": pool.device, "backend": backend},
            compute=ray.data.ActorPoolStrategy(size=pool.size),
            num_cpus=pool.num_cpus,
            num_gpus=pool.num_gpus,
            batch_size=chunk_rows,
            batch_format="pyarrow",
            max_restarts=0,
        )
    progress = ProgressLine("predict", total=table.rows)
    estimated = size / table.row_bytes

    def blocks() -> Iterator[pa.Table]:
        try:
            for block in predicted.iter_batches(batch_size=None, batch_format="pyarrow"):
                done = None if table.rows else min(0.99, (progress.count + block.num_rows) / estimated)
                progress.update(block.num_rows, done)
                yield block
        except Exception as err:
            ours = raised_in_a_task(err)
            if ours is None:
                raise
            raise ours from None

    print(f"predict: {location} streamed to {pool.size} actor(s) on {pool.device}", flush=True)
    return blocks(), progress


def _write_tables(tables: Iterator[pa.Table], path: Path, kind: str) -> int:
    """Write `tables` one after the other into one file of `kind` as they come; returns the rows written."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if kind not in ("parquet", "jsonl", "csv", "tsv"):
        raise DataError(f"{path}: cannot write {kind}")
    rows, schema, writer = 0, None, None
    with open(path, "wb") as sink:
        for table in tables:
            if schema is None:
                schema = table.schema
                if kind == "parquet":
                    writer = pq.ParquetWriter(sink, schema)
                elif kind in ("csv", "tsv"):
                    options = pacsv.WriteOptions(delimiter="\t" if kind == "tsv" else ",")
                    writer = pacsv.CSVWriter(sink, schema, write_options=options)
            table = table if table.schema == schema else table.cast(schema)
            if writer is None:
                sink.write(table.to_pandas().to_json(orient="records", lines=True, force_ascii=False).encode())
            else:
                writer.write_table(table)
            rows += table.num_rows
        if writer is not None:
            writer.close()
    return rows
