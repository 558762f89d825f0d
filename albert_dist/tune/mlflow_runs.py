"""MLflow layout of a sweep: one parent run (its id kept in the sweep directory), one child run per trial.

A child is found again by its trial id (tag) under the parent before one is created, and its id is written
into the trial's run directory where the job's driver picks it up: a resumed sweep or a restarted trial never
creates a second child.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from ray import tune

from albert_dist.config import dump_yaml
from albert_dist.storage import publish_text
from albert_dist.tracking import run as tracking
from albert_dist.train.plan import run_target
from albert_dist.tune.report import stop_reason, trial_best

PARENT_TAG = "mlflow.parentRunId"
TRIAL_TAG = "albert_dist.trial_id"
CHILD_STATUS = {"completed": "FINISHED", "early-stopped": "KILLED", "error": "FAILED"}


def parent_run(cfg):
    """The tracked parent run of the sweep `cfg` (a `tracking.job_run` context), in the job's tracking store and
    experiment."""
    return tracking.job_run(
        run_target(cfg.job, run_dir=cfg.sweep_dir, name=cfg.run.name),
        f"tune-{cfg.kind}",
        config_yaml=dump_yaml(cfg),
        params={
            "metric": cfg.tune_metric,
            "mode": cfg.tune_mode,
            "num_samples": cfg.num_samples,
            "search_alg": cfg.search_alg,
            "scheduler": cfg.scheduler.kind,
            **{f"space.{k}": json.dumps(v) for k, v in cfg.search_space.items()},
        },
    )


def child_run(uri: str, parent_id: str, trial_id: str, run_dir: Path) -> str:
    """The trial's child run (found by its trial id, else created), recorded in `run_dir` for the driver."""
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.get_run(parent_id).info.experiment_id
    found = client.search_runs(
        [experiment_id],
        max_results=1,
        filter_string=(f"tags.`{PARENT_TAG}` = '{parent_id}' and tags.`{TRIAL_TAG}` = '{trial_id}'"),
    )
    run_id = (
        found[0].info.run_id
        if found
        else client.create_run(
            experiment_id,
            run_name=trial_id,
            tags={PARENT_TAG: parent_id, TRIAL_TAG: trial_id, **tracking.default_tags()},
        ).info.run_id
    )
    publish_text(run_dir / tracking.RUN_ID_FILE, run_id)
    return run_id


def close_child(uri: str, run_dir: Path, reason: str, metric: str, value: float | None) -> None:
    """Tag the child with why it stopped and its best metric, and end it (early-stopped trials as KILLED)."""
    id_file = run_dir / tracking.RUN_ID_FILE
    if not id_file.is_file():  # the trial failed before its child run existed
        return
    client, run_id = MlflowClient(tracking_uri=uri), id_file.read_text().strip()
    client.set_tag(run_id, "albert_dist.stop_reason", reason)
    if value is not None:
        client.log_metric(run_id, f"best_{metric}", value)
    client.set_terminated(run_id, CHILD_STATUS[reason])


class ChildCloser(tune.Callback):
    """Ends each trial's child run as soon as Tune is done with the trial (on the sweep's driver)."""

    def __init__(self, uri: str, trials_dir: Path, metric: str, mode: str):
        self.uri, self.trials_dir, self.metric, self.mode = uri, trials_dir, metric, mode

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._close(trial, errored=False)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._close(trial, errored=True)

    def _close(self, trial, errored: bool) -> None:
        run_dir = self.trials_dir / trial.trial_id
        close_child(
            self.uri, run_dir, stop_reason(run_dir, errored), self.metric, trial_best(trial, self.metric, self.mode)
        )


def publish_best(
    parent: tracking.JobRun, metric: str, best: dict[str, Any], params: list[str], files: list[Path], job, name: str
) -> None:
    """Tag the parent with the best trial (id, metric, config), attach the sweep's files and log the best model
    (published) as the parent's MLflow model `<name>-best`, registered when the job's `tracking.register_model` names a
    model."""
    from albert_dist.finetune.job import classifier_model

    client, parent_id = MlflowClient(tracking_uri=parent.uri), parent.run_id
    with tracking.tracking_errors("recording the best trial"):
        client.set_tag(parent_id, "albert_dist.best_trial_id", best["trial_id"])
        client.set_tag(parent_id, f"albert_dist.best_{metric}", str(best[metric]))
        client.set_tag(parent_id, "albert_dist.best_params", json.dumps({k: best[k] for k in params}))
        client.log_metric(parent_id, f"best_{metric}", best[metric], step=0)
        for path in files:
            client.log_artifact(parent_id, str(path))
    parent.log_model(classifier_model(job), step=0, name=f"{name}-best", files=False)
