"""The fine-tuning `TrainingTask`: sequence classification or regression on top of a pretrained ALBERT.

Evaluation statistics are additive so the loop can sum them over batches and ranks: a confusion matrix for
classification, and for regression two tables indexed by dev row (prediction, target) from which Pearson and
Spearman are computed once everything is summed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from albert_dist.data import batching
from albert_dist.finetune import inference, lr_groups, metrics
from albert_dist.model import AlbertForSequenceClassification
from albert_dist.storage import fetch_dir
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.train.feed import rank_slice
from albert_dist.train.loop import TaskSpec, TrainingTask


class EarlyStopping:
    """True once `metric` has not improved for `patience` consecutive evaluations (never when patience is None).
    Its best value and count travel in the checkpoints (`state`/`restore`), so a resumed run goes on counting."""

    def __init__(self, metric: str, mode: str, patience: int | None):
        self.metric, self.mode, self.patience = metric, mode, patience
        self.best: float | None = None
        self.evaluations_without_improvement = 0

    def __call__(self, eval_metrics: dict[str, float]) -> bool:
        value = eval_metrics.get(self.metric)
        if self.patience is None or value is None or not math.isfinite(value):
            return False
        improved = self.best is None or (value > self.best if self.mode == "max" else value < self.best)
        if improved:
            self.best, self.evaluations_without_improvement = value, 0
        else:
            self.evaluations_without_improvement += 1
        return self.evaluations_without_improvement >= self.patience

    def state(self) -> dict[str, float]:
        return {
            "best": math.nan if self.best is None else self.best,
            "evaluations_without_improvement": self.evaluations_without_improvement,
        }

    def restore(self, state: dict[str, float]) -> None:
        self.best = None if math.isnan(state["best"]) else state["best"]
        self.evaluations_without_improvement = int(state["evaluations_without_improvement"])


@dataclass(frozen=True)
class ClassificationSpec(TaskSpec):
    """A fine-tuning job's task (classification, pairs or regression), as `finetune.job.classification_spec`
    builds it; datasets "train" and "dev" come whole to every worker."""

    init_from: str
    tokenizer_dir: str
    task: str  # "classification" or "regression"
    num_labels: int
    model_overrides: dict[str, Any]
    metric: str  # picks the best model (and early stopping's)
    patience: int | None
    layer_lr_decay: float
    lr_scales: dict[str, float]
    batch_size: int
    eval_batch_size: int
    grad_accum_steps: int
    micro_batches_per_epoch: int
    eval_rows: int
    seed: int
    pad_to_multiple_of: int | None
    group_by_length: bool
    max_seq_length: int
    window_overlap: int | None = None  # long texts read as windows sharing this many pieces (saved with the model)

    def build(self, rank: int, world_size: int, dataset: Callable[[str], Any]) -> SequenceClassificationTask:
        return SequenceClassificationTask(self, rank, world_size, dataset)


class SequenceClassificationTask(TrainingTask):
    eval_columns = ("row", "document")  # columns only evaluation reads (the keys of its tables)

    def __init__(self, spec: ClassificationSpec, rank: int, world_size: int, dataset: Callable[[str], Any]):
        self.spec, self.rank, self.world_size, self.dataset = spec, rank, world_size, dataset
        self.task, self.num_labels = spec.task, spec.num_labels
        self.best_metric = f"eval_{spec.metric}"
        self.best_mode = "min" if spec.metric == "loss" else "max"
        self.tokenizer = load_tokenizer(fetch_dir(spec.tokenizer_dir))  # a URI downloaded on this worker's machine
        self.stopper = EarlyStopping(self.best_metric, self.best_mode, spec.patience)
        self._cache: dict[str, dict[str, np.ndarray]] = {}

    # ------------------------------------------------------------------------------------------------ model
    def build_model(self) -> torch.nn.Module:
        return AlbertForSequenceClassification.from_pretrained(
            fetch_dir(self.spec.init_from), **self.spec.model_overrides
        )

    def parameter_groups(self, model, weight_decay):
        return lr_groups.albert_parameter_groups(
            model, self.num_hidden_groups(model), weight_decay, self.spec.layer_lr_decay, self.spec.lr_scales
        )

    def num_hidden_groups(self, model) -> int:
        return model.config.num_hidden_groups

    def flops_per_token(self, model, phase=0) -> float:
        return model.flops_per_token(self.spec.max_seq_length)

    def save_model(self, model, directory: Path) -> None:
        model.save_pretrained(directory)
        self.tokenizer.save(directory)
        inference.save_reading(directory, self.spec.max_seq_length, self.spec.window_overlap)

    # ------------------------------------------------------------------------------------------------- loss
    def loss(self, model, batch):
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            labels=batch["label"],
        )
        return out.loss, self.statistics(out.logits, out.loss, batch)

    def statistics(self, logits: torch.Tensor, loss: torch.Tensor, batch) -> dict[str, torch.Tensor]:
        n = batch["label"].shape[0]
        stats = {"loss_sum": loss.detach().float() * n, "count": float(n)}
        logits = logits.detach().float()
        labels = batch["label"]
        if "document" in batch:  # evaluation of texts read as windows: a text's prediction is its windows' mean
            stats.update(self.document_tables(logits, labels, batch["document"].long()))
        elif self.task == "classification":
            K = self.num_labels
            flat = labels.long() * K + logits.argmax(-1)
            # a scatter into K × K counts: bincount would read the largest index back to size its output
            confusion = torch.zeros(K * K, device=logits.device)
            stats["confusion"] = confusion.scatter_add_(0, flat, torch.ones_like(logits[:, 0]))
        elif "row" in batch:  # evaluation: rank statistics need every prediction
            rows, size = batch["row"].long(), self.spec.eval_rows
            stats["prediction_table"] = torch.zeros(size, device=logits.device).index_put((rows,), logits[:, 0])
            stats["target_table"] = torch.zeros(size, device=logits.device).index_put((rows,), labels.float())
        return stats

    def document_tables(self, logits: torch.Tensor, labels: torch.Tensor, documents: torch.Tensor):
        """Per dev text: the sum of its windows' logits, of their labels (all its own) and their count."""
        size, device = self.spec.eval_rows, logits.device
        return {
            "logit_table": torch.zeros(size, logits.shape[1], device=device).index_add_(0, documents, logits),
            "label_table": torch.zeros(size, device=device).index_add_(0, documents, labels.float()),
            "window_table": torch.zeros(size, device=device).index_add_(0, documents, torch.ones_like(logits[:, 0])),
        }

    def summarize(self, sums):
        out = {"loss": sums.get("loss_sum", 0.0) / max(1.0, sums.get("count", 0.0))}
        if "window_table" in sums:
            windows = np.maximum(np.asarray(sums["window_table"]), 1.0)
            logits = np.asarray(sums["logit_table"]).reshape(len(windows), -1) / windows[:, None]
            labels = np.asarray(sums["label_table"]) / windows
            if self.task == "classification":
                labels = labels.round().astype(np.int64)
            out.update(metrics.task_metrics(self.task, logits, labels, self.num_labels))
        if "confusion" in sums:
            K = self.num_labels
            out.update(metrics.classification_metrics(np.asarray(sums["confusion"]).reshape(K, K)))
        if "prediction_table" in sums:
            out.update(
                metrics.regression_metrics(np.asarray(sums["prediction_table"]), np.asarray(sums["target_table"]))
            )
        return out

    # ---------------------------------------------------------------------------------------------- batches
    def _rows(self, split: str) -> dict[str, np.ndarray]:
        """The whole split, read from Ray once per worker: fine-tuning sets fit in memory, and re-reading a Ray
        dataset every epoch costs seconds of start-up."""
        if split not in self._cache:
            parts = list(self.dataset(split).iter_batches(batch_size=4096, batch_format="numpy"))
            self._cache[split] = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return self._cache[split]

    def _batches(self, split: str, batch_size: int, order: np.ndarray | None = None, drop_last: bool = False):
        rows = self._rows(split)
        order = np.arange(len(rows["row"])) if order is None else order
        columns = [k for k in rows if split == "dev" or k not in self.eval_columns]
        for index in global_batches(len(order), batch_size, self.rank, self.world_size, drop_last):
            yield batching.collate({k: rows[k][order[index]] for k in columns}, self.spec.pad_to_multiple_of)

    def train_batches(self, epoch, phase=0):
        return self.train_batches_from(epoch, phase, 0)

    def train_batches_from(self, epoch, phase, start):
        """A new seeded order each epoch, the same on every rank (rows of similar length in each global batch with
        `group_by_length`), from global batch `start` on; each rank takes its slice of every global batch, so a
        resumed run sees exactly the rows not yet trained on, and collates none of the others."""
        lengths = self._rows("train")["length"]
        rng = np.random.default_rng([self.spec.seed, epoch])
        order = (
            batching.length_grouped_order(
                lengths, self.spec.batch_size * self.world_size, rng, self.spec.pad_to_multiple_of
            )
            if self.spec.group_by_length
            else rng.permutation(len(lengths))
        )
        skipped = start * self.spec.batch_size * self.world_size
        return self._batches("train", self.spec.batch_size, order[skipped:], drop_last=True)

    def eval_batches(self):
        """Longest rows first: evaluation statistics are sums, so the order only changes the padding."""
        order = batching.length_sorted_order(self._rows("dev")["length"])
        return self._batches("dev", self.spec.eval_batch_size, order)

    # ----------------------------------------------------------------------------------- evaluation points
    def should_evaluate(self, step: int) -> bool:
        """At each epoch end: the step that consumed the epoch's last micro-batch."""
        per_epoch, accum = self.spec.micro_batches_per_epoch, self.spec.grad_accum_steps
        return (step * accum) // per_epoch > ((step - 1) * accum) // per_epoch

    def should_stop(self, eval_metrics):
        return self.stopper(eval_metrics)

    def state(self):
        return self.stopper.state()

    def restore(self, state):
        if state:  # a checkpoint written before the task kept state starts counting afresh
            self.stopper.restore(state)


def global_batches(count: int, batch_size: int, rank: int, world_size: int, drop_last: bool):
    """Index ranges of this rank's share of each global batch of `batch_size × world_size` rows
    (`train.feed.rank_slice`); `drop_last` leaves out the last, partial global batch."""
    size = batch_size * world_size
    stop = count - count % size if drop_last else count
    for start in range(0, stop, size):
        part = rank_slice(min(size, count - start), rank, world_size)
        if part.start < part.stop:
            yield slice(start + part.start, start + part.stop)
