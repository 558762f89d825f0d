"""The console's pieces: the --verbose flag and the progress line. That a real job prints our lines only is asserted
on the demo's console (tests/test_demo.py), which runs every stage."""

from __future__ import annotations

import re

from albert_dist.cli import build_parser
from albert_dist.console import ProgressLine, format_duration


def test_verbose_is_a_flag_of_every_job_and_of_the_command(monkeypatch):
    parser = build_parser()
    assert parser.parse_args(["--verbose", "finetune"]).verbose
    assert parser.parse_args(["pretrain", "--verbose"]).verbose
    assert not getattr(parser.parse_args(["finetune"]), "verbose", False)


def test_progress_line_has_rate_share_and_eta():
    printed = []
    progress = ProgressLine("data", every_s=0.0, print_fn=printed.append)
    progress.update(1000, done=0.25)
    assert re.fullmatch(r"data: 1,000 rows \([\d,]+/s\) \| 25% \| ETA \d+:\d\d", printed[-1])


def test_progress_line_counts_against_a_total_in_its_unit():
    printed = []
    progress = ProgressLine("sweep", unit="trials", total=8, every_s=0.0, print_fn=printed.append)
    progress.start -= 300  # 3 trials in 5 minutes: 5 more take 8:20
    progress.update(3)
    assert printed == ["sweep: 3/8 trials (0.010/s) | 38% | ETA 8:20"]


def test_progress_line_prints_at_most_every_interval_and_at_the_end():
    printed = []
    progress = ProgressLine("predict", total=10_000, every_s=3600.0, print_fn=printed.append)
    for _ in range(10):
        progress.update(1000)
    assert printed == []
    progress.finish()
    assert re.fullmatch(r"predict: 10,000/10,000 rows \([\d,]+/s\) \| 100% \| ETA 0:00", printed[-1])
    assert len(printed) == 1


def test_progress_line_without_a_share_has_no_eta():
    printed = []
    ProgressLine("data", unit="instances", print_fn=printed.append).finish()
    assert printed == ["data: 0 instances (0/s)"]


def test_one_duration_format_for_seconds_minutes_and_hours():
    assert [format_duration(s) for s in (0, 12.7, 65, 3599, 3600, 3723, 90_000)] == [
        "0:00",
        "0:12",
        "1:05",
        "59:59",
        "1:00:00",
        "1:02:03",
        "25:00:00",
    ]
    assert format_duration(float("inf")) == format_duration(float("nan")) == format_duration(-1) == "?"
