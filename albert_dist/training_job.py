"""The training jobs (pretraining, fine-tuning, distillation) as declarations, and the one function that runs them.

A job declares what differs (`TrainingJob`): its config type, how it resolves its `Plan` (pre-flight checks, the
workers' task, the loop's settings, the datasets, what it tracks and prints), its MLflow model and the summary
it ends on. `run_job` does what every job does: hold the run's lock, start or join Ray, resolve the plan, open the
tracked MLflow run, print the banner, train on Ray Train, take the model the checkpoint manager published
(`<run>/model`, `train.publish`), evaluate it when the job does, log it as the run's MLflow model, return the
outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from albert_dist.config import ScalingSection, TrainSection, flatten
from albert_dist.storage import fetch_dir
from albert_dist.tracking import run as tracking
from albert_dist.train import checkpointing, run_lock
from albert_dist.train.loop import TaskSpec


@dataclass
class Plan:
    """Everything a job's training run is made of, resolved from its config without training: what the workers
    run (`task`, `train`, `scaling`, `seed`), where (`name`, `storage_path`, `publish_to`), what a relaunch must
    match (`fingerprint`, `resume_changes`), what the driver tracks and prints, and its own settings."""

    task: TaskSpec
    train: TrainSection
    scaling: ScalingSection
    seed: int
    name: str
    storage_path: Path | str
    publish_to: Path | str
    fingerprint: dict[str, Any]
    resume_changes: str
    datasets: Callable[[], dict[str, Any]]  # made once Ray runs (Ray Data datasets)
    params: dict[str, Any] = field(default_factory=dict)  # MLflow params besides the config's
    tags: dict[str, str] = field(default_factory=dict)
    banner: list[str] = field(default_factory=list)  # the first line ends with the MLflow run
    stage: Callable[[tracking.JobRun], None] = lambda run: None  # inputs staged and logged in the tracked run
    evaluate: Callable[[Path], dict[str, float]] | None = None  # final metrics of the published model
    label_names: list[str] | None = None
    driver: dict[str, Any] = field(default_factory=dict)  # the driver's own settings (evaluation, measurement)
    inputs: dict[str, Any] = field(default_factory=dict)  # what identifies the data as read (digests, rows)

    def resolved(self) -> dict[str, Any]:
        """The plan as plain values, to compare plans: everything but the fingerprint (the config itself) and the
        functions (which act on what is listed here)."""
        return {
            "task": repr(self.task),
            "train": self.train.model_dump(),
            "scaling": self.scaling.model_dump(),
            "seed": self.seed,
            "name": self.name,
            "storage_path": str(self.storage_path),
            "publish_to": str(self.publish_to),
            "resume_changes": self.resume_changes,
            "params": self.params,
            "tags": self.tags,
            "label_names": self.label_names,
            "driver": self.driver,
            "inputs": self.inputs,
            "data_digest": self.fingerprint["data"],
        }


@dataclass
class JobOutcome:
    model_dir: Path | str  # <run>/model: a URI when run.output_dir is one
    best_model_dir: Path | str | None  # <run>/best_model when train.publish is last
    tracking_uri: str
    run_id: str
    train_metrics: dict[str, Any]  # the training's last report
    metrics: dict[str, Any]  # train_metrics with the final evaluation of the published model over them
    label_names: list[str] | None = None


@dataclass(frozen=True)
class TrainingJob:
    name: str  # the MLflow run's `albert_dist.job` tag
    config_class: type
    plan: Callable[[Any], Plan]  # pre-flight checks and the plan; raises ConfigError on bad input
    mlflow_model: Callable[[Any], Any]  # the pyfunc model the published model is logged as
    summary: Callable[[Any, JobOutcome], list[str]]  # the lines `main` ends on
    model_kind: str  # the MLflow model's name is `<run.name>-<model_kind>` ("albert-tiny-zh-pretrained")
    instead: Callable[[Any], int | None] = lambda cfg: None  # an exit status: run that instead of training

    def run(self, cfg, callbacks: list | None = None) -> JobOutcome:
        return run_job(self, cfg, callbacks)

    def main(self, cfg) -> int:
        """The command: train (or what `instead` runs), print the summary and where the run is tracked."""
        status = self.instead(cfg)
        if status is not None:
            return status
        outcome = self.run(cfg)
        print("\n".join(self.summary(cfg, outcome)))
        print(tracking.where_to_find(outcome.tracking_uri, outcome.run_id))
        return 0


def base_plan(cfg, *, task: TaskSpec, train: TrainSection, data_digest: str | None, **rest: Any) -> Plan:
    """The plan of the job `cfg` with the parts every job takes from its run and scaling sections."""
    return Plan(
        task=task,
        train=train,
        scaling=cfg.scaling,
        seed=cfg.run.seed,
        name=cfg.run.name,
        storage_path=cfg.run.locate("ray"),
        publish_to=cfg.run.locate(),
        fingerprint=checkpointing.fingerprint(flatten(cfg), data_digest, flatten(type(cfg)())),
        resume_changes=cfg.run.resume_changes,
        **rest,
    )


def run_job(job: TrainingJob, cfg, callbacks: list | None = None) -> JobOutcome:
    """Run the job `job` with the validated config `cfg`; `callbacks` are Ray Train callbacks (a sweep's trial
    passes Tune's report callback)."""
    with run_lock.run_lock(cfg.run.run_dir):
        from albert_dist.cluster.ray_init import ensure_ray
        from albert_dist.train.ray_runner import run_training, training_data_context

        ensure_ray()
        plan = job.plan(cfg)
        with tracking.job_run(cfg, job.name, tags=plan.tags, extra_params=plan.params) as run:
            plan.stage(run)
            first, *rest = plan.banner or [job.name]
            print("\n".join([f"{first}; MLflow run {run.run_id}", *rest]))
            training_data_context()
            result = run_training(
                name=plan.name,
                storage_path=plan.storage_path,
                task=plan.task,
                train=plan.train,
                scaling=plan.scaling,
                seed=plan.seed,
                datasets=plan.datasets(),
                tracking=(run.uri, run.run_id),
                publish_to=plan.publish_to,
                callbacks=callbacks,
                fingerprint=plan.fingerprint,
                resume_changes=plan.resume_changes,
            )
            model_dir = cfg.run.locate(checkpointing.PUBLISHED_MODEL)
            local_model = fetch_dir(model_dir)
            run.published(local_model, str(model_dir))
            step = int(result.metrics.get("step", plan.train.max_steps))
            final = plan.evaluate(local_model) if plan.evaluate else {}
            if final:
                run.log_metrics(final, step)
            run.log_model(job.mlflow_model(cfg), step, f"{cfg.run.name}-{job.model_kind}")
    best = cfg.run.locate(checkpointing.BEST_MODEL) if plan.train.publish == "last" else None
    return JobOutcome(
        model_dir, best, run.uri, run.run_id, result.metrics, {**result.metrics, **final}, plan.label_names
    )
