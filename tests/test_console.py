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


@pytest.mark.slow
def test_a_job_prints_our_lines_only(tmp_path, stdlib_corpus):
    from albert_dist.tokenizer import train_sentencepiece

    train_sentencepiece(stdlib_corpus, tmp_path / "tokenizer", 400, progress=lambda _: None)
    tiny_model_dir(tmp_path / "model", tmp_path / "tokenizer")
    write_csv(tmp_path / "train.csv", single_rows(128, seed=1))
    write_csv(tmp_path / "dev.csv", single_rows(32, seed=2))
    env = {k: v for k, v in os.environ.items() if k not in (VERBOSE_ENV, "RAY_ADDRESS")}
    job = subprocess.run(
        [sys.executable, "-m", "albert_dist.cli", "finetune", "--set", f"run.output_dir={tmp_path / 'runs'}",
         "--set", f"model.init_from={tmp_path / 'model'}", "--set", f"data.train={tmp_path / 'train.csv'}",
         "--set", f"data.dev={tmp_path / 'dev.csv'}", "--set", "data.max_seq_length=32",
         "--set", "finetune.epochs=2", "--set", "scaling.num_workers=1", "--set", "scaling.cpus_per_worker=0.5",
         "--set", "train.precision=fp32", "--set", "train.batch_size=16", "--set", "train.log_every=4",
         "--set", "train.eval_every=8"],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    lines = (job.stdout + job.stderr).splitlines()
    assert job.returncode == 0, "\n".join(lines[-40:])
    assert not [line for line in lines if ERROR_LINE.search(line)], "\n".join(lines)
    assert len(lines) < 30, "\n".join(lines)
    assert any("step " in line and "ETA" in line for line in lines)  # the progress lines are there
    named = [line for line in lines if line.startswith("Ray's logs: ")]
    assert len(named) == 1
    hidden = Path(named[0].split()[2])
    assert hidden.parent.is_dir() and hidden.name == "albert-dist-hidden.log"


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
