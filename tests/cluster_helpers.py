"""Job arguments shared by the cluster tests: a small corpus prepared fast, a tiny model trained a few steps."""

from __future__ import annotations

from process_helpers import require_mark


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def prepare_args(corpus) -> list[str]:
    return [
        "--config",
        "albert_dist/configs/prepare_data.yaml",
        *sets(
            f"data.inputs=[{corpus}]",
            "data.format=blocks",
            "data.max_seq_length=64",
            "data.dupe_factor=1",
            "data.eval_fraction=0.1",
            "data.tokenizer_actors=1",
            "tokenizer.vocab_size=1000",
        ),
    ]


def pretrain_args(name: str, steps: int) -> list[str]:
    """Hidden 64, 2 layers, fp32, 2 Train workers of half a CPU; one evaluation, at the end."""
    return [
        "--config",
        "albert_dist/configs/pretrain_tiny.yaml",
        *sets(
            f"run.name={name}",
            "model.hidden_size=64",
            "model.num_hidden_layers=2",
            "model.num_attention_heads=2",
            "model.intermediate_size=128",
            "train.precision=fp32",
            "scaling.num_workers=2",
            "scaling.cpus_per_worker=0.5",
            f"train.max_steps={steps}",
            "train.warmup_steps=2",
            "train.batch_size=8",
            "train.log_every=4",
            f"train.eval_every={steps}",
            f"train.checkpoint_every={steps // 2}",
            "train.eval_batches=2",
        ),
    ]


def train_while(cluster, name: str, storage, task, train, change_nodes, scaling=None, **run_args) -> None:
    """A training run on `cluster` (one worker of one CPU unless `scaling`) in a thread while the main thread
    changes its nodes (Ray starts a node from the main thread only); prints `RESULT {"step": N, "loss": L}` or
    `ERROR message` for the test to read. `run_args`: more arguments of `run_training`."""
    import json
    import threading

    import ray
    from checkpoint_helpers import training_plan

    from albert_dist.config import ScalingSection
    from albert_dist.errors import AlbertDistError
    from albert_dist.train.ray_runner import run_training

    def fit() -> None:
        try:
            plan = training_plan(
                name,
                storage,
                task,
                train,
                scaling or ScalingSection(num_workers=1, cpus_per_worker=1),
                datasets=run_args.pop("datasets", None),
            )
            result = run_training(plan, **run_args)
        except AlbertDistError as err:
            print(f"ERROR {err}", flush=True)
            return
        print("RESULT " + json.dumps({"step": result.metrics["step"], "loss": result.metrics["loss"]}), flush=True)

    training = threading.Thread(target=fit)
    training.start()
    try:
        change_nodes()
        training.join()
    finally:
        ray.shutdown()
        cluster.shutdown()


def run_own_cluster(script, args: list[str], tmp_path, prefix: str, **env_vars: str) -> str:
    """`python script args` beside the session's Ray, with a Ray temp dir of its own (a Cluster announces itself
    in $RAY_TMPDIR/ray/ray_current_cluster, where any other ray.init() on the machine would find it; short, for
    the socket paths); returns its output, kept in tmp_path/output.txt, after asserting it ended well."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    ray_tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER")}
    env.update(PYTHONPATH=os.pathsep.join([str(tests.parent), str(tests)]), RAY_TMPDIR=ray_tmp, **env_vars)
    try:
        run = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out = run.stdout + run.stderr
    (tmp_path / "output.txt").write_text(out)
    assert run.returncode == 0, out[-6000:]
    return out


def loopback_cluster():
    """A `ray.cluster_utils.Cluster` with a head of no CPU, whose nodes (those added later too) listen on 127.0.0.1
    only: Ray's single-machine mode, the one a local Ray starts in, for this whole process and the nodes it starts,
    and each node's IP the loopback address. Ray's default would be every interface and the machine's address."""
    require_mark("heavy", "a Ray cluster of its own")
    import os

    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    from albert_dist.cluster.ray_init import LOOPBACK_FLAG

    os.environ[LOOPBACK_FLAG], ray_constants.ENABLE_RAY_CLUSTER = "0", False

    class LoopbackCluster(Cluster):
        def add_node(self, wait: bool = True, **node_args):
            return super().add_node(wait, node_ip_address="127.0.0.1", **node_args)

    return LoopbackCluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})


def connect(cluster) -> None:
    """Join `cluster` with the worker setup of a local Ray (`ray_init.prepare_local_worker`): the state API on this
    cluster, and the training rendezvous rank 0 serves on loopback (torch's default is every interface)."""
    import ray

    from albert_dist.cluster.ray_init import LOCAL_WORKER_HOOK

    ray.init(address=cluster.address, log_to_driver=True, runtime_env={"worker_process_setup_hook": LOCAL_WORKER_HOOK})


def one_worker_node_cluster():
    """A loopback cluster whose one worker node has one CPU, connected to: a training worker can only run on that
    node. Returns the cluster and the node."""

    cluster = loopback_cluster()
    node = cluster.add_node(num_cpus=1)
    connect(cluster)
    return cluster, node


def drain(cluster, node, deadline_s: int) -> float:
    """Ray's drain with a deadline, as the autoscaler sends it for a preempted node; returns the deadline."""
    import time

    import ray
    from ray.core.generated import autoscaler_pb2

    deadline = time.time() + deadline_s
    accepted, why = ray._raylet.GcsClient(address=cluster.address).drain_node(
        node.node_id,
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        "spot reclaim",
        int(deadline * 1000),
    )
    assert accepted, why
    return deadline
