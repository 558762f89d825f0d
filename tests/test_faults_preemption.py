"""A cloud's spot notice, served by a fake instance metadata service on loopback (real HTTP, IMDSv2 tokens), reaches
the run through `albert-dist cluster watch-preemption` alone: the watcher, its own process as on a cluster's node,
drains the Ray node with reason PREEMPTION and the notice's deadline, the workers write a checkpoint before it, and
the run goes on from it on a new node, the reclaim counted as no failure (`max_failures=0`).

The run, the cluster and the reclaim are test_faults_drain's (`main`, in a subprocess); only the notice differs:
there the test drains the node itself, here it only sets the metadata.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_faults_drain
from cluster_helpers import one_worker_node_cluster, run_own_cluster
from metadata_server import FakeMetadata

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

DEADLINE_S = 15  # the notice's two minutes, shortened: the steps after it take 8 s, the checkpoint ~1 s


def spot_notice_through_the_watcher(metadata: FakeMetadata):
    """A `notify` for test_faults_drain.reclaim: the spot interruption notice (to the whole second, as AWS gives
    it), then the wait for the watcher's drain, checked in the GCS."""

    def notify(cluster, node, _deadline_s: int) -> float:
        import ray

        deadline = math.ceil(time.time()) + DEADLINE_S
        when = dt.datetime.fromtimestamp(deadline, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        noticed = time.time()
        metadata.instance_action = {"action": "terminate", "time": when}
        client = ray._raylet.GcsClient(address=cluster.address)
        while node.node_id not in client.get_draining_nodes() and time.time() < noticed + 10:
            time.sleep(0.05)
        print(f"DRAINED {client.get_draining_nodes()} {time.time() - noticed:.2f} s after the notice", flush=True)
        print(f"NOTICE_DEADLINE_MS {deadline * 1000}", flush=True)
        return deadline

    return notify


def main(root: Path) -> None:
    import ray

    from albert_dist.cluster.preemption import own_node_id
    from albert_dist.errors import ConfigError

    cluster, node = one_worker_node_cluster()
    try:  # the head and the worker share 127.0.0.1: the watcher cannot tell its node by address
        own_node_id(ray._raylet.GcsClient(address=cluster.address), "127.0.0.1")
    except ConfigError as err:
        print(f"BY ADDRESS {err}", flush=True)
    watcher_log = root / "watcher.log"
    with FakeMetadata() as metadata, open(watcher_log, "w") as log:
        watcher = subprocess.Popen(
            [
                *(sys.executable, "-m", "albert_dist.cli", "cluster", "watch-preemption"),
                *("--cloud", "aws", "--aws-metadata-url", metadata.url, "--interval", "0.2"),
                *("--node-id", node.node_id),  # the GCS: the cluster this machine started, as `ray start` does
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            test_faults_drain.main(root, spot_notice_through_the_watcher(metadata), (cluster, node))
        finally:
            watcher.terminate()
            watcher.wait(timeout=30)
    print("WATCHER LOG\n" + watcher_log.read_text(), flush=True)


def test_a_spot_notice_in_the_metadata_drains_the_node_and_the_run_checkpoints_and_goes_on(tmp_path):
    out = run_own_cluster(
        __file__,
        [str(tmp_path)],
        tmp_path,
        "rp-",
        RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S="0.5",
        RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="30",
    )
    assert re.search(r"BY ADDRESS 2 alive Ray nodes at 127\.0\.0\.1 \(\w+, \w+\): name --node-id", out), out[-6000:]
    # the node drained by the watcher alone, with the notice's deadline
    drained = re.search(r"DRAINED \{'(\w+)': (\d+)\} ([\d.]+) s after the notice", out)
    assert drained, out[-6000:]
    assert int(drained[2]) == int(re.search(r"NOTICE_DEADLINE_MS (\d+)", out)[1]), out[-6000:]
    assert re.search(r"preemption watcher: node drained \(AWS spot interruption: terminate at \S+Z; [\d.]+ s", out)
    # then as test_faults_drain: the checkpoint of the step reached, before the deadline, and the run goes on
    step = int(re.search(r"checkpoints \[(\d+)\] with ([\d.]+) s left", out)[1])
    assert test_faults_drain.DRAIN_AT_STEP <= step < test_faults_drain.MAX_STEPS, out[-6000:]
    assert float(re.search(r"checkpoints \[\d+\] with ([\d.]+) s left", out)[1]) > 0, out[-6000:]
    assert re.search(rf"resumed from \S+ at step {step} ", out), out[-6000:]
    assert f'RESULT {{"step": {test_faults_drain.MAX_STEPS}, ' in out, out[-6000:]  # max_failures=0: no failure
    assert test_faults_drain.checkpoint_steps(tmp_path) == [step, test_faults_drain.MAX_STEPS]


if __name__ == "__main__":
    main(Path(sys.argv[1]))
