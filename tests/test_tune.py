"""Sweeps on a tiny fine-tuning task: real Ray Tune trials that each run Ray Train, a real SQLite MLflow store."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from finetune_helpers import single_rows, tiny_model_dir, write_csv

from albert_dist.config import load_config, validate_config
from albert_dist.errors import ConfigError
from albert_dist.finetune.config import DistillJobConfig, FinetuneJobConfig
from albert_dist.model import AlbertForSequenceClassification
from albert_dist.tokenizer.training import train_sentencepiece
from albert_dist.tune.config import DistillTuneConfig, FinetuneTuneConfig
from albert_dist.tune.mlflow_runs import PARENT_TAG, TRIAL_TAG
from albert_dist.tune.report import OUTCOME_FILE
from albert_dist.tune.sweep import run_sweep

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, stdlib_corpus):
    root = tmp_path_factory.mktemp("tune")
    train_sentencepiece(stdlib_corpus, root / "tokenizer", 600, progress=lambda _: None)
    tiny_model_dir(root / "model", root / "tokenizer")
    write_csv(root / "train.csv", single_rows(128, seed=1))
    write_csv(root / "dev.csv", single_rows(64, seed=2))
    return root


def sweep_raw(root: Path, name: str, **fields) -> dict:
    """A sweep of 16-step fine-tuning trials (2 epochs of 8 batches) evaluated every 4 steps, on 1 worker."""
    job = {
        "run": {"name": "base", "output_dir": str(root / "runs")},
        "model": {"init_from": str(root / "model")},
        "data": {"train": str(root / "train.csv"), "dev": str(root / "dev.csv"), "max_seq_length": 32},
        "finetune": {"epochs": 2},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "train": {"precision": "fp32", "batch_size": 16, "eval_every": 4, "log_every": 4, "checkpoint_every": 4},
        "tracking": {"tracking_uri": f"sqlite:///{root}/mlflow.db", "experiment": "sweeps"},
    }
    return {
        "job": job,
        "run": {"name": name, "output_dir": str(root / "sweeps")},
        "search_space": {
            "train.learning_rate": {"loguniform": [1e-5, 3e-3]},
            "finetune.warmup_ratio": {"uniform": [0.0, 0.3]},
        },
        "metric": "eval_loss",
        "num_samples": 6,
        "max_concurrent_trials": 2,
        "resources_per_trial": {"num_workers": 1, "cpu": 0.5},
        "scheduler": {"kind": "asha", "grace_period": 1, "reduction_factor": 2},
        **fields,
    }


def children(uri: str, parent_id: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.get_run(parent_id).info.experiment_id
    return client, client.search_runs([experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_id}'")


@pytest.mark.slow
def test_asha_sweep_tracks_parent_and_children(workspace, ray_session, capsys):
    raw = sweep_raw(workspace, "asha")
    raw["job"]["tracking"]["register_model"] = "asha-best"
    cfg = validate_config(FinetuneTuneConfig, raw)
    start = time.time()
    outcome = run_sweep(cfg)
    print(f"sweep took {time.time() - start:.0f}s", file=sys.stderr)

    # the console has one line per trial's start and two per end (the trial, the sweep's progress line) instead
    # of Tune's live tables (--verbose shows those)
    out = capsys.readouterr().out
    assert "Trial name" not in out and "Trial status" not in out
    rows = outcome.rows
    for row in rows:
        started = re.search(rf"sweep: trial {row['trial_id']} started \(train.learning_rate=(\S+), ", out)
        assert started and float(started.group(1)) == pytest.approx(row["train.learning_rate"], rel=1e-3)
        assert re.search(
            rf"sweep: trial {row['trial_id']} ended after {row['evaluations']} evaluation\(s\), best "
            rf"eval_loss {row['eval_loss']:.4g}$",
            out,
            re.MULTILINE,
        ), out
    ended = re.findall(r"^sweep: (\d)/6 trials \([\d.]+/s\) \| \d+% \| ETA \d+:\d\d(?::\d\d)?$", out, re.MULTILINE)
    assert ended == [str(n) for n in range(1, 7)], out
    rows = outcome.rows
    assert len(rows) == 6
    metric_columns = [
        c
        for c in rows[0]
        if c not in ("trial_id", "evaluations", "status", "stop_reason") and c not in cfg.search_space
    ]
    assert metric_columns[0] == "eval_loss" and set(metric_columns) == {
        "eval_loss",
        "eval_accuracy",
        "eval_f1",
        "eval_mcc",
    }
    reasons = [r["stop_reason"] for r in rows]
    assert "early-stopped" in reasons and "completed" in reasons and "error" not in reasons
    early = [r for r in rows if r["stop_reason"] == "early-stopped"]
    assert max(r["evaluations"] for r in early) < max(r["evaluations"] for r in rows)

    client, runs = children(outcome.tracking_uri, outcome.parent_run_id)
    assert sorted(r.data.tags[TRIAL_TAG] for r in runs) == sorted(r["trial_id"] for r in rows)
    child_best = {}
    for run in runs:
        history = [m.value for m in client.get_metric_history(run.info.run_id, "eval_loss")]
        assert history and float(run.data.params["train.learning_rate"]) > 0
        child_best[run.data.tags[TRIAL_TAG]] = run.data.metrics["best_eval_loss"]  # what Tune saw
        reason = run.data.tags["albert_dist.stop_reason"]
        assert run.info.status == {"completed": "FINISHED", "early-stopped": "KILLED"}[reason]
        if reason == "completed":  # a stopped trial may log an evaluation or two Tune never saw before it dies
            assert child_best[run.data.tags[TRIAL_TAG]] == pytest.approx(min(history))
    parent = client.get_run(outcome.parent_run_id)
    assert parent.info.status == "FINISHED"
    best_id = parent.data.tags["albert_dist.best_trial_id"]
    assert child_best[best_id] == min(child_best.values())
    assert float(parent.data.tags["albert_dist.best_eval_loss"]) == pytest.approx(child_best[best_id])
    assert {a.path for a in client.list_artifacts(outcome.parent_run_id)} >= {
        "trials.csv",
        "trials.png",
        "best_finetune.yaml",
    }
    # the best model is the parent's MLflow model and the only registered version; trials register none
    versions = client.search_model_versions("name='asha-best'")
    assert [v.run_id for v in versions] == [outcome.parent_run_id]

    best_job = load_config(FinetuneJobConfig, outcome.best_config)
    assert best_job.train.learning_rate == pytest.approx(outcome.best["train.learning_rate"])
    assert best_job.run.name == "asha-best"
    trial_model = workspace / "sweeps" / "asha" / "trials" / best_id / "model"
    assert AlbertForSequenceClassification.from_pretrained(outcome.best_model).config.num_labels == 2
    assert (outcome.best_model / "model.safetensors").read_bytes() == (trial_model / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_killed_sweep_resumes_without_rerunning_or_duplicating(workspace, ray_session, tmp_path):
    """The sweep's driver killed once its first trial has finished and the second has opened its MLflow run; the
    same sweep launched again runs only the second trial, in the child run it had."""
    from albert_dist.tracking.run import RUN_ID_FILE

    # one trial at a time: the kill lands between a finished trial and a started one without racing a third
    raw = sweep_raw(
        workspace, "resumed", num_samples=2, max_concurrent_trials=1, search_alg="random", scheduler={"kind": "none"}
    )
    config_file = tmp_path / "sweep.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    sweep_dir = workspace / "sweeps" / "resumed"
    # Tune saves its experiment state every few seconds here rather than on its adaptive period (which grows to
    # minutes on a loaded machine), so the first finished trial is on record soon after it ends
    env = {
        **os.environ,
        "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
        "TUNE_GLOBAL_CHECKPOINT_S": "2",
    }
    script = (
        "import sys; from albert_dist.config import load_config; from albert_dist.tune.config import "
        "FinetuneTuneConfig; from albert_dist.tune.sweep import run_sweep; "
        "run_sweep(load_config(FinetuneTuneConfig, sys.argv[1]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(config_file)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def started_unfinished() -> set[str]:
        """Trials that opened their MLflow run, which the saved state records but not as finished."""
        saved = trials_in_state(sweep_dir)
        return {
            p.parent.name
            for p in sweep_dir.glob(f"trials/*/{RUN_ID_FILE}")
            if saved.get(p.parent.name, "TERMINATED") != "TERMINATED"
        }

    try:
        deadline = time.time() + 600  # trials start slowly on a loaded machine
        while (
            not (finished_in_state(sweep_dir) and started_unfinished())
            and time.time() < deadline
            and proc.poll() is None
        ):
            time.sleep(0.5)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        finished_before, interrupted = finished_in_state(sweep_dir), started_unfinished()
        assert len(finished_before) == 1 and len(interrupted) == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    kill_time = time.time()
    outcomes_before = {p.parent.name: p.stat().st_mtime for p in sweep_dir.glob(f"trials/*/{OUTCOME_FILE}")}
    [interrupted_run] = [(sweep_dir / "trials" / t / RUN_ID_FILE).read_text().strip() for t in interrupted]

    outcome = run_sweep(load_config(FinetuneTuneConfig, config_file))
    assert len(outcome.rows) == 2 and all(r["stop_reason"] == "completed" for r in outcome.rows)
    for trial_id in finished_before:  # the finished trial was not run again
        assert outcomes_before[trial_id] < kill_time
        assert (sweep_dir / "trials" / trial_id / OUTCOME_FILE).stat().st_mtime == outcomes_before[trial_id]
    client, runs = children(outcome.tracking_uri, outcome.parent_run_id)
    trial_ids = [r.data.tags[TRIAL_TAG] for r in runs]
    assert sorted(trial_ids) == sorted(r["trial_id"] for r in outcome.rows)  # one child per trial, no duplicate
    assert all(r.info.status == "FINISHED" for r in runs)
    # the interrupted trial finished in the child run it had opened before the kill
    assert {r.info.run_id for r in runs if r.data.tags[TRIAL_TAG] in interrupted} == {interrupted_run}


@pytest.mark.slow
def test_distillation_sweep_applies_student_shape_and_distill_weights(workspace, ray_session):
    """Each trial distills the teacher into the student its parameters describe; the best config is a DistillJob."""
    import json

    import torch

    from albert_dist.model import AlbertConfig
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    teacher = workspace / "teacher"  # a classifier with its tokenizer: what fine-tuning writes
    tokenizer = load_tokenizer(workspace / "model")
    torch.manual_seed(0)
    config = AlbertConfig.from_json_file(
        workspace / "model" / "config.json", id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1}
    )
    AlbertForSequenceClassification(config).save_pretrained(teacher)
    tokenizer.save(teacher)
    job = {
        "run": {"name": "student", "output_dir": str(workspace / "runs")},
        "distill": {"teacher": str(teacher), "speed_repeats": 1},
        "data": {"train": str(workspace / "train.csv"), "dev": str(workspace / "dev.csv"), "max_seq_length": 32},
        "finetune": {"epochs": 1},
        "scaling": {"num_workers": 1, "cpus_per_worker": 0.5},
        "train": {"precision": "fp32", "batch_size": 32, "eval_every": 4, "log_every": 4, "checkpoint_every": 4},
        "tracking": {"tracking_uri": f"sqlite:///{workspace}/mlflow.db", "experiment": "distill-sweeps"},
    }
    cfg = validate_config(
        DistillTuneConfig,
        {
            "job": job,
            "run": {"name": "distill", "output_dir": str(workspace / "sweeps")},
            "search_space": {
                "student.num_hidden_layers": {"choice": [1, 2]},
                "distill.temperature": {"uniform": [1, 4]},
                "distill.alpha": {"uniform": [0.2, 0.8]},
            },
            "metric": "eval_accuracy",
            "mode": "max",
            "num_samples": 2,
            "max_concurrent_trials": 2,
            "resources_per_trial": {"num_workers": 1, "cpu": 0.5},
            "search_alg": "random",
            "scheduler": {"kind": "none"},
        },
    )
    outcome = run_sweep(cfg)

    assert len(outcome.rows) == 2 and all(r["stop_reason"] == "completed" for r in outcome.rows)
    for row in outcome.rows:  # the student each trial trained has the depth its parameters asked for
        model_config = json.loads(
            (workspace / "sweeps" / "distill" / "trials" / row["trial_id"] / "model" / "config.json").read_text()
        )
        assert model_config["num_hidden_layers"] == row["student.num_hidden_layers"]
    client, runs = children(outcome.tracking_uri, outcome.parent_run_id)
    assert len(runs) == 2
    for run in runs:
        assert 1 <= float(run.data.params["distill.temperature"]) <= 4 and "eval_accuracy" in run.data.metrics
        assert run.data.tags["albert_dist.source_model"] == str(teacher)  # lineage, as a plain distill run has
    best_job = load_config(DistillJobConfig, outcome.best_config)
    assert best_job.student.num_hidden_layers == outcome.best["student.num_hidden_layers"]
    assert best_job.distill.alpha == pytest.approx(outcome.best["distill.alpha"])


def trials_in_state(sweep_dir: Path) -> dict[str, str]:
    """Trial id → status in the sweep's saved Tune state: what a restore knows (TERMINATED ones it will not run
    again)."""
    import json

    trials = {}
    for state in sweep_dir.glob("experiment_state-*.json"):
        try:
            saved = json.loads(state.read_text())["trial_data"]
        except (OSError, ValueError, KeyError):
            continue
        for trial_json, _ in saved:
            trial = json.loads(trial_json)
            trials[trial["trial_id"]] = trial["status"]
    return trials


def finished_in_state(sweep_dir: Path) -> set[str]:
    return {trial for trial, status in trials_in_state(sweep_dir).items() if status == "TERMINATED"}


@pytest.mark.parametrize(
    "space, message",
    [
        ({"train.learning_rate": {"loguniform": [-1e-5, 1e-3]}}, "train.learning_rate: loguniform bounds must be > 0"),
        ({"train.learning_rate": {"uniform": [-1e-5, 1e-3]}}, "train.learning_rate=-1e-05 is rejected"),
        ({"finetune.warmup_ratio": {"lognormal": [0.0, 0.1]}}, "unknown distribution 'lognormal'"),
        ({"train.learning_rat": {"uniform": [1e-5, 1e-3]}}, "train.learning_rat: not a field of FinetuneJobConfig"),
        ({"finetune.epochs": {"uniform": [3, 1]}}, "lo < hi"),
        ({"train.batch_size": {"choice": [16, 0]}}, "train.batch_size=0 is rejected"),
    ],
)
def test_invalid_search_space_is_one_error_before_any_trial(workspace, space, message):
    raw = {**sweep_raw(workspace, "invalid"), "search_space": {"finetune.warmup_ratio": {"uniform": [0, 0.2]}, **space}}
    with pytest.raises(ConfigError, match="search_space") as err:
        validate_config(FinetuneTuneConfig, raw)
    assert message in str(err.value) and str(err.value).count("search_space") == 1
    assert not (workspace / "sweeps" / "invalid").exists()


def test_every_problem_of_a_space_is_in_the_one_error(workspace):
    raw = {
        **sweep_raw(workspace, "invalid"),
        "search_space": {
            "train.learning_rate": {"loguniform": [-1e-5, 1e-3]},
            "train.nope": {"choice": [1]},
            "distill.alpha": {"uniform": [0, 1]},
        },
    }
    with pytest.raises(ConfigError) as err:
        validate_config(FinetuneTuneConfig, raw)
    assert all(part in str(err.value) for part in ("loguniform bounds", "train.nope", "distill.alpha"))


@pytest.mark.parametrize(
    "name, config_class, job_class",
    [
        ("tune_finetune.yaml", FinetuneTuneConfig, FinetuneJobConfig),
        ("tune_distill.yaml", DistillTuneConfig, DistillJobConfig),
    ],
)
def test_example_sweep_configs_validate(name, config_class, job_class, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(config_class, ROOT / "albert_dist" / "configs" / name)
    assert isinstance(cfg.job, job_class) and cfg.distributions


def test_cli_has_tune_commands():
    from albert_dist.cli import build_parser

    args = build_parser().parse_args(["tune", "distill", "--config", "x.yaml", "--set", "num_samples=3"])
    assert args.action == "distill" and args.overrides == ["num_samples=3"]
