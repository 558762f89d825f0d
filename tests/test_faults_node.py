"""A node removed from a running cluster: training continues from the last checkpoint once a node is back, and
fails with a clear message in bounded time when none comes back.

`ray.cluster_utils.Cluster` is a Ray of its own (head + worker node processes), so it runs in a subprocess, apart
from the session's in-process Ray: `python tests/test_faults_node.py ROOT` is that subprocess. The head has no CPU,
so the training worker can only run on the worker node, which is removed after the first checkpoint and replaced.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster_helpers import one_worker_node_cluster, run_own_cluster, train_while
from process_helpers import train_workers_of, wait_until_gone

from albert_dist.train.loop import TaskSpec

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

TESTS = Path(__file__).resolve().parent
MAX_STEPS = 30


@dataclass(frozen=True)
class HeldKeywordTask(TaskSpec):
    """test_loop's KeywordTask. The first worker is held after its first checkpoint until its node's removal kills
    it, so the fault always lands mid-run however slow the machine (released once the node was gone, a worker
    could outlive its raylet long enough to finish the run); the worker of the restart runs freely."""

    root: str

    def build(self, rank, world_size, dataset):
        from test_loop import KeywordTask

        root = Path(self.root)
        first_worker = not any(root.glob("ray/*/checkpoint_*/manifest.json"))

        class Held(KeywordTask):
            def loss(self, model, batch):
                deadline = time.time() + 300
                while first_worker and any(root.glob("ray/*/checkpoint_*/manifest.json")) and time.time() < deadline:
                    time.sleep(0.2)
                return super().loss(model, batch)

        return Held()


def replace_node_after_first_checkpoint(cluster, node, root: Path, comes_back: bool, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not any(root.glob("ray/*/checkpoint_*/manifest.json")):
        if time.time() > deadline:
            return
        time.sleep(0.2)
    workers = train_workers_of(os.getpid())
    cluster.remove_node(node, allow_graceful=False)
    print("node removed", flush=True)
    print(f"training workers on it: {len(workers)}, not gone within 60 s: {len(wait_until_gone(workers))}", flush=True)
    if comes_back:
        time.sleep(5)
        cluster.add_node(num_cpus=1)
        print("node added", flush=True)


def main(root: Path, comes_back: bool) -> None:
    """Training runs in a thread; the main thread changes the nodes (Ray starts a node from the main thread only)."""
    from albert_dist.config import TrainSection

    cluster, node = one_worker_node_cluster()
    storage = root / "ray"
    train = TrainSection(
        max_steps=MAX_STEPS,
        warmup_steps=2,
        log_every=10,
        eval_every=10,
        checkpoint_every=10,
        precision="fp32",
        optimizer="adamw",
        learning_rate=2e-3,
        max_failures=2,
        resource_wait_attempts=-1 if comes_back else 1,
    )

    train_while(
        cluster,
        "node",
        storage,
        HeldKeywordTask(str(root)),
        train,
        lambda: replace_node_after_first_checkpoint(cluster, node, root, comes_back),
    )


@pytest.mark.parametrize("comes_back", [True, False], ids=["node-returns", "node-never-returns"])
def test_training_survives_a_removed_node(tmp_path, comes_back):
    out = run_own_cluster(
        __file__,
        [str(tmp_path), str(comes_back)],
        tmp_path,
        "rn-",
        RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="30" if comes_back else "10",
    )
    assert "node removed" in out, out[-6000:]
    assert "training workers on it: 1, not gone within 60 s: 0" in out, out[-6000:]  # the fault hit it
    if comes_back:
        assert "node added" in out, out[-6000:]
        assert re.search(r"resumed from \S+ at step 10 ", out), out[-6000:]  # the first checkpoint: mid-run
        assert f'RESULT {{"step": {MAX_STEPS}, ' in out, out[-6000:]
    else:  # a clear message in bounded time, the checkpoint kept for a later relaunch
        assert "ERROR training 'node' could not get its workers' resources back" in out, out[-6000:]
        assert any((tmp_path / "ray" / "node").glob("checkpoint_*/manifest.json"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] == "True")
