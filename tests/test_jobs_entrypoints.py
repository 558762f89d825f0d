"""The jobs' commands (the CLI's, which a Ray job runs as `python -m albert_dist.cli <command>`), their YAML configs
and what `albert-dist submit` sends."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from albert_dist.cli import build_parser
from albert_dist.cluster import submit as jobs_client
from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.errors import AlbertDistError, ConfigError
from albert_dist.jobs.registry import JOBS, Command, Job
from albert_dist.pretrain.config import PretrainJobConfig

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "albert_dist" / "configs"
# config file stem -> (module holding the config class, class name); the module may not exist yet
CONFIG_CLASSES = {
    "prepare_data": ("albert_dist.data.config", "DataJobConfig"),
    "pretrain_tiny": ("albert_dist.pretrain.config", "PretrainJobConfig"),
    "pretrain_base": ("albert_dist.pretrain.config", "PretrainJobConfig"),
    "pretrain_large": ("albert_dist.pretrain.config", "PretrainJobConfig"),
    "finetune": ("albert_dist.finetune.config", "FinetuneJobConfig"),
    "distill": ("albert_dist.finetune.config", "DistillJobConfig"),
    "tune_finetune": ("albert_dist.tune.config", "FinetuneTuneConfig"),
    "tune_distill": ("albert_dist.tune.config", "DistillTuneConfig"),
    "prepare_zh": ("albert_dist.data.config", "DataJobConfig"),
    "pretrain_zh": ("albert_dist.pretrain.config", "PretrainJobConfig"),
    "prepare_en": ("albert_dist.data.config", "DataJobConfig"),
    "pretrain_en": ("albert_dist.pretrain.config", "PretrainJobConfig"),
    "clue_lcqmc": ("albert_dist.finetune.config", "FinetuneJobConfig"),
    "clue_afqmc": ("albert_dist.finetune.config", "FinetuneJobConfig"),
    "clue_tnews": ("albert_dist.finetune.config", "FinetuneJobConfig"),
    "clue_iflytek": ("albert_dist.finetune.config", "FinetuneJobConfig"),
    "clue_ocnli": ("albert_dist.finetune.config", "FinetuneJobConfig"),
    "clue_csl": ("albert_dist.finetune.config", "FinetuneJobConfig"),
    "clue_cluener": ("albert_dist.finetune.config", "FinetuneJobConfig"),
    "clue_cmrc2018": ("albert_dist.finetune.config", "FinetuneJobConfig"),
    "clue_wsc": ("albert_dist.finetune.config", "FinetuneJobConfig"),
}


def config_class(stem: str):
    module, name = CONFIG_CLASSES[stem]
    return getattr(importlib.import_module(module), name)


def test_every_config_file_has_a_class():
    assert {p.stem for p in CONFIGS.glob("*.yaml")} <= set(CONFIG_CLASSES)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_config_validates(path, monkeypatch):
    monkeypatch.chdir(REPO)  # sweeps name their job's YAML relative to the checkout, as jobs run there
    cfg = load_config(config_class(path.stem), path)
    output_dir = cfg.run.output_dir if hasattr(cfg, "run") else cfg.output_dir
    assert not Path(output_dir).is_absolute()  # lands under $ALBERT_DIST_HOME on a cluster


def test_pretraining_presets_build_their_models():
    sizes = {
        stem: load_config(PretrainJobConfig, CONFIGS / f"{stem}.yaml").model.build(vocab_size=30000)
        for stem in ("pretrain_tiny", "pretrain_base", "pretrain_large")
    }
    assert [sizes[s].hidden_size for s in ("pretrain_tiny", "pretrain_base", "pretrain_large")] == [312, 768, 1024]


@pytest.mark.parametrize(
    "pretrain, prepare, capped",
    [
        ("pretrain_tiny", "prepare_data", False),
        ("pretrain_zh", "prepare_zh", False),
        ("pretrain_en", "prepare_en", False),
        # google-research/albert's setup: 20 predictions at 512 tokens
        ("pretrain_base", "prepare_data", True),
        ("pretrain_large", "prepare_data", True),
    ],
)
def test_pretraining_reads_what_its_preparation_writes_with_masks_for_its_length(pretrain, prepare, capped):
    cfg = load_config(PretrainJobConfig, CONFIGS / f"{pretrain}.yaml")
    data = load_config(DataJobConfig, CONFIGS / f"{prepare}.yaml")
    assert (cfg.run.output_dir, cfg.data.output) == (data.run.output_dir, data.data.output)
    if capped:
        assert (cfg.masking.mlm_probability, cfg.masking.max_predictions_per_seq) == (0.15, 20)
        return
    # room for every prediction its masking rate asks of a full-length sequence, rounded up by less than 8
    wanted = cfg.masking.mlm_probability * data.data.max_seq_length
    assert wanted <= cfg.masking.max_predictions_per_seq < wanted + 8, (wanted, cfg.masking.max_predictions_per_seq)


@pytest.mark.parametrize("job", JOBS.values(), ids=lambda job: job.name)
def test_job_command_help(job):
    out = subprocess.run(
        [sys.executable, "-m", "albert_dist.cli", *job.command, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "--config" in out.stdout and "--set" in out.stdout and job.help in " ".join(out.stdout.split())


@pytest.mark.parametrize("job", JOBS.values(), ids=lambda job: job.name)
def test_every_registered_job_has_its_cli_command_and_submit_entrypoint(job, monkeypatch):
    """The registry is the one job list: each job's CLI command loads the registered config class, refuses a
    relative output directory inside a Ray job without $ALBERT_DIST_HOME, runs the job's declaration, and submit
    runs that command."""
    sweep_space = ["search_space={train.learning_rate: {choice: [1e-5]}}"] if job.command[0] == "tune" else []
    overrides = ["run.output_dir=elsewhere", *sweep_space]
    args = build_parser().parse_args([*job.command, *(f"--set={item}" for item in overrides)])
    called = {}
    assert callable(job.load().main)
    # the job itself is not run
    monkeypatch.setattr(Job, "load", lambda self: Command(lambda cfg: called.update(job=self, cfg=cfg) or 0))
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.delenv("ALBERT_DIST_HOME", raising=False)
    with pytest.raises(ConfigError, match="ALBERT_DIST_HOME"):
        args.handler(args)
    assert not called
    monkeypatch.setenv("ALBERT_DIST_HOME", "/mnt/shared/albert-dist")
    assert args.handler(args) == 0
    assert called["job"] is job and type(called["cfg"]) is job.config_class()
    assert called["cfg"].run.output_dir == "elsewhere"
    assert build_parser().parse_args(["submit", job.name]).job == job.name
    assert jobs_client.entrypoint(job.command, None, []) == "python -m albert_dist.cli " + " ".join(job.command)


def test_an_unknown_job_is_refused_naming_the_registered_ones(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "pretrian"])
    err = capsys.readouterr().err
    assert "invalid choice: 'pretrian'" in err and all(f"'{name}'" in err for name in JOBS)


def test_relative_outputs_inside_a_ray_job_need_an_output_root(monkeypatch):
    from albert_dist.cli import check_output_root

    cfg = PretrainJobConfig()
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.delenv("ALBERT_DIST_HOME", raising=False)
    with pytest.raises(ConfigError, match="ALBERT_DIST_HOME"):
        check_output_root(cfg)
    check_output_root(cfg.model_copy(update={"run": cfg.run.model_copy(update={"output_dir": "/mnt/x"})}))
    monkeypatch.setenv("ALBERT_DIST_HOME", "/mnt/shared/albert-dist")
    check_output_root(cfg)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    monkeypatch.delenv("ALBERT_DIST_HOME")
    check_output_root(cfg)  # outside a job the current directory is fine


def test_runtime_env_sends_the_checkout_and_no_secret():
    env = {
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "MLFLOW_TRACKING_USERNAME": "admin",
        "MLFLOW_TRACKING_PASSWORD": "pw-123",
        "MLFLOW_TRACKING_TOKEN": "tok-456",
        "RAY_AUTH_TOKEN": "ray-789",
        "AWS_SECRET_ACCESS_KEY": "aws-000",
        "HOME": "/root",
    }
    runtime = jobs_client.runtime_env("/mnt/shared/out", REPO, env)
    assert runtime["working_dir"] == str(REPO)
    assert runtime["env_vars"] == {
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "ALBERT_DIST_HOME": "/mnt/shared/out",
        "PYTHONUNBUFFERED": "1",
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    }
    assert jobs_client.withheld_secrets(env) == [
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_TRACKING_TOKEN",
        "MLFLOW_TRACKING_USERNAME",
    ]


def test_auth_header_from_token_or_token_file(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("file-token\n")
    assert jobs_client.auth_headers({"RAY_AUTH_TOKEN_PATH": str(token_file)}) == {"Authorization": "Bearer file-token"}
    assert jobs_client.auth_headers({"RAY_AUTH_TOKEN": "env-token", "RAY_AUTH_TOKEN_PATH": str(token_file)}) == {
        "Authorization": "Bearer env-token"
    }
    assert jobs_client.auth_headers({}) == {}
    with pytest.raises(AlbertDistError, match="RAY_AUTH_TOKEN_PATH"):
        jobs_client.auth_headers({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")})


def test_entrypoint_names_the_config_as_the_job_receives_it(tmp_path):
    """A packaged config by its name (the package travels with the job); a file by its place in the job's
    working_dir; neither a name nor a file is one error naming the packaged configs."""
    command = jobs_client.entrypoint(["pretrain"], "pretrain_tiny", ["train.max_steps=5", "run.name=a b"])
    assert command == (
        "python -m albert_dist.cli pretrain --config pretrain_tiny --set train.max_steps=5 --set 'run.name=a b'"
    )
    mine = tmp_path / "mine.yaml"
    mine.write_text("run: {name: x}\n")
    assert jobs_client.entrypoint(["pretrain"], str(mine), []) == (
        "python -m albert_dist.cli pretrain --config job_config/mine.yaml"
    )
    with pytest.raises(ConfigError, match="config file not found: nothing.yaml .*pretrain_tiny"):
        jobs_client.entrypoint(["pretrain"], "nothing.yaml", [])


def test_exit_codes_follow_the_final_status():
    assert [jobs_client.exit_code(s) for s in ("SUCCEEDED", "FAILED", "STOPPED")] == [0, 1, 2]


def test_submit_needs_an_absolute_output_root():
    with pytest.raises(AlbertDistError, match="absolute"):
        jobs_client.submit("pretrain", ["pretrain"], None, [], "http://127.0.0.1:1", output_root="runs")


def test_cli_registers_submit_and_jobs():
    from albert_dist.cli import build_parser

    args = build_parser().parse_args(
        [
            "submit",
            "pretrain",
            "--config",
            "c.yaml",
            "--set",
            "a.b=1",
            "--follow",
            "--address",
            "http://127.0.0.1:8265",
            "--name",
            "n1",
        ]
    )
    assert (args.job, args.config, args.overrides, args.follow, args.name) == (
        "pretrain",
        "c.yaml",
        ["a.b=1"],
        True,
        "n1",
    )
    for action in (["list"], ["status", "x"], ["stop", "x"], ["logs", "x", "--follow"]):
        assert build_parser().parse_args(["jobs", *action]).handler


def test_submit_sends_the_jobs_command_words(monkeypatch):
    submitted = []
    monkeypatch.setattr(jobs_client, "submit", lambda *args: submitted.append(args[:3]) or 0)
    args = build_parser().parse_args(["submit", "tune-distill", "--config", "c.yaml"])
    assert args.handler(args) == 0
    assert submitted == [("tune-distill", ("tune", "distill"), "c.yaml")]


class RecordedJobs:
    """The part of `JobSubmissionClient` that `unused_submission_id` reads, answering as the dashboard does."""

    def __init__(self, statuses: dict[str, str], failure: str | None = None):
        self.statuses, self.failure = statuses, failure

    def get_job_info(self, submission_id: str):
        from types import SimpleNamespace

        if self.failure:
            raise RuntimeError(f"Request failed with status code {self.failure}.")
        if submission_id not in self.statuses:
            raise RuntimeError(f"Request failed with status code 404: Job {submission_id} does not exist.")
        return SimpleNamespace(status=SimpleNamespace(value=self.statuses[submission_id]))


def test_a_name_that_already_ran_is_submitted_as_the_next_attempt(capsys):
    assert jobs_client.unused_submission_id(RecordedJobs({}), "pretrain-1") == "pretrain-1"
    ended = RecordedJobs({"pretrain-1": "STOPPED", "pretrain-1-2": "FAILED"})
    assert jobs_client.unused_submission_id(ended, "pretrain-1") == "pretrain-1-3"
    assert "submitting this attempt as pretrain-1-3" in capsys.readouterr().out
    with pytest.raises(AlbertDistError, match="pretrain-1-2 is still RUNNING: stop it first"):
        jobs_client.unused_submission_id(
            RecordedJobs({"pretrain-1": "STOPPED", "pretrain-1-2": "RUNNING"}), "pretrain-1"
        )
    with pytest.raises(RuntimeError, match="500"):  # a dashboard error is not taken for "no such job"
        jobs_client.unused_submission_id(RecordedJobs({}, failure="500: internal error"), "x")
