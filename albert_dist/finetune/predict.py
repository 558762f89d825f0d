"""`albert-dist predict`: labels and probabilities (or regression scores) for every row of a table.

Small inputs run in this process; above `actor_threshold` rows the work goes to Ray Data `map_batches` with a
pool of actors, each loading the model and tokenizer once. A progress line (rows, rows/s, share, ETA) is printed
as batches finish, at most every 10 s, and once at the end. Rows are predicted in batches sorted by length (little
padding) and written back in input order. The output (CSV, JSONL or Parquet, by extension) holds every input
column unchanged plus `predicted_label` and one `prob_<label>` column per class (`predicted_score` for
regression); texts are truncated at the `max_seq_length` the model was fine-tuned with (saved with it). It is
written to a temporary file beside the target, then renamed, so it appears whole or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from albert_dist.console import ProgressLine
from albert_dist.data import batching
from albert_dist.errors import DataError
from albert_dist.finetune import data, inference
from albert_dist.model.checkpoint import load_config
from albert_dist.storage import publish_file

ACTOR_THRESHOLD = 20_000


class Predictor:
    """Model + tokenizer loaded once; maps a batch of rows (column → array) to the rows plus their prediction
    columns."""

    def __init__(
        self,
        model_dir: str | Path,
        text_column: str,
        text_pair_column: str | None,
        batch_size: int,
        precision: str = "auto",
        on_batch: Callable[[int], None] | None = None,
    ):
        from albert_dist.model import AlbertForSequenceClassification
        from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

        self.model = AlbertForSequenceClassification.from_pretrained(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        self.text_column, self.text_pair_column = text_column, text_pair_column
        self.batch_size, self.precision, self.on_batch = batch_size, precision, on_batch
        self.max_seq_length = min(inference.saved_max_seq_length(model_dir), self.model.config.max_position_embeddings)

    def __call__(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = ["" if v is None else str(v) for v in rows[self.text_column]]
        pairs = ["" if v is None else str(v) for v in rows[self.text_pair_column]] if self.text_pair_column else None
        encoded = batching.EncodedSplit(batching.encode_texts(self.tokenizer, texts, pairs, self.max_seq_length))
        logits = inference.split_logits(
            self.model, encoded, self.batch_size, precision=self.precision, on_batch=self.on_batch
        )
        return {**rows, **self.columns(logits)}

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


def is_regression(config) -> bool:
    return config.num_labels == 1 or config.problem_type == "regression"


def output_columns(config) -> list[str]:
    """The columns prediction adds, in the order `Predictor.columns` writes them."""
    if is_regression(config):
        return ["predicted_score"]
    return ["predicted_label"] + [f"prob_{config.id2label[i]}" for i in range(config.num_labels)]


def run_predict(
    model_dir: str | Path,
    input_path: str | Path,
    output_path: str | Path,
    *,
    text_column: str = "text",
    text_pair_column: str | None = None,
    batch_size: int = 64,
    precision: str = "auto",
    actor_threshold: int = ACTOR_THRESHOLD,
    num_actors: int = 2,
) -> int:
    """Predict every row of `input_path` into `output_path`; returns the number of rows written."""
    output_kind = data.file_format(output_path)
    table = data.read_table(input_path)
    data.require_columns(table, input_path, text_column=text_column, text_pair_column=text_pair_column)
    args = (str(model_dir), text_column, text_pair_column, batch_size)
    taken = [name for name in output_columns(load_config(model_dir)) if name in table.column_names]
    if taken:
        raise DataError(f"{input_path}: its column {taken[0]!r} would be overwritten by the prediction; rename it")
    progress = ProgressLine("predict", total=table.num_rows)
    if table.num_rows < actor_threshold:
        result = pa.table(Predictor(*args, precision=precision, on_batch=progress.update)(_numpy_columns(table)))
    else:
        result = _predict_with_ray(table, args, precision, num_actors, batch_size, progress)
    progress.finish()
    _write_atomically(result, Path(output_path), output_kind)
    print(f"predicted {result.num_rows} rows of {input_path} with {model_dir} → {output_path}")
    return result.num_rows


def _numpy_columns(table: pa.Table) -> dict[str, np.ndarray]:
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}


def _predict_with_ray(
    table: pa.Table, args: tuple, precision: str, num_actors: int, batch_size: int, progress: ProgressLine
) -> pa.Table:
    import ray.data

    rows = ray.data.from_arrow(table)
    rows.context.execution_options.preserve_order = True  # output rows in input order
    dataset = rows.map_batches(
        Predictor,
        fn_constructor_args=args,
        fn_constructor_kwargs={"precision": precision},
        compute=ray.data.ActorPoolStrategy(size=num_actors),
        batch_size=max(16 * batch_size, 1024),
        batch_format="numpy",
    )  # each actor call sorts its rows by length: more rows, less padding
    parts = []
    for part in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):  # as the actors finish them
        parts.append(part)
        progress.update(part.num_rows)
    return pa.concat_tables(parts)


def _write_atomically(table: pa.Table, path: Path, kind: str) -> None:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    def write(tmp: Path) -> None:
        if kind == "parquet":
            pq.write_table(table, tmp)
        elif kind == "jsonl":
            table.to_pandas().to_json(tmp, orient="records", lines=True, force_ascii=False)
        elif kind in ("csv", "tsv"):
            pacsv.write_csv(table, tmp, pacsv.WriteOptions(delimiter="\t" if kind == "tsv" else ","))
        else:
            raise DataError(f"{path}: cannot write {kind}")

    publish_file(path, write, error=DataError)
