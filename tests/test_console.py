"""The console's pieces: the --verbose flag and the progress line. That a real job prints our lines only is asserted
on the demo's console (tests/test_demo.py), which runs every stage."""

from __future__ import annotations

import re

from albert_dist.cli import build_parser
from albert_dist.console import ProgressLine


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
