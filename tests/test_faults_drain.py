"""A node told to drain (a spot reclaim with its two-minute warning, an autoscaler scale-down): the workers write a
checkpoint of the step reached before the deadline, the run goes on from it once a node is back, and the preemption
is not counted as a failure (the run has `max_failures=0`).

As in test_faults_node, `ray.cluster_utils.Cluster` runs in a subprocess (`python tests/test_faults_drain.py ROOT`).
The head has no CPU, so the training worker runs on the worker node, which is drained with a deadline and removed
when the deadline passes, as a cloud reclaims a spot instance; then another node joins.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster_helpers import drain, one_worker_node_cluster, run_own_cluster, train_while

from albert_dist.train.loop import TaskSpec

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

TESTS = Path(__file__).resolve().parent
MAX_STEPS = 40
DRAIN_AT_STEP = 8
DEADLINE_S = 25
STEP_AFTER_NOTICE_S = 0.25  # the steps left after the notice take 8 s, a third of the deadline


def checkpoint_steps(root: Path) -> list[int]:
    return sorted(json.loads(m.read_text())["step"] for m in root.glob("ray/*/checkpoint_*/manifest.json"))


@dataclass(frozen=True)
class CountedKeywordTask(TaskSpec):
    """test_loop's KeywordTask, counting its training steps in ROOT/steps. The first worker waits at step
    DRAIN_AT_STEP for the drain notice (ROOT/noticed), then takes STEP_AFTER_NOTICE_S a step, so that Ray's
    watcher (polling every 0.5 s) is heard well before the run could end, however fast the machine; once a
    checkpoint exists it waits to be taken down with its node. The worker of the restart runs freely."""

    root: str

    def build(self, rank, world_size, dataset):
        from test_loop import KeywordTask

        root = Path(self.root)
        first_worker = not checkpoint_steps(root)

        def wait_while(condition) -> None:
            deadline = time.time() + 300
            while condition() and time.time() < deadline:
                time.sleep(0.1)

        class Counted(KeywordTask):
            def loss(self, model, batch):
                if first_worker:
                    with open(root / "steps", "a") as steps:
                        steps.write(".")
                    if len((root / "steps").read_text()) == DRAIN_AT_STEP:
                        wait_while(lambda: not (root / "noticed").exists())
                    elif (root / "noticed").exists():
                        time.sleep(STEP_AFTER_NOTICE_S)
                    wait_while(lambda: checkpoint_steps(root))
                return super().loss(model, batch)

        return Counted()


def reclaim(cluster, node, root: Path, notify=drain) -> None:
    """At step DRAIN_AT_STEP, `notify(cluster, node, DEADLINE_S)` tells the node it goes (returns the deadline);
    the node is taken down at the deadline and another one joins."""
    steps = root / "steps"
    give_up = time.time() + 300
    while not (steps.exists() and len(steps.read_text()) >= DRAIN_AT_STEP) and time.time() < give_up:
        time.sleep(0.1)
    deadline = notify(cluster, node, DEADLINE_S)
    (root / "noticed").touch()
    print(f"drain notice at step {len(steps.read_text())}", flush=True)
    while not checkpoint_steps(root) and time.time() < deadline:
        time.sleep(0.1)
    print(f"checkpoints {checkpoint_steps(root)} with {deadline - time.time():.1f} s left", flush=True)
    time.sleep(max(0.0, deadline - time.time()))
    cluster.remove_node(node, allow_graceful=False)
    print("node reclaimed", flush=True)
    cluster.add_node(num_cpus=1)
    print("node added", flush=True)


def main(root: Path, notify=drain, cluster_and_node=None) -> None:
    from albert_dist.config import TrainSection

    cluster, node = cluster_and_node or one_worker_node_cluster()
    train = TrainSection(
        max_steps=MAX_STEPS,
        warmup_steps=2,
        log_every=10,
        eval_every=MAX_STEPS,
        checkpoint_every=MAX_STEPS,
        drain_check_every=1,
        precision="fp32",
        optimizer="adamw",
        learning_rate=2e-3,
        max_failures=0,
        resource_wait_attempts=-1,
    )

    train_while(
        cluster,
        "drain",
        root / "ray",
        CountedKeywordTask(str(root)),
        train,
        lambda: reclaim(cluster, node, root, notify),
    )


def test_a_drain_notice_checkpoints_before_the_deadline_and_the_run_goes_on(tmp_path):
    out = run_own_cluster(
        __file__,
        [str(tmp_path)],
        tmp_path,
        "rd-",
        RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S="0.5",
        RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="30",
    )
    noticed = int(re.search(r"drain notice at step (\d+)", out)[1])
    # the checkpoint of the step the notice reached, written before the deadline: the only one before the end
    written = re.search(r"checkpoints \[(\d+)\] with ([\d.]+) s left", out)
    assert written, out[-6000:]
    step = int(written[1])
    assert noticed == DRAIN_AT_STEP <= step < MAX_STEPS and float(written[2]) > 0, out[-6000:]
    assert "node reclaimed" in out and "node added" in out, out[-6000:]
    assert re.search(rf"resumed from \S+ at step {step} ", out), out[-6000:]
    # max_failures=0: had the reclaim counted as a failure, the run would have stopped with it
    assert f'RESULT {{"step": {MAX_STEPS}, ' in out, out[-6000:]
    assert checkpoint_steps(tmp_path) == [step, MAX_STEPS]


if __name__ == "__main__":
    main(Path(sys.argv[1]))
