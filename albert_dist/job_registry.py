"""The jobs, listed once: the CLI's subcommands, the `python -m jobs.<module>` entry points and what
`albert-dist submit` runs are all built from `JOBS`.

Paths are "module:attribute" strings, imported only when a job runs, so that `albert-dist --help` stays fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from albert_dist.errors import AlbertDistError


@dataclass(frozen=True)
class Job:
    name: str                 # `albert-dist submit <name>`
    command: tuple[str, ...]  # the CLI subcommand, e.g. ("data", "prepare")
    config_class: str         # "module:Class" of the job's config
    runner: str               # "module:function" called with the validated config; returns the exit status
    help: str
    entry: tuple[str, ...]    # `python -m` arguments of the job's entry point under jobs/

    def load_config_class(self):
        return import_path(self.config_class)

    def load_runner(self):
        return import_path(self.runner)


# Help of the CLI's command groups (a job whose command has two words sits in one).
GROUPS = {"data": "prepare a corpus for pretraining",
          "tune": "hyperparameter sweeps with Ray Tune, tracked in MLflow"}

JOBS = {job.name: job for job in [
    Job("prepare_data", ("data", "prepare"), "albert_dist.config:DataJobConfig", "albert_dist.data.prepare:run_prepare",
        "read, split, tokenize and write SOP instances as Parquet shards", ("jobs.prepare_data",)),
    Job("pretrain", ("pretrain",), "albert_dist.config:PretrainJobConfig", "albert_dist.pretrain:run_pretrain",
        "pretrain ALBERT (MLM + SOP) on Ray Train", ("jobs.pretrain",)),
    Job("finetune", ("finetune",), "albert_dist.finetune.config:FinetuneJobConfig",
        "albert_dist.finetune.job:run_finetune", "fine-tune a pretrained ALBERT for classification or regression",
        ("jobs.finetune",)),
    Job("distill", ("distill",), "albert_dist.finetune.config:DistillJobConfig",
        "albert_dist.finetune.distill:run_distill", "distill a fine-tuned teacher into a smaller student",
        ("jobs.distill",)),
    Job("tune-finetune", ("tune", "finetune"), "albert_dist.tune.config:FinetuneTuneConfig",
        "albert_dist.tune.sweep:run_tune", "sweep finetune hyperparameters (resumes an interrupted sweep)",
        ("jobs.tune", "finetune")),
    Job("tune-distill", ("tune", "distill"), "albert_dist.tune.config:DistillTuneConfig",
        "albert_dist.tune.sweep:run_tune", "sweep distill hyperparameters (resumes an interrupted sweep)",
        ("jobs.tune", "distill")),
    Job("demo", ("demo",), "albert_dist.demo:DemoJobConfig", "albert_dist.demo:run_demo",
        "the whole pipeline on a small corpus of Python docstrings, end to end", ("jobs.demo",)),
]}


def get(name: str) -> Job:
    """The job `name`; an unknown name is a user error naming the registered ones."""
    try:
        return JOBS[name]
    except KeyError:
        raise AlbertDistError(f"unknown job {name!r}; the jobs are: {', '.join(JOBS)}") from None


def import_path(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)
