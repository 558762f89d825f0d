"""Runs a sweep, or resumes the one found in `<output_dir>/<name>`, then publishes its result there:
`trials.csv`, `trials.png`, `best_<kind>.yaml` (the best trial's job config, ready to run) and `best_model/` (the
model the best trial published).

A resumed sweep (`Tuner.restore(..., resume_errored=True)`) keeps its finished trials, restarts the interrupted
and errored ones (each resuming its Ray Train run from its last checkpoint) and runs the samples still missing.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from albert_dist.config import dump_yaml
from albert_dist.console import quiet_optuna, tune_verbosity
from albert_dist.errors import AlbertDistError
from albert_dist.jobs.registry import Command
from albert_dist.model.checkpoint import CONFIG_NAME
from albert_dist.redaction import redact_url
from albert_dist.storage import publish_dir
from albert_dist.tracking.run import JobRun
from albert_dist.train.checkpointing import PUBLISHED_MODEL
from albert_dist.tune import mlflow_runs, report, space
from albert_dist.tune.config import TuneJobConfig
from albert_dist.tune.trainable import TrialSetup, run_trial


@dataclass
class SweepOutcome:
    rows: list[dict[str, Any]]  # best first
    best: dict[str, Any]
    best_config: Path
    best_model: Path
    tracking_uri: str
    parent_run_id: str


@dataclass(frozen=True)
class SweepPlan:
    """All that a sweep's keys decide, before Ray or MLflow starts: what every trial runs, the search space, how
    Tune searches and schedules."""

    trial: TrialSetup  # its tracking_uri and parent_run_id are the parent run's, once it has started
    name: str
    distributions: dict[str, space.Distribution]
    mode: str
    num_samples: int
    max_concurrent_trials: int
    search_alg: str
    seed: int
    asha: dict[str, Any] | None  # ASHAScheduler's settings; None stops no trial early


def plan_sweep(cfg: TuneJobConfig) -> SweepPlan:
    s = cfg.scheduler
    asha = None
    if s.kind == "asha":
        asha = {"grace_period": s.grace_period, "reduction_factor": s.reduction_factor, "max_t": s.max_t}
    trial = TrialSetup(
        job=cfg.job,
        kind=cfg.kind,
        sweep_dir=cfg.sweep_dir,
        tracking_uri="",
        parent_run_id="",
        metric=cfg.tune_metric,
        scaling=cfg.resources_per_trial.scaling_overrides(),
    )
    return SweepPlan(
        trial=trial,
        name=cfg.run.name,
        distributions=cfg.distributions,
        mode=cfg.tune_mode,
        num_samples=cfg.num_samples,
        max_concurrent_trials=cfg.max_concurrent_trials,
        search_alg=cfg.search_alg,
        seed=cfg.run.seed,
        asha=asha,
    )


def _tuner(plan: SweepPlan, trainable, uri: str):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.optuna import OptunaSearch

    sweep_dir, metric = plan.trial.sweep_dir, plan.trial.metric
    if tune.Tuner.can_restore(str(sweep_dir)):
        print(f"resuming the sweep in {sweep_dir}")
        return tune.Tuner.restore(str(sweep_dir), trainable, resume_errored=True)
    scheduler = ASHAScheduler(time_attr="training_iteration", **plan.asha) if plan.asha else None
    # Tune applies max_concurrent_trials to a Searcher (Optuna) itself, not to a BasicVariantGenerator instance.
    if plan.search_alg == "optuna":
        quiet_optuna()
    search = (
        OptunaSearch(seed=plan.seed)
        if plan.search_alg == "optuna"
        else BasicVariantGenerator(max_concurrent=plan.max_concurrent_trials, random_state=plan.seed)
    )
    return tune.Tuner(
        trainable,
        param_space={name: dist.to_tune() for name, dist in plan.distributions.items()},
        tune_config=tune.TuneConfig(
            metric=metric,
            mode=plan.mode,
            search_alg=search,
            scheduler=scheduler,
            num_samples=plan.num_samples,
            max_concurrent_trials=plan.max_concurrent_trials,
        ),
        run_config=tune.RunConfig(
            name=plan.name,
            storage_path=str(sweep_dir.parent),
            verbose=tune_verbosity(),  # Tune's live tables (a hundred lines a sweep) with --verbose only
            callbacks=[
                mlflow_runs.ChildCloser(uri, report.trials_dir(sweep_dir), metric, plan.mode),
                report.TrialProgress(metric, plan.mode, list(plan.distributions), plan.num_samples),
            ],
        ),
    )


def run_sweep(cfg: TuneJobConfig) -> SweepOutcome:
    from ray import tune

    from albert_dist.cluster.ray_init import ensure_ray

    plan = plan_sweep(cfg)
    ensure_ray()
    with mlflow_runs.parent_run(cfg) as parent:
        setup = replace(plan.trial, tracking_uri=parent.uri, parent_run_id=parent.run_id)
        # The trial function only waits on its TorchTrainer, whose workers hold the trial's CPUs/GPUs (Tune
        # refuses a trial of no resources at all, hence a token share of one CPU).
        trainable = tune.with_resources(tune.with_parameters(run_trial, setup=setup), {"CPU": 0.01})
        results = _tuner(plan, trainable, parent.uri).fit()
        return publish(cfg, results, parent)


def publish(cfg: TuneJobConfig, results, parent: JobRun) -> SweepOutcome:
    """Rows, files and MLflow records of a finished sweep."""
    metric, mode, sweep_dir, names = cfg.tune_metric, cfg.tune_mode, cfg.sweep_dir, list(cfg.search_space)
    rows = report.rows(results, names, metric, mode, sweep_dir)
    for row in rows:  # idempotent; catches trials whose sweep driver died before Tune's callback ran
        mlflow_runs.close_child(
            parent.uri, report.trials_dir(sweep_dir) / row["trial_id"], row["stop_reason"], metric, row[metric]
        )
    best = rows[0] if rows and rows[0][metric] is not None else None
    if best is None:
        raise AlbertDistError(f"no trial of the sweep {cfg.run.name} reported {metric}; see {sweep_dir}")
    best_job = space.with_values(cfg.job, {k: best[k] for k in names}, run={"name": f"{cfg.run.name}-best"})
    best_config = sweep_dir / f"best_{cfg.kind}.yaml"  # under its own run name: running it leaves the trial be
    best_config.write_text(
        f"# best trial {best['trial_id']} of sweep {cfg.run.name}: {metric} {best[metric]:.4g}\n" + dump_yaml(best_job)
    )
    best_model = sweep_dir / "best_model"
    source = report.trials_dir(sweep_dir) / best["trial_id"] / PUBLISHED_MODEL
    publish_dir(best_model, lambda d: shutil.copytree(source, d, dirs_exist_ok=True), marker=CONFIG_NAME)
    parent.published(best_model)
    files = [
        report.write_csv(rows, sweep_dir / "trials.csv"),
        report.plot(rows, cfg.distributions, metric, sweep_dir / "trials.png"),
        best_config,
    ]
    mlflow_runs.publish_best(parent, metric, best, names, files, cfg.job, cfg.run.name)
    return SweepOutcome(rows, best, best_config, best_model, parent.uri, parent.run_id)


def run_tune(cfg: TuneJobConfig) -> int:
    """`albert-dist tune finetune|distill`: run the sweep, print its table and where its results are."""
    outcome = run_sweep(cfg)
    print(report.table(outcome.rows))
    best = outcome.best
    print(f"best trial {best['trial_id']}: {cfg.tune_metric} {best[cfg.tune_metric]:.4f}")
    print(f"best config: {outcome.best_config}  (albert-dist {cfg.kind} --config {outcome.best_config})")
    print(f"best model: {outcome.best_model}")
    print(f"MLflow parent run {outcome.parent_run_id} at {redact_url(outcome.tracking_uri)}")
    return 0


FINETUNE_SWEEP = Command(run_tune)
DISTILL_SWEEP = Command(run_tune)
