"""In-process inference with a sequence classifier: logits over encoded rows, dev/test metrics, throughput.

Used by the drivers (final dev/test metrics, teacher vs student), by prediction and by the benchmark, so that
all of them measure the same way.
"""

from __future__ import annotations

import time
from typing import Iterable

import numpy as np
import torch

from albert_dist.finetune import data, metrics
from albert_dist.train import precision as amp


@torch.no_grad()
def predict_logits(model: torch.nn.Module, batches: Iterable[dict[str, torch.Tensor]],
                   precision: str = "fp32") -> np.ndarray:
    """[N, num_labels] float32 logits, in batch order; the model is put in eval mode. `precision` as
    train.precision ("auto" resolves as in training)."""
    model.eval()
    device = next(model.parameters()).device
    precision = amp.resolve_precision(precision, device)
    outputs = []
    for batch in batches:
        with amp.autocast(precision, device):
            logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                           token_type_ids=batch["token_type_ids"].to(device)).logits
        outputs.append(logits.float().cpu().numpy())
    return np.concatenate(outputs) if outputs else np.zeros((0, model.config.num_labels), np.float32)


def evaluate(model: torch.nn.Module, encoded: data.EncodedSplit, *, task: str, batch_size: int = 64,
             pad_to_multiple_of: int = 8, precision: str = "fp32") -> dict[str, float]:
    """Task metrics of `model` on an encoded, labelled split."""
    logits = predict_logits(model, data.batches(encoded, batch_size, pad_to_multiple_of), precision)
    return metrics.task_metrics(task, logits, encoded.arrays["label"], model.config.num_labels)


@torch.no_grad()
def throughput(model: torch.nn.Module, batch: dict[str, torch.Tensor], precision: str = "fp32",
               repeats: int = 20, warmup: int = 3) -> float:
    """Sequences per second of forward passes over `batch` (the median of `repeats` timed passes)."""
    model.eval()
    device = next(model.parameters()).device
    precision = amp.resolve_precision(precision, device)
    inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids")}
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        with amp.autocast(precision, device):
            model(**inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return inputs["input_ids"].shape[0] / float(np.median(times))
