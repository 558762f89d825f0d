"""The README's main job, `albert-dist demo`, end to end in a subprocess on a reduced budget: every stage runs on
a local Ray and lands in the MLflow store it names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

REPO = Path(__file__).resolve().parent.parent


def test_demo_runs_every_stage_and_reports_where_things_are(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own local Ray, as a user gets
    sets = ["run.output_dir=" + str(tmp_path / "demo"), "corpus_chars=150000", "tokenizer.vocab_size=1000",
            "train.max_steps=20", "train.eval_every=20", "train.checkpoint_every=20", "train.eval_batches=2",
            "finetune_steps=20", "sweep_trials=2"]
    out = subprocess.run([str(Path(sys.executable).parent / "albert-dist"), "demo",
                          *[a for s in sets for a in ("--set", s)]], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=1200)
    log = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)  # without Ray's colours
    (tmp_path / "demo.log").write_text(log)  # for a look after a failure
    assert out.returncode == 0, log[-6000:]
    for stage in range(1, 7):
        assert f"[{stage}/6]" in log
    root = tmp_path / "demo"
    for model in ("demo/model", "demo-finetune/model", "demo-distill/model"):
        assert (root / model / "config.json").is_file() and (root / model / "model.safetensors").is_file()
    summary = log[log.index("=== albert-dist demo: results ==="):]
    assert re.search(r"dev accuracy\s+0\.\d+\s+0\.\d+", summary)
    assert len(re.findall(r"TERMINATED", summary)) == 2  # the sweep's two trials in the table
    assert f"MLflow: sqlite:///{root / 'mlflow.db'}" in summary and "mlflow ui --backend-store-uri" in summary

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    names = {r.info.run_name for r in runs}
    assert {"demo", "demo-finetune", "demo-distill"} <= names
    assert all(r.info.status == "FINISHED" for r in runs)
    # each progress line once (Ray Train's print redirection would send every one twice)
    progress = [line for line in log.splitlines() if re.search(r"\) step \d+/\d+ \|", line)]
    assert progress and len(progress) == len(set(progress)), progress
    assert "Reporting training result" not in log  # Ray Train's per-report INFO line, metrics dict and all
