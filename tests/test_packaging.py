"""The package on its own: configs shipped as package data and found by name, `albert-dist config list | show | init
| schema`, `--version`, and an `import albert_dist` that loads neither torch nor Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import tomllib
import yaml

from albert_dist.cli import main
from albert_dist.config import PACKAGED_CONFIGS, config_path, load_config
from albert_dist.errors import ConfigError
from albert_dist.jobs import catalog
from albert_dist.pretrain.config import PretrainJobConfig
from albert_dist.tune.config import FinetuneTuneConfig

REPO = Path(__file__).resolve().parent.parent


def test_the_configs_are_package_data_of_the_package():
    assert PACKAGED_CONFIGS.parent == REPO / "albert_dist"
    names = {p.stem for p in PACKAGED_CONFIGS.glob("*.yaml")}
    assert {"pretrain_zh", "prepare_zh", "finetune", "tune_finetune"} <= names
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "configs/*.yaml" in package_data["albert_dist"]
    assert not (REPO / "jobs" / "configs").exists()


def test_a_config_is_a_path_or_a_packaged_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the checkout: the name alone finds it
    by_name = load_config(PretrainJobConfig, "pretrain_zh", ["train.max_steps=300"])
    assert by_name == load_config(PretrainJobConfig, PACKAGED_CONFIGS / "pretrain_zh.yaml", ["train.max_steps=300"])
    assert by_name.train.max_steps == 300 and by_name.run.name == "albert-tiny-zh"
    assert config_path("pretrain_zh.yaml") == PACKAGED_CONFIGS / "pretrain_zh.yaml"
    (tmp_path / "pretrain_zh").write_text("run: {name: mine}\n")  # a file of that name wins
    assert load_config(PretrainJobConfig, "pretrain_zh").run.name == "mine"
    with pytest.raises(ConfigError, match=r"config file not found: nothing_here .*pretrain_zh"):
        load_config(PretrainJobConfig, "nothing_here")
    with pytest.raises(ConfigError, match="config file not found: sub/pretrain_zh"):
        load_config(PretrainJobConfig, "sub/pretrain_zh")  # a path with a folder is a path, never a name


def test_a_config_given_as_a_dict_or_an_object_takes_overrides():
    base = load_config(PretrainJobConfig, "pretrain_tiny")
    from_object = load_config(PretrainJobConfig, base, {"train.max_steps": 90, "model.hidden_size": 48})
    from_dict = load_config(PretrainJobConfig, base.model_dump(), ["train.max_steps=90", "model.hidden_size=48"])
    assert from_object == from_dict
    assert (from_object.train.max_steps, from_object.model.hidden_size) == (90, 48)
    assert base.train.max_steps != 90  # the object given is left as it was
    with pytest.raises(ConfigError, match="train.max_stepz"):
        load_config(PretrainJobConfig, {}, {"train.max_stepz": 3})


def test_a_sweep_names_its_job_by_a_packaged_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = load_config(FinetuneTuneConfig, "tune_finetune")
    assert sweep.job.run.name == load_config(type(sweep.job), "finetune").run.name


def test_config_list_show_and_init(tmp_path, capsys):
    assert main(["config", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == sorted(p.stem for p in PACKAGED_CONFIGS.glob("*.yaml"))
    assert any(line.startswith("pretrain_zh") and "Chinese ALBERT tiny" in line for line in listed)

    assert main(["config", "show", "pretrain_zh"]) == 0
    assert capsys.readouterr().out == (PACKAGED_CONFIGS / "pretrain_zh.yaml").read_text()

    assert main(["config", "init", "pretrain_zh", str(tmp_path)]) == 0
    copied = tmp_path / "pretrain_zh.yaml"
    assert copied.read_text() == (PACKAGED_CONFIGS / "pretrain_zh.yaml").read_text()
    copied.write_text("run: {name: edited}\n")
    assert main(["config", "init", "pretrain_zh", str(copied)]) == 2  # an edited copy is not overwritten
    assert "exists; pass --force" in capsys.readouterr().err
    assert copied.read_text() == "run: {name: edited}\n"
    assert main(["config", "init", "pretrain_zh", str(copied), "--force"]) == 0
    assert copied.read_text() == (PACKAGED_CONFIGS / "pretrain_zh.yaml").read_text()
    assert main(["config", "show", "no_such_config"]) == 2
    assert "config file not found: no_such_config" in capsys.readouterr().err


@pytest.mark.parametrize("job", ["prepare_data", "pretrain", "finetune", "distill", "tune-finetune"])
def test_the_schema_accepts_the_packaged_configs_and_catches_a_wrong_key(job, tmp_path, capsys):
    """The schema an editor reads, generated from the job's pydantic model: the shipped configs of that job
    pass it, a misspelt key and a value of the wrong type do not."""
    out = tmp_path / f"{job}.schema.json"
    assert main(["config", "schema", job, "--output", str(out)]) == 0
    schema = json.loads(out.read_text())
    assert capsys.readouterr().out == f"wrote {out}\n"
    assert main(["config", "schema", job]) == 0
    assert json.loads(capsys.readouterr().out) == schema
    validator = jsonschema.Draft202012Validator(schema)
    stems = {
        "prepare_data": ["prepare_data", "prepare_zh", "prepare_en"],
        "pretrain": ["pretrain_tiny", "pretrain_zh", "pretrain_base"],
        "finetune": ["finetune", "clue_lcqmc", "clue_cluener"],
        "distill": ["distill"],
        "tune-finetune": [],  # its `job:` is a name the schema cannot follow; an inline job is checked
    }[job]
    for stem in stems:
        document = yaml.safe_load((PACKAGED_CONFIGS / f"{stem}.yaml").read_text())
        assert not list(validator.iter_errors(document)), stem
    wrong_key = {"run": {"nmae": "x"}}
    assert any("nmae" in error.message for error in validator.iter_errors(wrong_key))
    assert list(validator.iter_errors({"run": {"seed": "not a number"}}))
    assert schema["properties"]["run"] and schema["title"] == f"albert-dist {job}"


def test_schema_of_a_sweep_describes_its_inline_job():
    schema = catalog.schema("tune-finetune")
    document = {"job": {"finetune": {"epochs": 2}}, "search_space": {}}
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(document))


def test_version_is_the_package_metadata_version(capsys):
    from importlib.metadata import version

    import albert_dist

    assert albert_dist.__version__ == version("albert-dist")
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"albert-dist {version('albert-dist')}"


def test_the_api_names_stay_functions_when_their_subpackages_are_imported():
    """`albert_dist.pretrain` and `albert_dist.finetune` are subpackages as well as the API's functions: a job run
    imports them, and `from albert_dist import pretrain` in a notebook's next cell is still the function."""
    code = (
        "import albert_dist, albert_dist.pretrain.job, albert_dist.finetune.config; "
        "from albert_dist import pretrain, finetune; from albert_dist.pretrain.config import PretrainJobConfig; "
        "from albert_dist.finetune import job; "
        "print(pretrain.__module__, finetune.__module__, albert_dist.pretrain.__name__, job.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split() == ["albert_dist.api", "albert_dist.api", "pretrain", "albert_dist.finetune.job"]


def test_importing_the_package_loads_neither_torch_nor_ray():
    """`import albert_dist` and a look at its API's names stay light; the API's functions import the job's
    modules when called (python -X importtime would show the same list)."""
    code = (
        "import sys, albert_dist; albert_dist.__version__; "
        "heavy = sorted(m for m in ('torch', 'ray', 'mlflow', 'pyarrow', 'transformers') if m in sys.modules); "
        "print(heavy); from albert_dist import pretrain; print(pretrain.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split("\n")[:2] == ["[]", "albert_dist.api"]


@pytest.mark.parametrize("name", ["prepare", "pretrain", "finetune", "distill", "sweep"])
def test_each_api_job_validates_its_config_before_running(name, tmp_path, monkeypatch):
    """The API's jobs are the registry's: a misspelt key is the job's own one ConfigError, before any work."""
    import albert_dist

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"run\.nmae"):
        getattr(albert_dist, name)(None, {"run.nmae": "x"})
    assert list(tmp_path.iterdir()) == []


def test_api_predict_writes_what_the_cli_writes(stdlib_corpus, tmp_path, capsys):
    from test_serve import classifier_dir

    from albert_dist import predict

    model = classifier_dir(tmp_path / "model", stdlib_corpus)
    (tmp_path / "in.csv").write_text("text\nthe module returns a list\nraise an error\n")
    assert predict(model, tmp_path / "in.csv", tmp_path / "api.jsonl", device="cpu") == 2
    assert (
        main(
            ["predict", "--model", str(model), "--input", str(tmp_path / "in.csv")]
            + ["--output", str(tmp_path / "cli.jsonl"), "--device", "cpu"]
        )
        == 0
    )
    assert (tmp_path / "api.jsonl").read_text() == (tmp_path / "cli.jsonl").read_text()
    assert (tmp_path / "api.jsonl").read_text().count("\n") == 2
