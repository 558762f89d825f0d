"""The training jobs (pretraining, fine-tuning, distillation) as declarations, and the one function that runs them.

A job declares what differs (`TrainingJob`; its config type is the job registry's): how it resolves its `Plan`
(pre-flight checks, the workers' task, the loop's settings, the datasets, what it tracks and prints), its MLflow
model and the summary it ends on. `run_job` does what every job does: hold the run's lock, start or join Ray,
resolve the plan, open the tracked MLflow run, print the banner, train on Ray Train, take the model the checkpoint
manager published (`<run>/model`, `train.publish`), evaluate it when the job does, log it as the run's MLflow
model, return the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from albert_dist.config import dump_yaml, flatten
from albert_dist.storage import fetch_dir
from albert_dist.tracking import run as tracking
from albert_dist.train import run_lock
from albert_dist.train.plan import Plan


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
    plan: Callable[[Any], Plan]  # pre-flight checks and the plan; raises ConfigError on bad input
    mlflow_model: Callable[[Any], Any]  # the pyfunc model the published model is logged as
    summary: Callable[[Any, JobOutcome], list[str]]  # the lines `main` ends on
    model_kind: str  # the MLflow model's name is `<run.name>-<model_kind>` ("albert-tiny-zh-pretrained")

    def run(self, cfg, callbacks: list | None = None) -> JobOutcome:
        return run_job(self, cfg, callbacks)

    def main(self, cfg) -> int:
        """The command: train, print the summary and where the run is tracked."""
        outcome = self.run(cfg)
        print("\n".join(self.summary(cfg, outcome)))
        print(tracking.where_to_find(outcome.tracking_uri, outcome.run_id))
        return 0


def run_job(job: TrainingJob, cfg, callbacks: list | None = None) -> JobOutcome:
    """Run the job `job` with the validated config `cfg`; `callbacks` are Ray Train callbacks (a sweep's trial
    passes Tune's report callback)."""
    with run_lock.run_lock(cfg.run.run_dir):
        from albert_dist.cluster.ray_init import ensure_ray
        from albert_dist.train.ray_runner import run_training

        ensure_ray()
        plan = job.plan(cfg)
        params = {**flatten(cfg), **plan.params}
        with tracking.job_run(
            plan.tracking, job.name, params=params, config_yaml=dump_yaml(cfg), tags=plan.tags
        ) as run:
            plan.stage(run)
            first, *rest = plan.banner or [job.name]
            print("\n".join([f"{first}; MLflow run {run.run_id}", *rest]))
            result = run_training(plan, tracking=(run.uri, run.run_id), callbacks=callbacks)
            local_model = fetch_dir(plan.model_dir)
            run.published(local_model, str(plan.model_dir))
            step = int(result.metrics.get("step", plan.train.max_steps))
            final = plan.evaluate(local_model) if plan.evaluate else {}
            if final:
                run.log_metrics(final, step)
            run.log_model(job.mlflow_model(cfg), step, f"{plan.name}-{job.model_kind}")
            write_card(job, cfg, plan, run, local_model, {**result.metrics, **final})
    return JobOutcome(
        plan.model_dir,
        plan.best_model_dir,
        run.uri,
        run.run_id,
        result.metrics,
        {**result.metrics, **final},
        plan.label_names,
    )


# the data section's fields that say where the data came from (pretraining's prepared data, the task files)
DATA_SOURCE_FIELDS = ("output", "train", "dev", "test")


def write_card(job: TrainingJob, cfg, plan: Plan, run, local_model: Path, metrics: dict[str, Any]) -> None:
    """The published model's card (README.md, albert_dist.hub.card): its task, data, config, metrics, MLflow run."""
    import json

    from albert_dist.hub import card
    from albert_dist.hub.download import hub_id
    from albert_dist.storage import join_location, publish_text
    from albert_dist.tokenizer.albert_tokenizer import languages, load_tokenizer

    model_config = json.loads((local_model / "config.json").read_text())
    data = {f"data.{key}": value for key in DATA_SOURCE_FIELDS if (value := getattr(cfg.data, key, None))}
    if plan.fingerprint:
        data["digest (sha256)"] = plan.fingerprint["data"]
    source = plan.tags.get("albert_dist.source_model") or getattr(getattr(cfg, "model", None), "init_from", None)
    facts = card.CardFacts(
        title=f"{plan.name} ({job.name})",
        task=job.name,
        architecture=(model_config.get("architectures") or ["AlbertModel"])[0],
        languages=languages(load_tokenizer(local_model)),
        model_config=model_config,
        data=data,
        metrics={k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)},
        mlflow={"run_id": run.run_id, "tracking_uri": run.uri, "experiment": getattr(plan.tracking, "experiment", "")},
        base_model=hub_id(source)[0] if source and hub_id(source) else None,
        job_config=dump_yaml(cfg),
    )
    publish_text(join_location(plan.model_dir, card.CARD_NAME), card.render(facts))
