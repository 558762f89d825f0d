"""The Python API: the CLI's jobs as functions, for notebooks and scripts (`from albert_dist import pretrain`).

Each takes a config as the CLI's `--config` does (a YAML file or a packaged config's name) or as a dict of sections
or a config object, plus `overrides` (the CLI's `--set`: `["train.max_steps=100"]`, or `{"train.max_steps": 100}`
whose values are taken as they are); it validates the config before anything runs (one `ConfigError` naming the
field), runs the job as the CLI would, in this process, and returns what the job made instead of an exit status.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from albert_dist.config import ConfigSource, Overrides, load_config
from albert_dist.console import quiet_mlflow
from albert_dist.jobs.registry import get


def run(job: str, config: ConfigSource = None, overrides: Overrides = None) -> Any:
    """Run the registered job `job` (a name of `albert-dist submit`) on `config` with `overrides`."""
    declared = get(job)
    cfg = load_config(declared.config_class(), config, overrides)
    quiet_mlflow()  # MLflow's own "View run … at <URI>" line would print a tracking URI's credentials
    return declared.run(cfg)


def prepare(config: ConfigSource = None, overrides: Overrides = None) -> dict[str, Any]:
    """`albert-dist data prepare`: the prepared dataset's summary (counts, timings; also in its manifest)."""
    return run("prepare_data", config, overrides)


def pretrain(config: ConfigSource = None, overrides: Overrides = None):
    """`albert-dist pretrain`: a `JobOutcome` (model_dir, metrics, tracking_uri and run_id of the MLflow run)."""
    return run("pretrain", config, overrides)


def finetune(config: ConfigSource = None, overrides: Overrides = None):
    """`albert-dist finetune`: a `JobOutcome` (model_dir, best_model_dir, metrics, label_names, the MLflow run)."""
    return run("finetune", config, overrides)


def distill(config: ConfigSource = None, overrides: Overrides = None):
    """`albert-dist distill`: the student's `JobOutcome`."""
    return run("distill", config, overrides)


def sweep(
    config: ConfigSource = None, overrides: Overrides = None, *, job: Literal["finetune", "distill"] = "finetune"
):
    """`albert-dist tune finetune|distill`: a `SweepOutcome` (trials best first, the best config and model, the
    parent MLflow run)."""
    return run(f"tune-{job}", config, overrides)


def predict(model: str | Path, input: str | Path, output: str | Path, **options: Any) -> int:
    """`albert-dist predict`: predictions for every row of `input` written to `output`; returns how many rows.
    `options` are the CLI's flags as keywords (text_column, text_pair_column, batch_size, precision, device,
    num_actors, backend)."""
    from albert_dist.finetune.predict import run_predict

    quiet_mlflow()
    return run_predict(model, input, output, **options)
