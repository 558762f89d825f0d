"""A training job's `Plan`: everything its run is made of, resolved from the config once, before anything runs.

The job runner (albert_dist/train/job.py) opens the tracked run and hands the plan whole to `run_training`; a
worker gets the parts it runs (the task, the loop's settings, the seed, where checkpoints and the model go).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from albert_dist.config import ScalingSection, TrainSection, default_values, flatten
from albert_dist.storage import join_location
from albert_dist.tracking.run import JobRun, RunTarget
from albert_dist.train import checkpointing
from albert_dist.train.loop import TaskSpec


@dataclass
class Plan:
    """What the workers run (`task`, `train`, `scaling`, `seed`), where (`name`, `storage_path`, `publish_to`,
    `model_dir`), what a relaunch must match (`fingerprint`, `resume_changes`), where it is tracked (`tracking`)
    and what the driver tracks and prints, and its own settings."""

    task: TaskSpec
    train: TrainSection
    scaling: ScalingSection
    seed: int
    name: str
    storage_path: Path | str  # Ray Train's checkpoints
    publish_to: Path | str | None  # the run's home: the checkpoint manager publishes model/ (and best_model/) there
    fingerprint: dict[str, Any] | None  # None: a relaunch is not checked against its checkpoints
    resume_changes: str
    tracking: RunTarget | None  # None: not tracked
    datasets: Callable[[], dict[str, Any]]  # made once Ray runs (Ray Data datasets)
    params: dict[str, Any] = field(default_factory=dict)  # MLflow params besides the config's
    tags: dict[str, str] = field(default_factory=dict)
    banner: list[str] = field(default_factory=list)  # the first line ends with the MLflow run
    stage: Callable[[JobRun], None] = lambda run: None  # inputs staged and logged in the tracked run
    evaluate: Callable[[Path], dict[str, float]] | None = None  # final metrics of the published model
    label_names: list[str] | None = None
    driver: dict[str, Any] = field(default_factory=dict)  # the driver's own settings (evaluation, measurement)
    inputs: dict[str, Any] = field(default_factory=dict)  # what identifies the data as read (digests, rows)

    @property
    def model_dir(self) -> Path | str:
        return join_location(self.publish_to, checkpointing.PUBLISHED_MODEL)

    @property
    def best_model_dir(self) -> Path | str | None:
        """Where the best evaluation's model is kept besides model/ (`train.publish: last`)."""
        return join_location(self.publish_to, checkpointing.BEST_MODEL) if self.train.publish == "last" else None

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
            "tracking": {**vars(self.tracking), "run_dir": str(self.tracking.run_dir)},
            "params": self.params,
            "tags": self.tags,
            "label_names": self.label_names,
            "driver": self.driver,
            "inputs": self.inputs,
            "data_digest": self.fingerprint["data"],
        }


def run_target(settings, run_dir: Path | str | None = None, name: str | None = None) -> RunTarget:
    """Where the MLflow run of the job config `settings` (its `run` and `tracking` sections) is recorded;
    `run_dir` (default: the run's home, `run.locate()`) keeps its id, `name` defaults to the run's."""
    return RunTarget(
        uri=settings.tracking.resolved_uri(settings.run.output_dir),
        experiment=settings.tracking.experiment,
        run_dir=run_dir or settings.run.locate(),
        name=name or settings.run.name,
        register_as=settings.tracking.register_model,
        system_metrics=settings.tracking.system_metrics,
    )


def base_plan(cfg, *, task: TaskSpec, train: TrainSection, data_digest: str | None, **rest: Any) -> Plan:
    """The plan of the job `cfg` with the parts every job takes from its run, scaling and tracking sections."""
    home = cfg.run.locate()
    return Plan(
        task=task,
        train=train,
        scaling=cfg.scaling,
        seed=cfg.run.seed,
        name=cfg.run.name,
        storage_path=join_location(home, "ray"),
        publish_to=home,
        fingerprint=checkpointing.fingerprint(flatten(cfg), data_digest, flatten(default_values(type(cfg)))),
        resume_changes=cfg.run.resume_changes,
        tracking=run_target(cfg, run_dir=home),
        **rest,
    )
