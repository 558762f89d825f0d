"""`export --dev`: the exported model's task metrics beside PyTorch fp32's on the same dev rows, read, encoded and
scored as fine-tuning does (its readers, the length saved with the model, its metrics), and logged to the model's
MLflow run when one is recorded beside it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from albert_dist.data import batching
from albert_dist.errors import ConfigError, TrackingError
from albert_dist.redaction import redact_url

SEQUENCE_CLASSIFIER = "AlbertForSequenceClassification"


@dataclass(frozen=True)
class DevSet:
    """A labelled file and its columns, as fine-tuning's `data:` section names them."""

    path: str
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"


@dataclass
class EncodedDev:
    task: str  # classification | regression
    encoded: batching.EncodedSplit
    source: str


def load_dev(dev: DevSet, model_dir: str | Path, architecture: str, config, tokenizer) -> EncodedDev:
    """The dev rows as fine-tuning encodes them, read before anything is exported (a bad file fails fast)."""
    from albert_dist.finetune import data, inference, predict
    from albert_dist.finetune.config import TaskDataSection

    if architecture != SEQUENCE_CLASSIFIER:
        raise ConfigError(
            f"--dev scores sequence classification and regression models; {model_dir} holds {architecture}"
        )
    task = "regression" if predict.is_regression(config) else "classification"
    section = TaskDataSection(
        text_column=dev.text_column, text_pair_column=dev.text_pair_column, label_column=dev.label_column
    )
    split = data.read_split(dev.path, section, dev.label_column)
    labels = data.label_ids(split, dev.label_column, task, config.label2id)
    length = min(inference.saved_max_seq_length(model_dir), config.max_position_embeddings)
    return EncodedDev(task, data.encode_split(split, tokenizer, length, labels), dev.path)


def dev_metrics(dev: EncodedDev, torch_model, onnx_model, precision: str, batch_size: int = 64) -> dict:
    """{"rows", "pytorch_fp32": metrics, "onnx_<precision>": metrics}: both models over the same length-sorted
    batches of the dev rows."""
    from albert_dist.finetune import inference, metrics

    labels, num_labels = dev.encoded.arrays["label"], torch_model.config.num_labels
    expected = inference.split_logits(torch_model, dev.encoded, batch_size, precision="fp32")
    order = batching.length_sorted_order(dev.encoded.arrays["length"])
    got = np.concatenate(
        [
            onnx_model(**{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}).logits.numpy()
            for batch in batching.batches(dev.encoded, batch_size, 8, order)
        ]
    )
    restored = np.empty_like(got)
    restored[order] = got
    return {
        "file": dev.source,
        "rows": len(dev.encoded),
        "task": dev.task,
        "pytorch_fp32": metrics.task_metrics(dev.task, expected, labels, num_labels),
        f"onnx_{precision}": metrics.task_metrics(dev.task, restored, labels, num_labels),
    }


def log_to_source_run(model_dir: str | Path, measured: dict, tracking_uri: str | None) -> dict:
    """Log `measured`'s metrics as `export_<model>_dev_<metric>` to the MLflow run that produced `model_dir`; returns
    what happened, for export.json. The store: `tracking_uri`, else $MLFLOW_TRACKING_URI, else the SQLite file a
    run with the default store keeps beside its run directory."""
    from albert_dist.finetune.job import source_run_id
    from albert_dist.tracking import run as tracking

    run_id = source_run_id(model_dir)
    if run_id is None:
        return {"logged": False, "reason": f"no MLflow run is recorded beside {model_dir}"}
    default_store = Path(model_dir).resolve().parent.parent / "mlflow.db"
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri and default_store.is_file():
        uri = f"sqlite:///{default_store}"
    if not uri:
        return {"run_id": run_id, "logged": False, "reason": "no MLflow store known: give --tracking-uri"}
    values = {
        f"export_{model}_dev_{name}": value
        for model, scores in measured.items()
        if isinstance(scores, dict)
        for name, value in scores.items()
    }
    outcome = {"run_id": run_id, "tracking_uri": redact_url(uri), "metrics": sorted(values)}
    try:
        tracking.JobRun(uri, run_id).log_metrics(values, step=0)
    except TrackingError as err:
        return {**outcome, "logged": False, "reason": str(err)}
    return {**outcome, "logged": True}
