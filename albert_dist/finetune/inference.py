"""In-process inference with a sequence classifier: logits over encoded rows, dev/test metrics, throughput, and
the truncation length saved with a fine-tuned model.

Used by the drivers (final dev/test metrics, teacher vs student), by prediction and by the benchmark, so that
all of them measure the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import torch

from albert_dist.data import batching
from albert_dist.finetune import metrics
from albert_dist.train import precision as amp

TOKENIZER_CONFIG = "tokenizer_config.json"
FALLBACK_MAX_SEQ_LENGTH = 512  # models that recorded none (google's, most on the Hub)
WINDOW_OVERLAP = "albert_dist_window_overlap"


def save_reading(model_dir: str | Path, max_seq_length: int, window_overlap: int | None = None) -> None:
    """Record how the model reads text in its tokenizer_config.json (call after saving the tokenizer): the length it
    was fine-tuned at as `model_max_length`, where transformers' tokenizers read their truncation length too, and,
    for a model that reads long texts as windows, their overlap (`WINDOW_OVERLAP`)."""
    path = Path(model_dir) / TOKENIZER_CONFIG
    config = json.loads(path.read_text()) if path.is_file() else {}
    config["model_max_length"] = max_seq_length
    if window_overlap is not None:
        config[WINDOW_OVERLAP] = window_overlap
    path.write_text(json.dumps(config, indent=2) + "\n")


def saved_window_overlap(model_dir: str | Path) -> int | None:
    """The overlap of the windows the model reads long texts in; None: it truncates them."""
    try:
        value = json.loads((Path(model_dir) / TOKENIZER_CONFIG).read_text()).get(WINDOW_OVERLAP)
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    return int(value) if isinstance(value, int) and value >= 0 else None


def saved_max_seq_length(model_dir: str | Path) -> int:
    """The length to truncate inputs at: the one saved with the model, else FALLBACK_MAX_SEQ_LENGTH (also in place
    of transformers' "no limit" placeholder, a huge integer)."""
    path = Path(model_dir) / TOKENIZER_CONFIG
    try:
        value = json.loads(path.read_text()).get("model_max_length")
    except (OSError, json.JSONDecodeError, AttributeError):
        value = None
    return int(value) if isinstance(value, (int, float)) and 0 < value < 1e6 else FALLBACK_MAX_SEQ_LENGTH


def eval_device(model) -> torch.device:
    """Where `model` runs, in eval mode: a PyTorch module's device; the CPU for an export run by onnxruntime
    (`model.onnx_runtime.OnnxModel`, called as the PyTorch heads are)."""
    if isinstance(model, torch.nn.Module):
        model.eval()
        return next(model.parameters()).device
    return torch.device("cpu")


@torch.no_grad()
def predict_logits(
    model: torch.nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    precision: str = "fp32",
    on_batch: Callable[[int], None] | None = None,
) -> np.ndarray:
    """[N, num_labels] float32 logits, in batch order; the model is put in eval mode. `precision` as
    train.precision ("auto" resolves as in training); `on_batch` is told the rows of each batch once its logits
    are back on the CPU."""
    device = eval_device(model)
    precision = amp.resolve_precision(precision, device)
    outputs = []
    for batch in batches:
        with amp.autocast(precision, device):
            logits = model(
                input_ids=batch["input_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
                token_type_ids=batch["token_type_ids"].to(device),
            ).logits
        outputs.append(logits.float().cpu().numpy())
        if on_batch:
            on_batch(len(outputs[-1]))
    return np.concatenate(outputs) if outputs else np.zeros((0, model.config.num_labels), np.float32)


def split_logits(
    model: torch.nn.Module,
    encoded: batching.EncodedSplit,
    batch_size: int = 64,
    pad_to_multiple_of: int = 8,
    precision: str = "fp32",
    on_batch: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Logits of every row of `encoded`, in row order, computed over batches of rows sorted by length."""
    order = batching.length_sorted_order(encoded.arrays["length"])
    batches = batching.batches(encoded, batch_size, pad_to_multiple_of, order)
    logits = predict_logits(model, batches, precision, on_batch)
    restored = np.empty_like(logits)
    restored[order] = logits
    return restored


def evaluate(
    model: torch.nn.Module,
    encoded: batching.EncodedSplit,
    *,
    task: str,
    batch_size: int = 64,
    pad_to_multiple_of: int = 8,
    precision: str = "fp32",
) -> dict[str, float]:
    """Task metrics of `model` on an encoded, labelled split."""
    logits, labels = split_logits(model, encoded, batch_size, pad_to_multiple_of, precision), encoded.arrays["label"]
    if "document" in encoded.arrays:  # texts read as windows: each text's prediction is its windows' mean
        logits = batching.document_means(logits, encoded.arrays["document"])
        labels = batching.document_means(labels.astype(np.float64), encoded.arrays["document"])
        labels = labels if task == "regression" else labels.round().astype(np.int64)
    return metrics.task_metrics(task, logits, labels, model.config.num_labels)


@torch.no_grad()
def throughputs(
    models: Mapping[str, torch.nn.Module],
    batch: dict[str, torch.Tensor],
    precision: str = "fp32",
    repeats: int = 20,
    warmup: int = 3,
) -> dict[str, float]:
    """Sequences per second of each model's forward passes over `batch` (the median of `repeats` timed passes).

    The models take turns, one pass each per round, so that whatever else loads the machine meanwhile slows them
    alike: timed one after the other, a busy spell during one model's passes decided their ratio."""
    first = next(iter(models.values()))
    device = next(first.parameters()).device
    precision = amp.resolve_precision(precision, device)
    inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids")}
    times: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        model.eval()
    for i in range(warmup + repeats):
        for name, model in models.items():
            start = time.perf_counter()
            with amp.autocast(precision, device):
                model(**inputs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: inputs["input_ids"].shape[0] / float(np.median(t)) for name, t in times.items()}
