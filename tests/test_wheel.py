"""The wheel works alone: built from this checkout, installed into a fresh virtual environment outside it (torch's CPU
wheel and the wheel's own requirements from PyPI, nothing else), it answers `albert-dist --version` and `config show
pretrain_zh`, prepares a small Chinese corpus and pretrains on it from the packaged configs by their names, with
MLflow's system metrics in the run; then docs/python-api.md's notebook cell, as written, does the same through the
Python API."""

from __future__ import annotations

import re
import time
import zipfile
from importlib.metadata import version
from pathlib import Path

import mlflow
import pytest
from chinese_helpers import zh_corpus
from venv_helpers import clean_env, fresh_venv, run

from albert_dist.tracking import models

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

REPO = Path(__file__).resolve().parent.parent
# The notebook cell's shrunken model, for the command line's run
TINY = [
    "scaling.num_workers=1",
    "train.precision=fp32",
    "model.embedding_size=32",
    "model.hidden_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.intermediate_size=128",
    "train.max_steps=20",
    "train.warmup_steps=2",
    "train.eval_every=20",
    "train.checkpoint_every=20",
]


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def notebook_cell() -> str:
    cells = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "python-api.md").read_text(), flags=re.S)
    assert len(cells) == 1, "docs/python-api.md holds one Python cell, the one this test runs"
    return cells[0]


def system_metric_keys(store: Path, experiment: str) -> set[str]:
    client = mlflow.MlflowClient(f"sqlite:///{store}")
    (found,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return {key for key in found.data.metrics if key.startswith("system/")}


def test_the_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    start = time.perf_counter()
    wheel = Path(models._package()[0][0])  # built from a copy of the sources, as a logged model carries it
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.startswith("albert_dist/configs/")}
    assert {f"albert_dist/configs/{p.name}" for p in (REPO / "albert_dist" / "configs").glob("*.yaml")} == shipped

    venv, work = tmp_path / "venv", tmp_path / "work"
    assert REPO not in venv.parents and REPO not in work.parents
    work.mkdir()
    # a short run still samples its system; one torch thread a process, as scripts/run_tests.sh gives the suite's
    env = clean_env(MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL="1", OMP_NUM_THREADS="1")
    pip = fresh_venv(venv, env, tmp_path)
    run([*pip, str(wheel)], tmp_path, env, 1500)
    setup_s = time.perf_counter() - start
    cli, python = str(venv / "bin" / "albert-dist"), str(venv / "bin" / "python")

    installed = run(
        [python, "-c", "import albert_dist; print(albert_dist.__file__, albert_dist.__version__)"], work, env, 60
    )
    location, installed_version = installed.split()
    assert Path(location).is_relative_to(venv) and installed_version == version("albert-dist")
    assert run([cli, "--version"], work, env, 120) == f"albert-dist {version('albert-dist')}\n"
    shown = run([cli, "config", "show", "pretrain_zh"], work, env, 120)
    assert shown == (REPO / "albert_dist" / "configs" / "pretrain_zh.yaml").read_text()

    zh_corpus(work / "zh_corpus.txt")
    prepare = ["--config", "prepare_zh", "--set", "run.output_dir=cli", "--set", "data.inputs=[zh_corpus.txt]"]
    prepare += sets(["data.max_seq_length=64", "tokenizer.vocab_size=500"])
    run([cli, "data", "prepare", *prepare], work, env, 600)
    pretrained = run(
        [cli, "pretrain", "--config", "pretrain_zh", "--set", "run.output_dir=cli", *sets(TINY)], work, env, 900
    )
    model = work / "cli" / "albert-tiny-zh" / "model"
    assert (model / "config.json").is_file() and (model / "vocab.txt").is_file(), pretrained[-2000:]
    assert "system/cpu_utilization_percentage" in system_metric_keys(work / "cli" / "mlflow.db", "albert-pretrain-zh")
    cli_s = time.perf_counter() - start - setup_s

    printed = run([python, "-c", notebook_cell()], work, env, 1500)
    assert re.search(r"^\d+ instances, \d+ tokens$", printed, flags=re.M), printed[-2000:]
    line = re.search(r"^(\S+) MLM accuracy (\S+) MLflow run (\w+)$", printed, flags=re.M)
    assert line, printed[-2000:]
    assert Path(line[1]) == work / "runs" / "notebook-zh" / "model" and (Path(line[1]) / "config.json").is_file()
    assert 0 <= float(line[2]) <= 1
    assert "system/cpu_utilization_percentage" in system_metric_keys(work / "runs" / "mlflow.db", "albert-pretrain-zh")
    print(
        f"fresh environment {setup_s:.0f} s; CLI prepare + pretrain {cli_s:.0f} s; the notebook cell "
        f"{time.perf_counter() - start - setup_s - cli_s:.0f} s"
    )
