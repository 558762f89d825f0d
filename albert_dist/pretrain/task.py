"""What a Ray Train worker runs for `albert-dist pretrain`: the MLM + SOP task, built on the worker from the
`PretrainingSpec` the driver (albert_dist/pretrain/job.py) sends it.

Kept apart from the driver so that a worker imports the model, the data feed and the masking, not the driver's
tracking, data validation and model logging.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from albert_dist.data.config import MaskingSection
from albert_dist.data.masking import IGNORE_INDEX
from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist.train.feed import EpochOrder, rank_batches, slot_batches, slot_range
from albert_dist.train.loop import TaskSpec, TrainingTask

EVAL_MASK_STREAM = 7919  # seeds the held-out masks apart from any training batch's


@dataclass(frozen=True)
class PhaseSpec:
    """What a worker reads in one training phase: its prepared data's location, batch size and sequence length."""

    prepared_dir: str
    steps: int
    batch_size: int
    max_seq_length: int


@dataclass(frozen=True)
class PretrainingSpec(TaskSpec):
    """A pretraining job's task, as `pretraining_spec` builds it from the job config and the prepared data."""

    prepared_dir: str  # the prepared data's location (its tokenizer is saved with every model)
    manifest: dict[str, Any]
    model_config: dict[str, Any]
    masking: MaskingSection
    batch_size: int
    max_seq_length: int
    seed: int
    eval_batches: int
    has_eval: bool
    init_from: str | None = None
    plateau_warning_after: float | None = None
    packing: bool | Literal["auto"] = False
    phases: tuple[PhaseSpec, ...] = ()
    slots: int | None = None  # micro-batches per global micro-batch (the most workers); None: one per worker

    def build(self, rank: int, world_size: int, dataset: Callable[[str], Any]) -> PretrainingTask:
        return PretrainingTask(self, rank, world_size, dataset)


def prediction_positions(labels: torch.Tensor, size: int) -> torch.Tensor:
    """`size` flat indices into B × T: every labelled position, in order, then unlabelled ones (which add nothing
    to the loss). Its shape is the caller's, whatever the values: indexing by the mask of labelled positions would
    give the count's shape, which a GPU reads back to the host before it can go on."""
    unlabelled = (labels == IGNORE_INDEX).flatten().to(torch.uint8)
    return torch.argsort(unlabelled, stable=True)[: min(size, unlabelled.numel())]


class PretrainingTask(TrainingTask):
    best_metric, best_mode = "eval_mlm_accuracy", "max"

    def __init__(self, spec: PretrainingSpec, rank: int, world_size: int, dataset: Callable[[str], Any]):
        from albert_dist.data.masking import MaskingCollator

        self.spec, self.rank, self.world_size, self.dataset = spec, rank, world_size, dataset
        self.plateau_warning_after = spec.plateau_warning_after
        self.slot_count = spec.slots or world_size
        self.slots = slot_range(rank, world_size, self.slot_count)
        self.slots_held = len(self.slots)
        self.collator = MaskingCollator.from_manifest(spec.manifest, spec.masking)
        # held-out masks are drawn as the data was prepared (data prepare's masking:), whatever masking: trains
        # with: runs that train on other masks (a higher rate, single tokens) are scored on the same positions.
        # Each of them shows [MASK], as fill-mask is measured elsewhere: a token left visible is scored by copying
        self.eval_collator = MaskingCollator.from_manifest(spec.manifest, mask_all=True)
        self._tokenizer = None
        self._splits: dict[int, Any] = {}

    def build_model(self) -> torch.nn.Module:
        if self.spec.init_from:
            return AlbertForPreTraining.from_pretrained(self.spec.init_from)
        return AlbertForPreTraining(AlbertConfig.from_dict(self.spec.model_config))

    def loss(self, model, batch):
        from albert_dist.data.packing import PACKED_INPUTS

        labels, sop_labels = batch["labels"], batch["sentence_order_label"]
        # a fixed number of positions per sequence: the training collator's bound covers the held-out masks too
        positions = prediction_positions(labels, sop_labels.numel() * self.collator.most_predictions)
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            labels=labels,
            sentence_order_label=sop_labels,
            mlm_positions=positions,
            **{key: batch[key] for key in PACKED_INPUTS if key in batch},
        )
        predicted = out.mlm_labels != IGNORE_INDEX
        n_masked = predicted.sum()
        n_pairs = sop_labels.numel()
        # accuracy counts only the predictions whose input shows [MASK]: a random or kept token is no test
        shows_mask = predicted & (batch["input_ids"].flatten()[positions] == self.collator.mask_id)
        stats = {
            "mlm_loss_sum": out.mlm_loss.detach() * n_masked,
            "mlm_correct": ((out.prediction_logits.argmax(-1) == out.mlm_labels) & shows_mask).sum(),
            "mlm_count": n_masked,
            "mlm_shown": shows_mask.sum(),
            "sop_loss_sum": out.sop_loss.detach() * n_pairs,
            "sop_correct": (out.sop_logits.argmax(-1) == sop_labels).sum(),
            "sop_count": float(n_pairs),
        }
        if not model.training:  # evaluation: the label histogram gives the split's unigram baseline
            counts = torch.zeros(self.collator.vocab_size, device=positions.device)
            stats["mlm_label_counts"] = counts.scatter_add_(0, out.mlm_labels.clamp(min=0), shows_mask.float())
        return out.loss, stats

    def summarize(self, sums):
        mlm_n, sop_n = max(1.0, sums.get("mlm_count", 0.0)), max(1.0, sums.get("sop_count", 0.0))
        shown = max(1.0, sums.get("mlm_shown", 0.0))
        mlm_loss, sop_loss = sums.get("mlm_loss_sum", 0.0) / mlm_n, sums.get("sop_loss_sum", 0.0) / sop_n
        metrics = {
            "loss": mlm_loss + sop_loss,
            "mlm_loss": mlm_loss,
            "sop_loss": sop_loss,
            "mlm_accuracy": sums.get("mlm_correct", 0.0) / shown,
            "sop_accuracy": sums.get("sop_correct", 0.0) / sop_n,
        }
        if "mlm_label_counts" in sums:
            # always predicting the most frequent masked piece: the accuracy a model that learned nothing reaches
            metrics["mlm_unigram_baseline"] = max(sums["mlm_label_counts"]) / shown
        return metrics

    def evaluation_line(self, metrics: dict[str, float]) -> str:
        return (
            f"eval MLM accuracy {metrics['eval_mlm_accuracy']:.3f} (unigram baseline "
            f"{metrics['eval_mlm_unigram_baseline']:.3f}) | eval SOP accuracy {metrics['eval_sop_accuracy']:.3f}"
            f" (chance 0.5) | eval loss {metrics['eval_loss']:.4g}"
        )

    def plateau(self, metrics: dict[str, float]) -> tuple[str, float, float]:
        return "held-out MLM accuracy", metrics["eval_mlm_accuracy"], metrics["eval_mlm_unigram_baseline"]

    def phases(self) -> list[int]:
        return [phase.steps for phase in self.spec.phases]

    def phase(self, index: int) -> PhaseSpec:
        """Phase `index` (without phases: data.output's, for all the steps)."""
        if self.spec.phases:
            return self.spec.phases[index]
        return PhaseSpec(self.spec.prepared_dir, 0, self.spec.batch_size, self.spec.max_seq_length)

    def train_batches(self, epoch, phase=0):
        return self.train_batches_from(epoch, phase, 0)

    def train_batches_from(self, epoch, phase, start):
        """This rank's micro-batches of `epoch` from global micro-batch `start` on, read straight from the phase's
        Parquet shards in the epoch's seeded order (`train.feed.EpochOrder`): a resumed run masks none of the
        micro-batches it had trained on, and reads from the window that holds its position on."""
        from albert_dist.data.masking import batch_rng

        seed, spec, split = self.spec.seed, self.phase(phase), self.split_rows(phase)
        for index, slot, rows in slot_batches(
            split.read,
            EpochOrder(split.rows, seed, epoch),
            batch_size=spec.batch_size,
            slots=self.slots,
            slot_count=self.slot_count,
            start=start,
        ):
            yield self.collate(rows, batch_rng(seed, epoch, slot, index), spec.max_seq_length)

    def split_rows(self, phase: int):
        """The training split of `phase`, opened once (its shards' footers are read once per worker)."""
        from albert_dist.data.loading import SplitRows

        if phase not in self._splits:
            self._splits[phase] = SplitRows(self.phase(phase).prepared_dir)
        return self._splits[phase]

    def eval_batches(self):
        """The first `eval_batches × batch_size` held-out sequences (whatever the number of workers, when it
        divides the batch size), each masked as the data was prepared by a generator seeded with its row number,
        every masked position [MASK]:
        the same positions at every evaluation, after a resume, with any number of workers and whatever masks
        training draws, so the metrics compare over time and across runs."""
        if not self.spec.has_eval:
            return
        size = -(-self.spec.batch_size // self.world_size)
        for first, rows in rank_batches(
            self.dataset("eval"),
            batch_size=size,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=False,
            limit=self.spec.eval_batches,
        ):
            count = len(rows["sop_label"])
            yield self.collate(
                rows,
                [np.random.default_rng([self.spec.seed, EVAL_MASK_STREAM, first + i]) for i in range(count)],
                self.spec.max_seq_length,
                self.eval_collator,
            )

    def collate(self, rows, rng, max_seq_length: int, collator=None) -> dict[str, torch.Tensor]:
        """The batch masked by `collator` (default: the training masks), packed into rows of `max_seq_length`
        when `data.packing` is on, or is auto and packing pays (masked first: the same masks either way)."""
        from albert_dist.data.packing import pack_batch

        batch = (collator or self.collator)(rows, rng)
        if self.spec.packing is False:
            return batch
        return pack_batch(
            batch,
            max_seq_length,
            self.collator.pad_id,
            self.collator.pad_to_multiple_of,
            only_if_it_pays=self.spec.packing == "auto",
        )

    def save_model(self, model, directory: Path) -> None:
        from albert_dist.data.loading import load_prepared

        model.save_pretrained(directory)
        if self._tokenizer is None:  # through the data's filesystem: the prepared data may be a URI
            self._tokenizer = load_prepared(self.spec.prepared_dir).tokenizer
        self._tokenizer.save(directory)

    def flops_per_token(self, model, phase=0) -> float:
        return model.flops_per_token(self.phase(phase).max_seq_length)
