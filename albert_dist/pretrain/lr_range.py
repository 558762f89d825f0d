"""`albert-dist lr-range`: the learning-rate range test (Smith 2017, "Cyclical Learning Rates"; fastai's lr_find):
train for a few steps while the learning rate grows exponentially from `lr_range.min` to `lr_range.max`, record the
loss at each, and suggest the rate a tenth of the one where the smoothed loss is lowest (past it the loss turns up
and training diverges).

It runs on a pretraining job's own model and training batches, with the job's optimizer, so the suggestion fits them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from albert_dist.config import TrainBase, dump_yaml, flatten
from albert_dist.jobs.registry import Command
from albert_dist.pretrain.config import LrRangeJobConfig, LrRangeSection
from albert_dist.pretrain.job import pretraining_spec
from albert_dist.tracking import run as tracking
from albert_dist.train import optim
from albert_dist.train.loop import TrainingTask
from albert_dist.train.plan import run_target

SMOOTHING = 0.9  # exponential moving average of the loss, debiased
DIVERGED = 4.0  # stop once the smoothed loss exceeds this many times its minimum


@dataclass
class RangeTest:
    learning_rates: list[float]
    losses: list[float]
    smoothed: list[float]

    @property
    def best_index(self) -> int:
        return min(range(len(self.smoothed)), key=self.smoothed.__getitem__)

    @property
    def suggested(self) -> float:
        """A tenth of the rate at the smoothed loss's minimum: fast, with room before the divergence."""
        return self.learning_rates[self.best_index] / 10

    def table(self, rows: int = 12) -> str:
        """Loss against learning rate at about `rows` evenly spaced points, the minimum marked."""
        picks = sorted({round(i * (len(self.losses) - 1) / max(1, rows - 1)) for i in range(rows)} | {self.best_index})
        lines = [f"{'learning rate':>14} {'loss':>9} {'smoothed':>9}"]
        for i in picks:
            mark = "  <- lowest" if i == self.best_index else ""
            lines.append(f"{self.learning_rates[i]:>14.3g} {self.losses[i]:>9.4f} {self.smoothed[i]:>9.4f}{mark}")
        return "\n".join(lines)

    def plot(self, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(self.learning_rates, self.losses, alpha=0.3, label="loss")
        ax.plot(self.learning_rates, self.smoothed, label="smoothed")
        ax.axvline(self.suggested, color="green", linestyle="--", label=f"suggested {self.suggested:.2g}")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("training loss")
        ax.set_title("learning-rate range test")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def run_range_test(task: TrainingTask, settings: TrainBase, sweep: LrRangeSection, seed: int = 0) -> RangeTest:
    """One optimizer step (`settings`' optimizer, gradient accumulation and clipping, on the run's global batch as
    in training) per
    learning rate of `sweep.steps` exponentially spaced rates between `sweep.min` and `sweep.max`, on a fresh
    model; stops early once the loss diverges."""
    torch.manual_seed(seed)
    model = task.build_model()
    model.train()
    optimizer = optim.build_optimizer(
        settings.optimizer,
        task.parameter_groups(model, settings.weight_decay),
        settings.learning_rate,
        (settings.adam_beta1, settings.adam_beta2),
        settings.adam_epsilon,
        settings.weight_decay,
    )
    steps, low, high = sweep.steps, sweep.min, sweep.max
    result = RangeTest([], [], [])
    average, batches = 0.0, _endless(task)
    for step in range(steps):
        lr = low * (high / low) ** (step / max(1, steps - 1))
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        total, micro_batches = 0.0, settings.grad_accum_steps * task.slots_held  # the run's global batch
        for _ in range(micro_batches):
            loss, _ = task.loss(model, next(batches))
            (loss / micro_batches).backward()
            total += loss.item() / micro_batches
        if settings.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not math.isfinite(total):
            break
        average = SMOOTHING * average + (1 - SMOOTHING) * total
        result.learning_rates.append(lr)
        result.losses.append(total)
        result.smoothed.append(average / (1 - SMOOTHING ** (step + 1)))
        if step > 0 and result.smoothed[-1] > DIVERGED * min(result.smoothed):
            break
    if not result.losses:
        raise RuntimeError(f"the loss was not finite at the first learning rate ({low:g}): lower lr_range.min")
    return result


def _endless(task: TrainingTask):
    epoch = 0
    while True:
        yield from task.train_batches(epoch)
        epoch += 1


def lr_range_test(cfg: LrRangeJobConfig) -> RangeTest:
    """The range test on the job's data and model, in this process (one worker's batches), tracked as its own
    MLflow run; returns the `RangeTest`."""
    import tempfile

    from albert_dist.cluster.ray_init import ensure_ray
    from albert_dist.data.loading import load_prepared, prepared_location

    ensure_ray()
    data_dir = prepared_location(cfg)
    prepared = load_prepared(data_dir)
    s, sweep = cfg.train, cfg.lr_range
    with tracking.job_run(
        run_target(cfg, run_dir=cfg.run.locate("lr_range_test"), name=f"{cfg.run.name}-lr-range-test"),
        "lr_range_test",
        params={**flatten(cfg), "data.prepared_dir": str(data_dir)},
        config_yaml=dump_yaml(cfg),
    ) as run:
        print(
            f"learning-rate range test: {s.optimizer}, {sweep.steps} steps from {sweep.min:g} to "
            f"{sweep.max:g}, the run's global batch ({s.batch_size} x {cfg.scaling.worker_range[1]} worker(s) x "
            f"{s.grad_accum_steps}); MLflow run {run.run_id}"
        )
        task = pretraining_spec(cfg, prepared, data_dir).build(rank=0, world_size=1, dataset=prepared.dataset)
        result = run_range_test(task, s, sweep, cfg.run.seed)
        with tempfile.TemporaryDirectory() as tmp:
            result.plot(Path(tmp) / "lr_range_test.png")
            (Path(tmp) / "lr_range_test.json").write_text(
                json.dumps(
                    {
                        "learning_rate": result.learning_rates,
                        "loss": result.losses,
                        "smoothed_loss": result.smoothed,
                        "suggested_learning_rate": result.suggested,
                    }
                )
            )
            run.log_artifacts(tmp, "lr_range_test")
        run.log_params({"suggested_learning_rate": result.suggested})
    print(result.table())
    print(
        f"suggested: --set train.learning_rate={result.suggested:.2g} (a tenth of the rate with the lowest "
        f"smoothed loss; {s.optimizer})\nplot: MLflow run {run.run_id}, artifact lr_range_test/lr_range_test.png"
    )
    return result


def _main(cfg: LrRangeJobConfig) -> int:
    lr_range_test(cfg)
    return 0


LR_RANGE = Command(_main)
