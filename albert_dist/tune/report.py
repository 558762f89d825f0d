"""The trials of a finished sweep: one row each (params, best metric, status, why it stopped), printed as a
table, written as CSV and plotted (the metric against each hyperparameter)."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from ray import tune

from albert_dist.console import ProgressLine

OUTCOME_FILE = "trial_outcome.json"  # written by a trial whose driver ran to the end
STOP_REASONS = {"completed": "completed", "early-stopped": "early-stopped by the scheduler", "error": "error"}


def trials_dir(sweep_dir: Path) -> Path:
    return sweep_dir / "trials"


def stop_reason(run_dir: Path, errored: bool) -> str:
    if errored:
        return "error"
    return "completed" if (run_dir / OUTCOME_FILE).is_file() else "early-stopped"


def trial_best(trial, metric: str, mode: str):
    """The best `metric` a live Tune trial has reported (None before its first evaluation)."""
    return trial.metric_analysis.get(metric, {}).get(mode)


def best_evaluation(frame, metric: str, mode: str) -> dict[str, Any]:
    """The evaluation (a row of a trial's metrics frame) with the best finite `metric`, with the number of
    evaluations; {} when there is none."""
    if frame is None or metric not in frame:
        return {}
    values = frame[metric].astype(float)
    finite = values[values.map(math.isfinite)]
    if finite.empty:
        return {"evaluations": len(frame)}
    best = finite.idxmax() if mode == "max" else finite.idxmin()
    return {**{k: _plain(v) for k, v in frame.loc[best].items()}, "evaluations": len(frame)}


def _plain(value: Any) -> Any:
    """A Python number for a numpy one (the table and CSV print them alike); NaN as None."""
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


def rows(results, params: list[str], metric: str, mode: str, sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per trial of a Tune `ResultGrid`, best first: its best reported `metric` over its evaluations and
    the other evaluation metrics (`eval_*`, as in MLflow) of that evaluation."""
    frame_columns = [
        c for result in results if result.metrics_dataframe is not None for c in result.metrics_dataframe.columns
    ]
    others = sorted({c for c in frame_columns if c.startswith("eval_") and c != metric})
    out = []
    for result in results:
        trial_id = result.metrics["trial_id"]
        best = best_evaluation(result.metrics_dataframe, metric, mode)
        errored = result.error is not None
        config = result.config or {}  # None for a trial that failed before its first report
        out.append(
            {
                "trial_id": trial_id,
                **{p: config.get(p) for p in params},
                metric: best.get(metric),
                **{name: best.get(name) for name in others},
                "evaluations": best.get("evaluations", 0),
                "status": "ERROR" if errored else "TERMINATED",
                "stop_reason": stop_reason(trials_dir(sweep_dir) / trial_id, errored),
            }
        )
    sign = -1 if mode == "max" else 1
    return sorted(out, key=lambda r: (r[metric] is None, sign * (r[metric] or 0.0), r["trial_id"]))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no trials)"
    columns = list(rows[0])
    cells = [columns] + [[STOP_REASONS[r[c]] if c == "stop_reason" else _cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(text.ljust(w) for text, w in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class TrialProgress(tune.Callback):
    """A Tune callback printing one line when a trial starts and two when it ends (its best `metric`, then the
    sweep's progress line: trials ended of `num_samples`, their rate and the ETA): what the console shows of a
    sweep instead of Tune's live tables, which `--verbose` brings back."""

    def __init__(self, metric: str, mode: str, params: list[str], num_samples: int):
        # no print function kept: Tune pickles its callbacks, and Ray Train may have replaced builtins.print since
        self.metric, self.mode, self.params, self.num_samples = metric, mode, params, num_samples

    def setup(self, **info):
        # here, not in __init__: the clock starts as the trials do, in this process (a resumed sweep unpickles
        # the callback the Tuner pickled when it was first built)
        self.progress = ProgressLine("sweep", unit="trials", total=self.num_samples, every_s=0.0)

    def on_trial_start(self, iteration, trials, trial, **info):
        settings = ", ".join(f"{p}={_cell(trial.config.get(p))}" for p in self.params)
        print(f"sweep: trial {trial.trial_id} started ({settings})")

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._ended(trial, "ended")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ended(trial, "failed")

    def _ended(self, trial, how: str) -> None:
        best = trial_best(trial, self.metric, self.mode)
        print(
            f"sweep: trial {trial.trial_id} {how} after {trial.last_result.get('training_iteration', 0)} "
            f"evaluation(s), best {self.metric} {_cell(best)}"
        )
        self.progress.update(1)


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def plot(rows: list[dict[str, Any]], space: dict, metric: str, path: Path) -> Path:
    """One panel per hyperparameter: the metric of each trial against its value (log axis for loguniform),
    coloured by how the trial ended."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"completed": "tab:green", "early-stopped": "tab:orange", "error": "tab:red"}
    fig, axes = plt.subplots(1, len(space), figsize=(4 * len(space), 3.2), squeeze=False)
    for ax, (name, dist) in zip(axes[0], space.items()):
        for reason, colour in colours.items():
            points = [
                (str(r[name]) if dist.kind == "choice" else r[name], r[metric])
                for r in rows
                if r["stop_reason"] == reason and r[metric] is not None
            ]
            if points:
                ax.scatter(*zip(*points), c=colour, label=STOP_REASONS[reason], s=24)
        if dist.kind == "loguniform":
            ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel(metric)
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
