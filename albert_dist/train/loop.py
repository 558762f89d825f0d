"""The training loop shared by pretraining, fine-tuning and distillation.

It knows nothing of Ray or of a particular task: a `TrainingTask` supplies the model, the batches and the loss, and
a `WorkerEnv` supplies the rank, the device, the distributed wrapper and the reporting barrier. The loop does
accumulation, mixed precision, clipping, the schedule, non-finite guarding, logging, evaluation and the switch
between training phases; its `checkpointing.CheckpointManager` writes the checkpoints and restores them for an
exact resume.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from albert_dist.config import TrainSection
from albert_dist.console import format_duration
from albert_dist.train import checkpointing, optim, precision
from albert_dist.train.clock import LoopClock
from albert_dist.train.collectives import gather_objects
from albert_dist.train.feed import slot_shares

Batch = dict[str, torch.Tensor]
#: how close to its baseline (absolute) a metric counts as "learned nothing" for the plateau warning
PLATEAU_MARGIN = 0.01


class TrainingTask(ABC):
    """What differs between pretraining, fine-tuning and distillation."""

    #: the evaluation metric that picks the best model, and whether higher is better
    best_metric: str = "eval_loss"
    best_mode: str = "min"
    #: share of max_steps after which an evaluation still on the `plateau` baseline prints a warning; None: never
    plateau_warning_after: float | None = None
    #: the micro-batches a global micro-batch is cut into (`train.feed`; an elastic run's most workers), and how many
    #: of them this rank trains; None: one per rank
    slot_count: int | None = None
    slots_held: int = 1

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """The trainable model, initialised (from scratch or from pretrained weights)."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """The loss to minimise and additive statistics (sums and counts) for `summarize`: tensors on the batch's
        device, or numbers known on the host (a count from a shape); never a value read back from the device."""

    @abstractmethod
    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        """Metrics (losses, accuracies, ...) from statistics summed over batches and ranks."""

    @abstractmethod
    def train_batches(self, epoch: int, phase: int = 0) -> Iterable[Batch]:
        """This rank's micro-batches for `epoch` of `phase` (an index into `phases()`; 0 for a task with one
        phase), in the same order every time (for exact resume): `slots_held` from each global micro-batch."""

    def train_batches_from(self, epoch: int, phase: int, start: int) -> Iterable[Batch]:
        """`train_batches(epoch, phase)` from global micro-batch `start` on. This default makes the skipped
        batches and drops them; a task whose epoch order can seek (pretraining's `train.feed.slot_batches`)
        starts there instead."""
        return itertools.islice(self.train_batches(epoch, phase), start * self.slots_held, None)

    @abstractmethod
    def eval_batches(self) -> Iterable[Batch]:
        """This rank's share of the evaluation data."""

    @abstractmethod
    def save_model(self, model: torch.nn.Module, directory: Path) -> None:
        """Write the model (and tokenizer) in the transformers layout, as it is published."""

    def save_training_only(self, model: torch.nn.Module, directory: Path) -> None:
        """Write beside `save_model`'s files in a checkpoint what only resuming needs (never published);
        `load_weights` reads it back."""

    def phases(self) -> list[int]:
        """The steps of each training phase, in order, when the batches change between phases (a sequence-length
        schedule); their sum is max_steps. Empty: one phase."""
        return []

    def parameter_groups(self, model: torch.nn.Module, weight_decay: float) -> list[dict]:
        return optim.parameter_groups(model.named_parameters(), weight_decay)

    def load_weights(self, model: torch.nn.Module, directory: Path) -> None:
        model.load_state_dict(type(model).from_pretrained(directory).state_dict())

    def flops_per_token(self, model: torch.nn.Module, phase: int = 0) -> float:
        """Training FLOPs per token of `model` in `phase`, for model FLOPs utilisation; 0 when unknown."""
        return 0.0

    def should_evaluate(self, step: int) -> bool:
        """Extra evaluation points besides every `eval_every` steps (e.g. epoch ends)."""
        return False

    def evaluation_line(self, eval_metrics: dict[str, float]) -> str | None:
        """The evaluation's console line (after "step N/M | "); None prints nothing."""
        return None

    def plateau(self, eval_metrics: dict[str, float]) -> tuple[str, float, float] | None:
        """(what, value, baseline) of a metric that a model which learned nothing holds at `baseline`, for the
        plateau warning after `plateau_warning_after` of max_steps; None when the task has no such baseline."""
        return None

    def state(self) -> dict[str, float]:
        """What the task itself must carry across a resume (early stopping's count), saved with each checkpoint."""
        return {}

    def restore(self, state: dict[str, float]) -> None:
        """Take back what `state` returned when the checkpoint was written."""

    def should_stop(self, eval_metrics: dict[str, float]) -> bool:
        """Called after each evaluation, on every rank with the same metrics; True stops training (early
        stopping) with a final checkpoint."""
        return False


class TaskSpec(ABC):
    """A task's settings, built and checked by the driver: a frozen dataclass that travels as it is to every
    worker, where `build` makes that worker's `TrainingTask`."""

    @abstractmethod
    def build(self, rank: int, world_size: int, dataset: Callable[[str], Any]) -> TrainingTask:
        """The task of rank `rank` of `world_size`, reading its datasets through `dataset(name)` (a Ray Data
        dataset or shard, or anything with the same iteration methods)."""


@dataclass
class WorkerEnv:
    """Where the loop runs: rank and device, how to wrap the model, how to report, where to resume from."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    wrap_model: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m
    #: reports metrics with the checkpoint staged in a directory; a `Future` handed back means the checkpoint is
    #: stored in the background (done once durable) and the directory is the upload's to remove
    report: Callable[[dict[str, float], Path | None], Future | None] = lambda metrics, checkpoint: None
    resume_dir: Path | None = None
    log_metrics: Callable[[dict[str, float], int], None] | None = None
    #: the run's home, where `CheckpointManager` publishes the model; None publishes nothing
    publish_to: Path | str | None = None
    #: recorded in every checkpoint's manifest (`checkpointing.fingerprint`)
    fingerprint: dict[str, Any] | None = None
    print_fn: Callable[[str], None] = lambda line: print(line, flush=True)
    #: whether a node of this run has been told to drain (the same answer on every rank; a collective): false, or
    #: the drain's deadline as a UNIX time (True when it has none); None where no drain can come
    draining: Callable[[], bool | float] | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass
class Position:
    """How far training got: optimizer steps, the phase, and the micro-batch reached inside the phase's current
    epoch."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    phase: int = 0


class Trainer:
    def __init__(self, task: TrainingTask, settings: TrainSection, env: WorkerEnv, seed: int = 0):
        if settings.deterministic:
            precision.request_determinism()  # before this process's first kernel on a GPU
        resolved = precision.resolve_precision(settings.precision, env.device)
        if settings.precision == "auto" and env.is_main:
            env.print_fn(f"precision auto → {resolved} on {env.device.type}")
        settings = settings.model_copy(update={"precision": resolved})
        self.task, self.settings, self.env = task, settings, env
        torch.manual_seed(seed + env.rank)
        self.model = task.build_model().to(env.device)
        if settings.activation_checkpointing:
            self.model.gradient_checkpointing = True
        groups = task.parameter_groups(self.model, settings.weight_decay)
        self.optimizer = optim.build_optimizer(
            settings.optimizer,
            groups,
            settings.learning_rate,
            (settings.adam_beta1, settings.adam_beta2),
            settings.adam_epsilon,
            settings.weight_decay,
        )
        self.scheduler = optim.build_scheduler(
            self.optimizer, settings.warmup_steps, settings.max_steps, settings.lr_decay_power
        )
        self.scaler = precision.grad_scaler(settings.precision, env.device)
        self.phase_ends = list(itertools.accumulate(task.phases()))
        if self.phase_ends and self.phase_ends[-1] != settings.max_steps:
            raise ValueError(f"the task's phases end at step {self.phase_ends[-1]}, max_steps is {settings.max_steps}")
        self.position = Position()
        self.clock = LoopClock()
        self.checkpoints = checkpointing.CheckpointManager(task, env, settings.checkpoint_every, settings.publish)
        # consecutive skipped steps so far and their longest run since the last log, kept on the device: the step
        # never waits for the device to tell whether its gradients were finite; the log interval reads them
        self.nonfinite_run = torch.zeros((), dtype=torch.long, device=env.device)
        self.nonfinite_longest = torch.zeros((), dtype=torch.long, device=env.device)
        self.plateau_warned = False
        #: the best (value, step) of the task's `plateau` metric while above its baseline, since the run (re)started
        self.peak: tuple[float, int] | None = None
        self.draining = False
        if env.resume_dir is not None:
            self._restore(env.resume_dir)
        self.wrapped = env.wrap_model(self.model)
        if settings.compile:
            self.wrapped = torch.compile(self.wrapped)
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    # ----------------------------------------------------------------------------------------------- the loop
    def fit(self) -> dict[str, Any]:
        """Train to `max_steps`; returns the last metrics and `status` ("completed" or "diverged")."""
        s, pos = self.settings, self.position
        self.model.train()
        window: dict[str, torch.Tensor] = {}
        window_start, window_steps = time.perf_counter(), 0
        fit_start, start_step = time.perf_counter(), pos.step
        self.clock = LoopClock(start=fit_start)
        metrics: dict[str, Any] = {}
        batches = self._micro_batches()
        self._show_workers()
        while pos.step < s.max_steps:
            self._train_step(batches, window)
            pos.step += 1
            window_steps += 1
            if pos.step in self.phase_ends[:-1]:
                self._next_phase()
                batches = self._micro_batches()
            last = pos.step == s.max_steps
            if pos.step % s.log_every == 0 or last:
                longest = int(self.nonfinite_longest)
                if longest >= s.max_nonfinite_steps:
                    return self._stop_diverged(metrics, longest)
                self.nonfinite_longest.zero_()
                elapsed = time.perf_counter() - window_start
                metrics = self._window_metrics(window, window_steps, elapsed)
                self._log(metrics, fit_start, start_step)
                window, window_start, window_steps = {}, time.perf_counter(), 0
            evaluate = pos.step % s.eval_every == 0 or last or self.task.should_evaluate(pos.step)
            checkpoint = self.checkpoints.due(pos.step) or last or self._drain_notice()
            if self._evaluate_and_report(metrics, evaluate, checkpoint, last, start_step):
                if self.env.is_main:
                    self.env.print_fn(f"early stop at step {pos.step}: {self.task.best_metric} did not improve")
                self._show_clock()
                return {**metrics, **self.clock.metrics(), "status": "stopped_early", "step": pos.step}
        if start_step == s.max_steps:
            # resumed a run that had already ended: its last report may never have reached Ray (a node lost
            # right after it), so the end is evaluated and reported again and the run's result is its end
            self._evaluate_and_report(metrics, evaluate=True, checkpoint=True, last=True, start_step=start_step)
        self._show_clock()
        return {**metrics, **self.clock.metrics(), "status": "completed", "step": pos.step}

    def _show_clock(self) -> None:
        """Log and print where the loop's time went (`LoopClock`), once it has ended."""
        if self.env.log_metrics:
            self.env.log_metrics(self.clock.metrics(), self.position.step)
        if self.env.is_main:
            self.env.print_fn(f"step {self.position.step}/{self.settings.max_steps} | {self.clock.line()}")

    def _show_workers(self) -> None:
        """Say how a run with fewer workers than its global batch has slots makes up the batch."""
        slots, workers = self.task.slot_count, self.env.world_size
        if self.env.is_main and slots and slots != workers:
            self.env.print_fn(
                f"step {self.position.step}/{self.settings.max_steps} | {workers} of {slots} workers: "
                f"{slot_shares(workers, slots)} micro-batch(es) of each global micro-batch "
                f"({self.settings.grad_accum_steps} per step), the global batch stays the same"
            )

    def _drain_notice(self) -> bool:
        """True at the first check after a node of this run was told to drain, so that a checkpoint of the step
        reached is written before the node goes; the event is logged as `drain_notice_step`."""
        if self.env.draining is None or self.position.step % self.settings.drain_check_every:
            return False
        self.checkpoints.settle()
        draining = self.env.draining()
        notice, self.draining = bool(draining) and not self.draining, bool(draining)
        if notice:
            self.checkpoints.notice(None if draining is True else float(draining))
        if notice and self.env.is_main:
            step = self.position.step
            self.env.print_fn(f"step {step}/{self.settings.max_steps} | drain notice: checkpointing this step")
            if self.env.log_metrics:
                self.env.log_metrics({"drain_notice_step": float(step)}, step)
        return notice

    def _evaluate_and_report(
        self, metrics: dict[str, Any], evaluate: bool, checkpoint: bool, last: bool, start_step: int
    ) -> bool:
        """The end of a step: evaluate (into `metrics`), keep the best model, report with a checkpoint when one is
        due. True when the task stops early."""
        pos, clock = self.position, self.clock
        stop = False
        began = time.perf_counter()
        if evaluate:
            metrics.update(self.evaluate())
            self.checkpoints.keep_best(metrics, self.model)
            self._show_evaluation(metrics)
            if self.env.log_metrics:
                self.env.log_metrics({k: v for k, v in metrics.items() if k.startswith("eval_")}, pos.step)
            stop = self.task.should_stop(metrics)
            if stop:
                metrics["stopped_early"] = 1.0
        reporting = time.perf_counter()
        clock.evaluation_s += reporting - began
        if last or stop:
            metrics["replicas_identical"] = float(self.replicas_identical())
            metrics["resumed_from_step"] = float(start_step if self.env.resume_dir is not None else -1)
        if evaluate or checkpoint:
            self.checkpoints.report(
                {**metrics, "step": pos.step, "epoch": pos.epoch},
                self.model,
                self._state() if checkpoint or stop else None,
                final=last or stop,
            )
        clock.checkpoint_s += time.perf_counter() - reporting
        return stop

    def replicas_identical(self) -> bool:
        """Whether every rank holds bit-identical weights (DDP's promise), by comparing per-tensor checksums."""
        sums = torch.stack([p.detach().double().sum() for p in self.model.parameters()]).cpu()
        return all(torch.equal(sums, other) for other in gather_objects(sums, self.env.world_size))

    def _next_phase(self) -> None:
        """Start the next phase's batches at its first epoch (the checkpoint of this step resumes there)."""
        pos = self.position
        pos.phase, pos.epoch, pos.batch_in_epoch = pos.phase + 1, 0, 0
        if self.env.is_main:
            self.env.print_fn(
                f"step {pos.step}/{self.settings.max_steps} | phase {pos.phase + 1}/{len(self.phase_ends)} begins"
            )

    def _micro_batches(self) -> Iterator[Batch]:
        """The current phase's micro-batches across epochs, starting at the saved position (`train_batches_from`).
        The position counts global micro-batches, whatever this rank's share of each."""
        pos, held = self.position, self.task.slots_held
        while True:
            produced, resume_at = pos.batch_in_epoch > 0, pos.batch_in_epoch
            for index, batch in enumerate(self.task.train_batches_from(pos.epoch, pos.phase, resume_at)):
                produced = True
                pos.batch_in_epoch = resume_at + index // held + 1
                yield batch
            if not produced:
                raise RuntimeError(
                    "the training data gives this worker no batch: use a smaller batch size or "
                    "fewer workers, or prepare more data"
                )
            pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0

    def _train_step(self, batches: Iterator[Batch], window: dict[str, torch.Tensor | int]) -> None:
        """One optimizer step over `grad_accum_steps` global micro-batches, skipped for a non-finite gradient. Nothing
        in it reads a value back from the device (each read waits for the device to finish all work queued so far):
        the statistics stay tensors until the log interval and the skip is decided on the device."""
        s, device = self.settings, self.env.device
        micro_batches = s.grad_accum_steps * self.task.slots_held
        # the mean over the step's micro-batches of every rank, once DDP has averaged the ranks' sums
        weight = self.env.world_size / (s.grad_accum_steps * (self.task.slot_count or self.env.world_size))
        for micro in range(micro_batches):
            batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
            sync = micro == micro_batches - 1 or not hasattr(self.wrapped, "no_sync")
            with contextlib.nullcontext() if sync else self.wrapped.no_sync():
                with precision.autocast(s.precision, device):
                    loss, stats = self.task.loss(self.wrapped, batch)
                scaled = loss * weight
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            _accumulate(window, stats)
            _accumulate(
                window,
                {
                    "tokens": batch["attention_mask"].sum()
                    if "attention_mask" in batch
                    else batch["input_ids"].numel(),
                    "samples": samples_in(batch),
                },
            )
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        # Gradients are identical on every rank after DDP's all-reduce, so every rank takes the same decision.
        norm = torch.nn.utils.clip_grad_norm_(self.params, s.max_grad_norm if s.max_grad_norm > 0 else math.inf)
        finite = torch.isfinite(norm)
        if self.scaler:
            self.scaler.step(self.optimizer)  # skips the update itself on inf/nan
            self.scaler.update()
        else:
            optim.step_unless(self.optimizer, ~finite)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.nonfinite_run = torch.where(finite, 0, self.nonfinite_run + 1)
        torch.maximum(self.nonfinite_longest, self.nonfinite_run, out=self.nonfinite_longest)
        _accumulate(
            window, {"grad_norm": torch.where(finite, norm.detach().float(), 0.0), "finite_steps": finite.float()}
        )

    # -------------------------------------------------------------------------------------------- metrics
    def _window_metrics(self, window: dict[str, torch.Tensor], steps: int, elapsed: float) -> dict[str, float]:
        sums = all_reduce_sums(window, self.env.device)
        tokens, samples = sums.pop("tokens", 0.0), sums.pop("samples", 0.0)
        self.clock.tokens += tokens
        finite_steps = sums.pop("finite_steps", 0.0)
        grad_norm = sums.pop("grad_norm", float("nan"))
        metrics = self.task.summarize(sums)
        metrics.update(
            {
                "learning_rate": self.scheduler.get_last_lr()[0],
                # both sums run over ranks as well as steps (every rank holds the same norm)
                "grad_norm": grad_norm / finite_steps if finite_steps else float("nan"),
                "tokens_per_s": tokens / elapsed,
                "samples_per_s": samples / elapsed,
                "tokens_seen": self.clock.tokens,
                "skipped_steps": float(steps - finite_steps / self.env.world_size),
                "workers": float(self.env.world_size),
                # rank 0's micro-batches per step (an elastic run's workers train more of them when fewer)
                "micro_batches_per_step": float(self.settings.grad_accum_steps * self.task.slots_held),
            }
        )
        flops = self.task.flops_per_token(self.model, self.position.phase)
        if flops:
            metrics["model_tflops"] = flops * metrics["tokens_per_s"] / 1e12
            if self.settings.peak_tflops:
                metrics["mfu"] = metrics["model_tflops"] / self.settings.peak_tflops
        return metrics

    def _log(self, metrics: dict[str, float], fit_start: float, start_step: int) -> None:
        step, total = self.position.step, self.settings.max_steps
        if self.env.log_metrics:
            self.env.log_metrics(metrics, step)
        if self.env.is_main:
            rate = (step - start_step) / max(1e-9, time.perf_counter() - fit_start)
            eta = (total - step) / rate if rate > 0 else float("inf")
            shown = " | ".join(
                f"{k} {v:.4g}"
                for k, v in metrics.items()
                if k.endswith(("loss", "accuracy")) and not k.startswith("eval_")
            )
            self.env.print_fn(
                f"step {step}/{total} | {shown} | {metrics['tokens_per_s']:.0f} tok/s "
                f"| lr {metrics['learning_rate']:.3g} | ETA {format_duration(eta)}"
            )

    def _show_evaluation(self, metrics: dict[str, float]) -> None:
        """The task's evaluation line; once per run a warning when the model still sits on its baseline, and once
        when it had left the baseline and fell back onto it."""
        if not self.env.is_main or not any(k.startswith("eval_") for k in metrics):
            return
        step, total = self.position.step, self.settings.max_steps
        line = self.task.evaluation_line(metrics)
        if line:
            self.env.print_fn(f"step {step}/{total} | {line}")
        plateau = self.task.plateau(metrics)
        if plateau is None or self.plateau_warned:
            return
        what, value, baseline = plateau
        if value - baseline >= PLATEAU_MARGIN:
            if self.peak is None or value > self.peak[0]:
                self.peak = (value, step)
            return
        if self.peak is not None:
            self.plateau_warned = True
            self.env.print_fn(
                f"warning: {what} {value:.3f} fell back within {PLATEAU_MARGIN * 100:.0f} point of its baseline "
                f"{baseline:.3f} (step {step}/{total}) from {self.peak[0]:.3f} at step {self.peak[1]}: training "
                f"lost what it had learned, as too high a learning rate does. Relaunch as a new run with a lower "
                f"train.learning_rate (or find one: albert-dist lr-range); the best evaluation's model is kept "
                f"(best_model with train.publish: last)"
            )
            return
        after = self.task.plateau_warning_after
        if after is not None and step >= after * total:
            self.plateau_warned = True
            self.env.print_fn(
                f"warning: {what} {value:.3f} is not {PLATEAU_MARGIN * 100:.0f} point above its baseline "
                f"{baseline:.3f} after {step / total:.0%} of the run (step {step}/{total}): the model has learned "
                f"nothing beyond the most frequent piece yet. Find a learning rate that learns with the LR range "
                f"test: albert-dist lr-range with this run's --config and --set"
            )

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        sums: dict[str, torch.Tensor] = {}
        for batch in self.task.eval_batches():
            batch = {k: v.to(self.env.device) for k, v in batch.items()}
            with precision.autocast(self.settings.precision, self.env.device):
                _, stats = self.task.loss(self.model, batch)
            _accumulate(sums, stats)
        self.model.train()
        totals = all_reduce_sums(sums, self.env.device)
        return {f"eval_{k}": v for k, v in self.task.summarize(totals).items()} if totals else {}

    # ----------------------------------------------------------------------------------------- checkpoints
    def _state(self) -> dict[str, Any]:
        """The trainer's part of a checkpoint (the `CheckpointManager` adds the rest)."""
        pos = self.position
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else {},
            "step": pos.step,
            "epoch": pos.epoch,
            "batch_in_epoch": pos.batch_in_epoch,
            "phase": pos.phase,
        }

    def _restore(self, directory: Path) -> None:
        state = self.checkpoints.restore(self.model, directory)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.position = Position(state["step"], state["epoch"], state["batch_in_epoch"], state.get("phase", 0))
        if self.env.is_main:
            phase = f"phase {self.position.phase + 1}, " if self.phase_ends else ""
            self.env.print_fn(
                f"resumed from {directory} at step {self.position.step} "
                f"({phase}epoch {self.position.epoch}, batch {self.position.batch_in_epoch})"
            )

    def _stop_diverged(self, metrics: dict[str, Any], steps: int) -> dict[str, Any]:
        message = (
            f"loss or gradients were not finite for {steps} consecutive steps (up to step "
            f"{self.position.step}); stopped, the last good checkpoint is kept. Lower train.learning_rate "
            f"or use bf16/fp32."
        )
        if self.env.is_main:
            self.env.print_fn(message)
        return {**metrics, "status": "diverged", "message": message, "step": self.position.step}


def samples_in(batch: Batch) -> int:
    """The sequences a batch holds: its rows, or one per [CLS] when rows are packed (`albert_dist.data.packing`)."""
    return len(batch["cls_positions"]) if "cls_positions" in batch else batch["input_ids"].shape[0]


def _accumulate(sums: dict[str, torch.Tensor | int], stats: dict[str, torch.Tensor | int]) -> None:
    """Add `stats` into `sums`: tensors stay on their device (nothing is read back), counts known on the host stay
    numbers."""
    for key, value in stats.items():
        value = value.detach().float() if isinstance(value, torch.Tensor) else value
        sums[key] = sums[key] + value if key in sums else value


def all_reduce_sums(sums: dict[str, torch.Tensor], device: torch.device) -> dict[str, float | list[float]]:
    """Sum statistics over ranks; every rank must call it, also one that saw no batch (its keys count as 0).

    Scalars come back as floats; vector statistics (a confusion matrix, a table of predictions indexed by row)
    come back as lists, summed element-wise.
    """
    distributed = dist.is_available() and dist.is_initialized()
    shapes = {k: tuple(getattr(v, "shape", ())) for k, v in sums.items()}
    if distributed:
        for other in gather_objects(shapes, dist.get_world_size()):
            shapes.update(other)
    keys = sorted(shapes)
    if not keys:
        return {}
    parts = [
        torch.as_tensor(sums[k], dtype=torch.float32, device=device).reshape(-1)
        if k in sums
        else torch.zeros(math.prod(shapes[k]), device=device)
        for k in keys
    ]
    packed = torch.cat(parts)
    if distributed:
        dist.all_reduce(packed)
    summed = packed.split([part.numel() for part in parts])
    return {k: (part.tolist() if shapes[k] else part.item()) for k, part in zip(keys, summed)}
