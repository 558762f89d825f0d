"""The command line: subcommands exist and document themselves; user errors are one line, not a traceback."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import sets

from albert_dist.cli import build_parser, main

COMMANDS = [
    "tokenizer",
    "data",
    "pretrain",
    "lr-range",
    "finetune",
    "distill",
    "predict",
    "tune",
    "demo",
    "submit",
    "jobs",
]


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
        ["lr-range"],
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


def _broken_jsonl(path):
    lines = [json.dumps({"text": f"Line {i} opens the document. A second sentence follows it."}) for i in range(300)]
    lines[250] = '{"text": broken'
    path.write_text("\n".join(lines) + "\n")
    return re.escape(f"{path}:251: not valid JSON (Expecting value at column 10)")


def _gbk_text(path):
    path.write_bytes("".join(f"第{i}段。今天天气很好。我们去公园散步。\n\n" for i in range(300)).encode("gbk"))
    # the count is of the first range that met it (data.range_bytes cuts the file)
    return (
        re.escape(f"{path}: not UTF-8 text (")
        + r"[\d,]+ of [\d,]+"
        + re.escape(
            " characters cannot be decoded or are NULs); it reads as Chinese in GB18030 (GBK, GB2312; Big5 if it is Traditional "
            "Chinese): convert it with iconv -f GB18030 -t UTF-8 FILE > NEW_FILE"
        )
    )


@pytest.mark.parametrize("write_bad", [_broken_jsonl, _gbk_text], ids=["broken-jsonl", "gbk-text"])
def test_bad_data_met_inside_ray_tasks_is_one_line_without_traceback(tmp_path, write_bad):
    """A broken JSONL line, or a corpus in GBK, met by the Ray Data tasks that sample the tokenizer's sentences
    (before any instance is built): the command's whole error output is our one line, without Ray's tracebacks or
    retry advice, and nothing is published."""
    bad = tmp_path / ("bad.jsonl" if write_bad is _broken_jsonl else "bad.txt")
    pattern = write_bad(bad)
    config = Path(__file__).resolve().parent.parent / "albert_dist" / "configs" / "prepare_data.yaml"
    items = [
        f"data.inputs=[{bad}]",
        f"run.output_dir={tmp_path / 'out'}",
        "tokenizer.vocab_size=100",
        "data.range_bytes=8000",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "albert_dist.cli", "data", "prepare", "--config", str(config), *sets(*items)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert re.fullmatch("albert-dist: error: " + pattern, line), line
    assert "Traceback" not in result.stdout
    assert not (tmp_path / "out" / "data" / "prepared").exists()


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
