"""A node removed from a running cluster: training continues from the last checkpoint once a node is back, and
fails with a clear message in bounded time when none comes back.

`ray.cluster_utils.Cluster` is a Ray of its own (head + worker node processes), so it runs in a subprocess, apart
from the session's in-process Ray: `python tests/test_faults_node.py ROOT` is that subprocess. The head has no CPU,
so the training worker can only run on the worker node, which is removed after the first checkpoint and replaced.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
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
    import ray
    from ray.cluster_utils import Cluster

    from albert_dist.config import ScalingSection, TrainSection
    from albert_dist.errors import AlbertDistError
    from albert_dist.train.ray_runner import run_training

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    node = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=True)
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

    def fit() -> None:
        try:
            result = run_training(
                name="node",
                storage_path=storage,
                task=HeldKeywordTask(str(root)),
                train=train,
                scaling=ScalingSection(num_workers=1, cpus_per_worker=1),
                seed=0,
            )
        except AlbertDistError as err:
            print(f"ERROR {err}", flush=True)
            return
        print("RESULT " + json.dumps({"step": result.metrics["step"]}), flush=True)

    training = threading.Thread(target=fit)
    training.start()
    try:
        replace_node_after_first_checkpoint(cluster, node, root, comes_back)
        training.join()
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.parametrize("comes_back", [True, False], ids=["node-returns", "node-never-returns"])
def test_training_survives_a_removed_node(tmp_path, comes_back):
    # Its own Ray temp dir: a Cluster announces itself in $RAY_TMPDIR/ray/ray_current_cluster, where any other
    # ray.init() on the machine would find it. Short, for the socket paths.
    ray_tmp = tempfile.mkdtemp(prefix="rn-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # not the session's Ray
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS)]),
        RAY_TMPDIR=ray_tmp,
        RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="30" if comes_back else "10",
    )
    try:
        run = subprocess.run(
            [sys.executable, __file__, str(tmp_path), str(comes_back)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out = run.stdout + run.stderr
    (tmp_path / "output.txt").write_text(out)
    assert run.returncode == 0, out[-6000:]
    assert "node removed" in out, out[-6000:]
    assert "training workers on it: 1, not gone within 60 s: 0" in out, out[-6000:]  # the fault hit it
    if comes_back:
        assert "node added" in out, out[-6000:]
        assert re.search(r"resumed from \S+ at step 10 ", out), out[-6000:]  # the first checkpoint: mid-run
        assert f'RESULT {{"step": {MAX_STEPS}}}' in out, out[-6000:]
    else:  # a clear message in bounded time, the checkpoint kept for a later relaunch
        assert "ERROR training 'node' could not get its workers' resources back" in out, out[-6000:]
        assert any((tmp_path / "ray" / "node").glob("checkpoint_*/manifest.json"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] == "True")
