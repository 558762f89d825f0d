"""The jobs, listed once: the CLI's subcommands (which are also what `albert-dist submit` runs on a cluster, as
`python -m albert_dist.cli <command>`), the demo's steps and a sweep's trials all find a job here.

Each job is declared once in its own module, as a `train.job.TrainingJob` (pretraining, fine-tuning,
distillation) or a `Command`: both have the job's `main(cfg) -> exit status`. The registry names the declaration as
"module:NAME", imported only when the job runs, and the job's config class, which validates the input first:
`albert-dist --help` and a config error stay fast (the declarations import torch, Ray and MLflow).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from albert_dist.errors import AlbertDistError


@dataclass(frozen=True)
class Command:
    """A job that is not one training run (data preparation, a sweep, the demo, the learning-rate range test)."""

    main: Callable[[Any], int]  # called with the validated config; returns the exit status


@dataclass(frozen=True)
class Job:
    name: str  # `albert-dist submit <name>`
    command: tuple[str, ...]  # the CLI subcommand, e.g. ("data", "prepare")
    config: str  # "module:Class" of the job's config
    declaration: str  # "module:NAME" of the job's declaration (a TrainingJob or a Command)
    help: str
    # "module:function" of what returns the job's outcome (the Python API's answer) for a `Command`; a
    # `TrainingJob`'s is its `run`
    outcome: str | None = None

    def config_class(self) -> type:
        return _attribute(self.config)

    def load(self):
        """The job's declaration: `main(cfg)` (and, for a training job, `run(cfg)`)."""
        return _attribute(self.declaration)

    def run(self, cfg) -> Any:
        """Run the job on its validated config `cfg` and return its outcome rather than an exit status."""
        return _attribute(self.outcome)(cfg) if self.outcome else self.load().run(cfg)


def _attribute(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


# Help of the CLI's command groups (a job whose command has two words sits in one).
GROUPS = {"data": "prepare a corpus for pretraining", "tune": "hyperparameter sweeps with Ray Tune, tracked in MLflow"}

JOBS = {
    job.name: job
    for job in [
        Job(
            "prepare_data",
            ("data", "prepare"),
            "albert_dist.data.config:DataJobConfig",
            "albert_dist.data.prepare:PREPARE_DATA",
            "read, split, tokenize and write SOP instances as Parquet shards",
            "albert_dist.data.prepare:prepare_dataset",
        ),
        Job(
            "pretrain",
            ("pretrain",),
            "albert_dist.pretrain.config:PretrainJobConfig",
            "albert_dist.pretrain.job:PRETRAIN",
            "pretrain ALBERT (MLM + SOP) on Ray Train",
        ),
        Job(
            "lr-range",
            ("lr-range",),
            "albert_dist.pretrain.config:LrRangeJobConfig",
            "albert_dist.pretrain.lr_range:LR_RANGE",
            "learning-rate range test on a pretraining job's data and model; suggests train.learning_rate",
            "albert_dist.pretrain.lr_range:lr_range_test",
        ),
        Job(
            "finetune",
            ("finetune",),
            "albert_dist.finetune.config:FinetuneJobConfig",
            "albert_dist.finetune.job:FINETUNE",
            "fine-tune a pretrained ALBERT for classification or regression",
        ),
        Job(
            "distill",
            ("distill",),
            "albert_dist.finetune.config:DistillJobConfig",
            "albert_dist.finetune.distill:DISTILL",
            "distill a fine-tuned teacher into a smaller student",
        ),
        Job(
            "tune-finetune",
            ("tune", "finetune"),
            "albert_dist.tune.config:FinetuneTuneConfig",
            "albert_dist.tune.sweep:FINETUNE_SWEEP",
            "sweep finetune hyperparameters (resumes an interrupted sweep)",
            "albert_dist.tune.sweep:run_sweep",
        ),
        Job(
            "tune-distill",
            ("tune", "distill"),
            "albert_dist.tune.config:DistillTuneConfig",
            "albert_dist.tune.sweep:DISTILL_SWEEP",
            "sweep distill hyperparameters (resumes an interrupted sweep)",
            "albert_dist.tune.sweep:run_sweep",
        ),
        Job(
            "demo",
            ("demo",),
            "albert_dist.demo.config:DemoJobConfig",
            "albert_dist.demo.job:DEMO",
            "the whole pipeline on a small corpus of Python docstrings, end to end",
            "albert_dist.demo.job:run_demo",
        ),
    ]
}


def get(name: str) -> Job:
    """The job `name`; an unknown name is a user error naming the registered ones."""
    try:
        return JOBS[name]
    except KeyError:
        raise AlbertDistError(f"unknown job {name!r}; the jobs are: {', '.join(JOBS)}") from None
