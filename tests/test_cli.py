"""The command line: subcommands exist and document themselves; user errors are one line, not a traceback."""

import subprocess
import sys

import pytest

from albert_dist.cli import build_parser, main

COMMANDS = ["tokenizer", "data", "pretrain", "finetune", "distill", "predict", "tune", "demo", "submit", "jobs"]


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert f"    {command}" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["tokenizer", "train"],
        ["data", "prepare"],
        ["pretrain"],
        ["finetune"],
        ["distill"],
        ["predict"],
        ["tune", "finetune"],
        ["demo"],
        ["submit"],
        ["jobs", "list"],
    ],
)
def test_each_subcommand_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*argv, "--help"])
    assert exit_info.value.code == 0
    assert "usage: albert-dist" in capsys.readouterr().out


def test_config_errors_are_one_line_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  learning_rate: -1\n")
    result = subprocess.run(
        [sys.executable, "-m", "albert_dist.cli", "pretrain", "--config", str(bad), "--set", "model.hidden_size=100"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"albert-dist: error: invalid config ({bad}): train.learning_rate: Input should be greater than 0 (got -1)"
    ]
    assert "Traceback" not in result.stderr


def test_missing_tokenizer_input_is_named(tmp_path, capsys):
    assert (
        main(
            [
                "tokenizer",
                "train",
                "--input",
                str(tmp_path / "nope.txt"),
                "--vocab-size",
                "100",
                "--out",
                str(tmp_path / "tok"),
            ]
        )
        == 2
    )
    assert "nope.txt" in capsys.readouterr().err
