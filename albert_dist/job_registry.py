"""The jobs, listed once: the CLI's subcommands, the `python -m jobs.<module>` entry points, what `albert-dist submit`
runs, the demo's steps and a sweep's trials all find a job here.

Each job is declared once in its own module, as a `training_job.TrainingJob` (pretraining, fine-tuning,
distillation) or a `Command`: both have the job's `config_class` and its `main(cfg) -> exit status`. The registry
names the declaration as "module:NAME", imported only when the job runs, and its config class, which validates the
input first: `albert-dist --help` and a config error stay fast (the declarations import torch, Ray and MLflow).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from albert_dist.errors import AlbertDistError


@dataclass(frozen=True)
class Command:
    """A job that is not one training run (data preparation, a sweep, the demo): its config type and command."""

    config_class: type
    main: Callable[[Any], int]  # called with the validated config; returns the exit status


@dataclass(frozen=True)
class Job:
    name: str  # `albert-dist submit <name>`
    command: tuple[str, ...]  # the CLI subcommand, e.g. ("data", "prepare")
    config: str  # "module:Class" of the job's config (the declaration's config_class)
    declaration: str  # "module:NAME" of the job's declaration (a TrainingJob or a Command)
    help: str
    entry: tuple[str, ...]  # `python -m` arguments of the job's entry point under jobs/

    def config_class(self) -> type:
        return _attribute(self.config)

    def load(self):
        """The job's declaration: `config_class`, `main(cfg)` (and, for a training job, `run(cfg)`)."""
        return _attribute(self.declaration)


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
            ("jobs.prepare_data",),
        ),
        Job(
            "pretrain",
            ("pretrain",),
            "albert_dist.pretrain.config:PretrainJobConfig",
            "albert_dist.pretrain.job:PRETRAIN",
            "pretrain ALBERT (MLM + SOP) on Ray Train",
            ("jobs.pretrain",),
        ),
        Job(
            "finetune",
            ("finetune",),
            "albert_dist.finetune.config:FinetuneJobConfig",
            "albert_dist.finetune.job:FINETUNE",
            "fine-tune a pretrained ALBERT for classification or regression",
            ("jobs.finetune",),
        ),
        Job(
            "distill",
            ("distill",),
            "albert_dist.finetune.config:DistillJobConfig",
            "albert_dist.finetune.distill:DISTILL",
            "distill a fine-tuned teacher into a smaller student",
            ("jobs.distill",),
        ),
        Job(
            "tune-finetune",
            ("tune", "finetune"),
            "albert_dist.tune.config:FinetuneTuneConfig",
            "albert_dist.tune.sweep:FINETUNE_SWEEP",
            "sweep finetune hyperparameters (resumes an interrupted sweep)",
            ("jobs.tune", "finetune"),
        ),
        Job(
            "tune-distill",
            ("tune", "distill"),
            "albert_dist.tune.config:DistillTuneConfig",
            "albert_dist.tune.sweep:DISTILL_SWEEP",
            "sweep distill hyperparameters (resumes an interrupted sweep)",
            ("jobs.tune", "distill"),
        ),
        Job(
            "demo",
            ("demo",),
            "albert_dist.demo.config:DemoJobConfig",
            "albert_dist.demo.job:DEMO",
            "the whole pipeline on a small corpus of Python docstrings, end to end",
            ("jobs.demo",),
        ),
    ]
}


def get(name: str) -> Job:
    """The job `name`; an unknown name is a user error naming the registered ones."""
    try:
        return JOBS[name]
    except KeyError:
        raise AlbertDistError(f"unknown job {name!r}; the jobs are: {', '.join(JOBS)}") from None
