"""Fine-tuning under a fault injected for real: a SIGINT (a terminal's Ctrl-C) to a running `albert-dist finetune`.
Apart from test_finetune_ray.py so that the two run side by side (pytest-xdist gives each process whole files)."""

from __future__ import annotations

from pathlib import Path

import pytest
from driver_helpers import interrupted_then_relaunched, launch
from test_finetune_ray import workspace  # noqa: F401 - a fixture (its own instance in this module)

pytestmark = pytest.mark.slow

# 512 rows, 6 epochs of 16 steps on 2 workers, a checkpoint every 16: the interrupt lands after the first, with
# steps left to train (checkpoints are uploaded beside training)
STEPS = 96


def finetune_overrides(root: Path, name: str) -> list[str]:
    return [
        f"run.output_dir={root / 'runs'}",
        f"run.name={name}",
        f"model.init_from={root / 'pretrain_run' / 'model'}",
        f"data.train={root / 'train.csv'}",
        f"data.dev={root / 'dev.jsonl'}",
        "data.max_seq_length=32",
        "finetune.epochs=6",
        "scaling.num_workers=2",
        "scaling.cpus_per_worker=0.5",
        "train.precision=fp32",
        "train.learning_rate=1e-3",
        "train.batch_size=16",
        "train.log_every=8",
        "train.eval_every=32",
        "train.checkpoint_every=16",
        "train.max_failures=0",
        f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}",
    ]


def test_ctrl_c_stops_a_finetune_as_the_users_and_a_relaunch_resumes_it(workspace, ray_session):  # noqa: F811
    """A real SIGINT to the running `albert-dist finetune`'s process group once a checkpoint is stored
    (`driver_helpers.interrupted_then_relaunched`: exit 130 saying so, the MLflow run KILLED, no model, the stored
    checkpoints whole, the relaunch resumed from the newest at its step, the run FINISHED): the relaunch trains to
    the last step and publishes the fine-tuned model (fine-tuning publishes the best evaluation's as it goes: the
    interrupted run may have published one already)."""
    run_dir = workspace / "runs" / "interrupted"
    _, out = interrupted_then_relaunched(
        lambda: launch("finetune", finetune_overrides(workspace, "interrupted")),
        run_dir,
        f"sqlite:///{workspace / 'mlflow.db'}",
        STEPS,
    )
    assert f"done: step {STEPS};" in out, out[-3000:]
    assert (run_dir / "model" / "model.safetensors").is_file() and (run_dir / "model" / "config.json").is_file()
