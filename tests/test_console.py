"""The console of a real CLI job: our lines only, short, no error-level line; Ray's lines in the file it names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from albert_dist.cli import build_parser
from albert_dist.console import VERBOSE_ENV, ProgressLine
from finetune_helpers import single_rows, tiny_model_dir, write_csv

# error-level lines as Ray (C++ `E1130 12:00:00 ... core_worker.cc:…`, Python `ERROR`) and Python print them
ERROR_LINE = re.compile(r"(^|\) )E\d{4} |\bERROR\b|Traceback \(most recent call last\)|core_worker\.cc")


def run_cli(*args: str, cwd: Path) -> list[str]:
    """A command's console lines (stdout and stderr); asserts that it succeeded."""
    env = {k: v for k, v in os.environ.items() if k not in (VERBOSE_ENV, "RAY_ADDRESS")}
    job = subprocess.run([sys.executable, "-m", "albert_dist.cli", *args], capture_output=True, text=True, env=env,
                         timeout=600, cwd=cwd)
    lines = (job.stdout + job.stderr).splitlines()
    assert job.returncode == 0, "\n".join(lines[-40:])
    return lines


def assert_quiet(lines: list[str], most: int) -> None:
    """No error-level line, few lines, and the one line that says where Ray's lines went."""
    assert not [line for line in lines if ERROR_LINE.search(line)], "\n".join(lines)
    assert len(lines) < most, "\n".join(lines)
    named = [line for line in lines if line.startswith("Ray's logs: ")]
    assert len(named) == 1, "\n".join(lines)
    hidden = Path(named[0].split()[2])
    assert hidden.parent.is_dir() and hidden.name == "albert-dist-hidden.log"


@pytest.mark.slow
def test_data_preparation_and_fine_tuning_print_our_lines_only(tmp_path, stdlib_corpus):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(stdlib_corpus.read_text()[:80_000])
    lines = run_cli("data", "prepare", "--set", f"run.output_dir={tmp_path}", "--set", f"data.inputs=[{corpus}]",
                    "--set", "data.output=prepared", "--set", "tokenizer.vocab_size=400", cwd=tmp_path)
    assert_quiet(lines, most=40)  # with our 25-line summary
    assert any(line.startswith("data: wrote ") for line in lines)

    tiny_model_dir(tmp_path / "model", tmp_path / "prepared" / "tokenizer")
    write_csv(tmp_path / "train.csv", single_rows(128, seed=1))
    write_csv(tmp_path / "dev.csv", single_rows(32, seed=2))
    lines = run_cli("finetune", *[arg for setting in [
        f"run.output_dir={tmp_path / 'runs'}", f"model.init_from={tmp_path / 'model'}",
        f"data.train={tmp_path / 'train.csv'}", f"data.dev={tmp_path / 'dev.csv'}", "data.max_seq_length=32",
        "finetune.epochs=2", "scaling.num_workers=1", "scaling.cpus_per_worker=0.5", "train.precision=fp32",
        "train.batch_size=16", "train.log_every=4", "train.eval_every=8"] for arg in ("--set", setting)],
        cwd=tmp_path)
    assert_quiet(lines, most=30)
    assert any("step " in line and "ETA" in line for line in lines)  # the progress lines are there


def test_verbose_is_a_flag_of_every_job_and_of_the_command(monkeypatch):
    parser = build_parser()
    assert parser.parse_args(["--verbose", "finetune"]).verbose
    assert parser.parse_args(["pretrain", "--verbose"]).verbose
    assert not getattr(parser.parse_args(["finetune"]), "verbose", False)


def test_progress_line_has_rate_share_and_eta():
    printed = []
    progress = ProgressLine("data", every_s=0.0, print_fn=printed.append)
    progress.update(1000, done=0.25)
    assert re.fullmatch(r"data: 1,000 rows \([\d,]+/s\) \| 25% \| ETA \S+", printed[-1])
