"""A Kubernetes pod's end: SIGTERM to its `ray start --block`. With RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (the
KubeRay manifests set it), Ray drains the node with reason PREEMPTION and a deadline that far ahead, and keeps it
up until then while work runs on it: what Ray Train answers with the notice checkpoint (test_faults_preemption
shows the rest: a PREEMPTION drain with a deadline → checkpoint → the run goes on). With 0, the node goes at once
and nothing drains.

The node is its own process, built as `ray start --block` builds it (`ray._private.node.Node` with its shutdown
hooks, the SIGTERM handler among them): the `ray start` command refuses to join a cluster in the single-machine
mode that keeps every listener on loopback. Runs in a subprocess (`python tests/test_faults_sigterm.py ROOT`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cluster_helpers import connect, loopback_cluster, run_own_cluster

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

DRAIN_S = 6


def block_like_ray_start(gcs_address: str) -> None:
    """A worker node joined to `gcs_address`, whose process waits for a signal as `ray start --block` does."""
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    params = RayParams(
        node_ip_address="127.0.0.1",
        gcs_address=gcs_address,
        num_cpus=1,
        num_gpus=0,
        object_store_memory=150 * 1024 * 1024,
        min_worker_port=0,
        max_worker_port=0,
        include_log_monitor=False,
        node_manager_port=0,
    )
    params.dashboard_agent_listen_port = None
    node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    print(node.node_id, flush=True)
    while True:
        signal.pause()


def sigterm(cluster, drain_s: float) -> dict:
    """A node process with RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=`drain_s` and an actor busy on it, sent SIGTERM:
    when the GCS listed it among the draining nodes (the list Ray Train's preemption watcher polls) and with what
    deadline, and when the process ended."""
    import ray

    env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(drain_s)}
    node = subprocess.Popen(
        [sys.executable, __file__, "--node", cluster.address], env=env, stdout=subprocess.PIPE, text=True
    )
    node_id = node.stdout.readline().strip()

    @ray.remote(num_cpus=1)
    class Busy:
        def where(self) -> str:
            return ray.get_runtime_context().get_node_id()

    busy = Busy.remote()  # the only CPUs are the node's: the actor lands there, so the node is not idle
    assert ray.get(busy.where.remote(), timeout=120) == node_id
    client = ray._raylet.GcsClient(address=cluster.address)
    sent = time.time()
    node.send_signal(signal.SIGTERM)
    draining, deadline_ms = None, None
    while node.poll() is None:
        if draining is None and node_id in (drains := client.get_draining_nodes()):
            draining, deadline_ms = time.time() - sent, drains[node_id]
        time.sleep(0.05)
    ended = time.time() - sent
    ray.kill(busy)
    return {
        "drain_s": drain_s,
        "draining_after_s": draining,
        "deadline_after_s": deadline_ms / 1000 - sent if deadline_ms else None,
        "ended_after_s": ended,
    }


def main() -> None:
    cluster = loopback_cluster()
    connect(cluster)
    try:
        for drain_s in (DRAIN_S, 0):
            print("SIGTERM " + json.dumps(sigterm(cluster, drain_s)), flush=True)
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()


def test_sigterm_drains_the_node_as_a_preemption_for_the_drain_timeout(tmp_path):
    out = run_own_cluster(__file__, [], tmp_path, "rs-")
    drained, immediate = (json.loads(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith("SIGTERM "))
    # drained at once (Ray's handler sends reason PREEMPTION), with a deadline DRAIN_S ahead; up while its actor
    # ran, until the deadline
    assert drained["draining_after_s"] < 2 and abs(drained["deadline_after_s"] - DRAIN_S) < 1, drained
    assert DRAIN_S - 1 < drained["ended_after_s"] < DRAIN_S + 20, drained
    # without the setting's time, no drain: the node just goes
    assert immediate["draining_after_s"] is None and immediate["ended_after_s"] < DRAIN_S, immediate


if __name__ == "__main__":
    if sys.argv[1:2] == ["--node"]:
        block_like_ray_start(sys.argv[2])
    else:
        main()
