"""One trial = one run of the registered job (fine-tuning or distillation) on Ray Train.

The trial's job config is the sweep's job with the sampled values, its run directory `<sweep>/trials/<trial_id>`
(stable across a resumed sweep, so a restarted trial resumes its Ray Train run from its last checkpoint and
continues its MLflow child run) and the sweep's tracking store. Ray Train's workers report into Tune at each
evaluation, which is what ASHA decides on. A trial that ran its job to the end leaves an outcome file; one
that ASHA stopped does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune.integration.ray_train import TuneReportCallback

from albert_dist.config import Section
from albert_dist.jobs import registry
from albert_dist.tune import mlflow_runs, space
from albert_dist.tune.report import OUTCOME_FILE, trials_dir


class EvalReportCallback(TuneReportCallback):
    """Forwards the evaluation reports only (the loop also reports for checkpoints alone, without the dev
    metric, which Tune's strict metric check would reject), and of them the evaluation metrics only, named as in
    MLflow, with the step: the sweep's live table then shows no training-batch metric beside the dev ones."""

    def __init__(self, metric: str):
        super().__init__()
        self.metric = metric

    def after_report(self, run_context, metrics, checkpoint):
        if self.metric in metrics[0]:
            super().after_report(run_context, [evaluation_metrics(metrics[0])], checkpoint)


def evaluation_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The `eval_*` metrics of a report, then its step and epoch."""
    return {
        **{k: v for k, v in metrics.items() if k.startswith("eval_")},
        **{k: metrics[k] for k in ("step", "epoch") if k in metrics},
    }


@dataclass
class TrialSetup:
    """What every trial needs; shipped to the trials once (`tune.with_parameters`)."""

    job: Section
    kind: str  # the registered job each trial runs
    sweep_dir: Path
    tracking_uri: str
    parent_run_id: str
    metric: str
    scaling: dict[str, Any] = field(default_factory=dict)

    def job_for(self, params: dict[str, Any], trial_id: str) -> Section:
        return space.with_values(
            self.job,
            params,
            run={"name": trial_id, "output_dir": str(trials_dir(self.sweep_dir))},
            # trials register no model: the sweep registers its best
            tracking={"tracking_uri": self.tracking_uri, "register_model": None},
            scaling=self.scaling,
        )


def run_trial(params: dict[str, Any], setup: TrialSetup) -> None:
    """The Tune function trainable."""
    from ray import tune

    trial_id = tune.get_context().get_trial_id()
    cfg = setup.job_for(params, trial_id)
    mlflow_runs.child_run(setup.tracking_uri, setup.parent_run_id, trial_id, cfg.run.run_dir)
    outcome = registry.get(setup.kind).load().run(cfg, callbacks=[EvalReportCallback(setup.metric)])
    (cfg.run.run_dir / OUTCOME_FILE).write_text(
        json.dumps({"model_dir": str(outcome.model_dir), "metrics": outcome.metrics}, indent=1)
    )
