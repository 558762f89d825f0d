"""An elastic run (`scaling.num_workers: [1, 2]`) on a cluster whose nodes come and go, as spot instances do: a node
is drained with a deadline mid-run, the workers checkpoint the step reached, the run goes on with one worker and the
same global batch, and grows back to two when a node returns. It trains the same global batches (ids of the rows,
per step) as an uninterrupted run on two workers, ends at nearly its loss, logs every metric step once, and the
preemption is not counted as a failure (`max_failures=0`). Every process of the cluster, the training workers'
rendezvous included, listens on loopback only.

As in test_faults_drain, `ray.cluster_utils.Cluster` runs in a subprocess (`python tests/test_faults_elastic.py
ROOT`): a head without CPU and two worker nodes of one CPU, one training worker each.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster_helpers import connect, drain, loopback_cluster, run_own_cluster, train_while
from process_helpers import beyond_loopback, listeners_sampled, process_tree

from albert_dist.train.loop import TaskSpec

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

MAX_STEPS = 40
SLOTS = 2  # the most workers: each global batch is SLOTS micro-batches of BATCH rows
BATCH = 8
ROWS = 224  # 14 global batches an epoch: the run crosses two epoch ends
DRAIN_AT_STEP = 8
CHECKPOINT_EVERY = 6
DEADLINE_S = 20


def checkpoint_steps(storage: Path) -> list[int]:
    return sorted(json.loads(m.read_text())["step"] for m in storage.glob("*/checkpoint_*/manifest.json"))


@dataclass(frozen=True)
class RecordingTask(TaskSpec):
    """test_loop's KeywordTask (without dropout: the same global batches give the same training on any number of
    workers) reading its rows' ids (a Ray dataset, read whole) through the feed's seek, and writing what each worker
    trained to ROOT/trained-<pid> as [workers, epoch, global batch, slot, ids]. With `paced`, the run is held
    where the faults must land, however fast the machine: the first two workers wait at step DRAIN_AT_STEP for
    the drain notice (ROOT/noticed), then train 0.25 s a step until their checkpoint exists and wait there to be
    taken down with their node; the lone worker trains 0.3 s a micro-batch until it wrote a checkpoint of its
    own, and waits there for the resize to two workers."""

    root: str
    paced: bool

    def build(self, rank, world_size, dataset):
        import numpy as np
        import torch
        from test_loop import KeywordTask

        from albert_dist.train.feed import EpochOrder, slot_batches, slot_range

        root, storage = Path(self.root), Path(self.root) / "ray"
        slots = slot_range(rank, world_size, SLOTS)
        resumed_at = max(checkpoint_steps(storage), default=0)
        group = "free" if not self.paced or resumed_at >= DRAIN_AT_STEP and world_size == SLOTS else world_size

        def wait_while(condition) -> None:
            deadline = time.time() + 300
            while condition() and time.time() < deadline:
                time.sleep(0.1)

        class Recording(KeywordTask):
            slot_count, slots_held = SLOTS, len(slots)

            def build_model(self):
                model = super().build_model()
                model.dropout.p = 0.0
                return model

            def train_batches(self, epoch, phase=0):
                return self.train_batches_from(epoch, phase, 0)

            def train_batches_from(self, epoch, phase, start):
                stored = np.concatenate([b["id"] for b in dataset("train").iter_batches(batch_format="numpy")])
                rows = slot_batches(
                    lambda first, stop: {"id": stored[first:stop]},
                    EpochOrder(ROWS, seed=0, epoch=epoch, window=64),
                    batch_size=BATCH,
                    slots=slots,
                    slot_count=SLOTS,
                    start=start,
                )
                for index, slot, part in rows:
                    ids = torch.as_tensor(part["id"])
                    with open(root / f"trained-{os.getpid()}", "a") as out:
                        out.write(json.dumps([world_size, epoch, index, slot, ids.tolist()]) + "\n")
                    yield {
                        "input_ids": self.x[ids],
                        "attention_mask": torch.ones(len(ids), 16, dtype=torch.long),
                        "labels": self.y[ids],
                    }

            def loss(self, model, batch):
                if group == SLOTS and rank == 0:
                    with open(root / "steps", "a") as steps:
                        steps.write(".")
                    if len((root / "steps").read_text()) == DRAIN_AT_STEP:
                        wait_while(lambda: not (root / "noticed").exists())
                    elif (root / "noticed").exists():
                        time.sleep(0.25)
                    wait_while(lambda: max(checkpoint_steps(storage), default=0) >= DRAIN_AT_STEP)
                elif group == 1:
                    time.sleep(0.3)
                    wait_while(lambda: max(checkpoint_steps(storage), default=0) > resumed_at)
                return super().loss(model, batch)

        return Recording()


def reclaim_then_return(cluster, node, root: Path) -> None:
    storage, give_up = root / "ray", time.time() + 300
    while len((root / "steps").read_text() if (root / "steps").exists() else "") < DRAIN_AT_STEP:
        assert time.time() < give_up, "the run never reached the drain step"
        time.sleep(0.1)
    deadline = drain(cluster, node, DEADLINE_S)
    (root / "noticed").touch()
    while max(checkpoint_steps(storage), default=0) < DRAIN_AT_STEP and time.time() < deadline:
        time.sleep(0.1)
    drained = max(checkpoint_steps(storage), default=0)
    print(f"checkpoint {drained} with {deadline - time.time():.1f} s left", flush=True)
    time.sleep(max(0.0, deadline - time.time()))
    cluster.remove_node(node, allow_graceful=False)
    print("node reclaimed", flush=True)
    while max(checkpoint_steps(storage), default=0) <= drained and time.time() < give_up:
        time.sleep(0.1)  # the lone worker's own checkpoint
    print(f"one worker reached checkpoint {max(checkpoint_steps(storage))}", flush=True)
    cluster.add_node(num_cpus=1)
    print("node returned", flush=True)


def main(root: Path) -> None:
    import mlflow
    import ray
    from checkpoint_helpers import training_plan

    from albert_dist.config import TrainSection
    from albert_dist.pretrain.config import PretrainScalingSection
    from albert_dist.train.ray_runner import run_training, training_data_context

    cluster = loopback_cluster()
    cluster.add_node(num_cpus=1)
    reclaimed = cluster.add_node(num_cpus=1)
    connect(cluster)
    training_data_context()
    rows = ray.data.range(ROWS).materialize()
    train = TrainSection(
        max_steps=MAX_STEPS,
        warmup_steps=2,
        log_every=4,
        eval_every=MAX_STEPS,
        checkpoint_every=CHECKPOINT_EVERY,
        keep_checkpoints=20,
        drain_check_every=1,
        precision="fp32",
        optimizer="adamw",
        learning_rate=2e-3,
        max_failures=0,
        resource_wait_attempts=-1,
    )
    # the cluster's processes, the training workers' rendezvous among them
    with listeners_sampled(lambda: process_tree(os.getpid())) as listeners:
        uninterrupted = run_training(
            training_plan(
                name="uninterrupted",
                storage_path=root / "uninterrupted" / "ray",
                task=RecordingTask(str(root / "uninterrupted"), paced=False),
                train=train,
                scaling=PretrainScalingSection(num_workers=SLOTS, cpus_per_worker=1),
                datasets={"train": rows},
            )
        )
    print("UNINTERRUPTED " + json.dumps({"loss": uninterrupted.metrics["loss"]}), flush=True)
    print("LISTENERS " + json.dumps(sorted(listeners)), flush=True)
    elastic = root / "elastic"
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    run_id = mlflow.MlflowClient().create_run(mlflow.create_experiment("elastic")).info.run_id
    print(f"MLFLOW_RUN {run_id}", flush=True)
    train_while(
        cluster,
        "elastic",
        elastic / "ray",
        RecordingTask(str(elastic), paced=True),
        train,
        lambda: reclaim_then_return(cluster, reclaimed, elastic),
        scaling=PretrainScalingSection(num_workers=(1, SLOTS), cpus_per_worker=1, resize_check_s=2),
        datasets={"train": rows},
        tracking=(mlflow.get_tracking_uri(), run_id),
    )


def global_batches(root: Path) -> dict[int, dict[tuple[int, int], list[int]]]:
    """Step → (worker count, slot) → the ids of the rows that slot of the step's global batch held, as the workers
    of `root`'s run read them (a step read again after a restart, by as many workers, keeps one record)."""
    by_step: dict[int, dict[tuple[int, int], list[int]]] = {}
    for path in root.glob("trained-*"):
        for line in path.read_text().splitlines():
            workers, epoch, index, slot, ids = json.loads(line)
            by_step.setdefault(epoch * (ROWS // (BATCH * SLOTS)) + index + 1, {})[(workers, slot)] = ids
    return by_step


def test_an_elastic_run_shrinks_on_a_drain_grows_back_and_trains_the_uninterrupted_runs_batches(tmp_path):
    out = run_own_cluster(
        __file__,
        [str(tmp_path)],
        tmp_path,
        "re-",
        RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S="0.5",
        RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="30",
    )
    drained = re.search(r"checkpoint (\d+) with ([\d.]+) s left", out)
    assert drained and int(drained[1]) >= DRAIN_AT_STEP and float(drained[2]) > 0, out[-6000:]
    lone = int(re.search(r"one worker reached checkpoint (\d+)", out)[1])
    assert lone > int(drained[1]), out[-6000:]
    # resumed from the drain's checkpoint on one worker, then from the lone worker's on two
    assert re.search(rf"resumed from \S+ at step {drained[1]} ", out) and "1 of 2 workers" in out, out[-6000:]
    assert re.search(rf"resumed from \S+ at step {lone} ", out), out[-6000:]
    result = json.loads(re.search(r"RESULT (\{.*\})", out)[1])  # max_failures=0: the reclaim was no failure
    assert result["step"] == MAX_STEPS, out[-6000:]
    listeners = json.loads(re.search(r"LISTENERS (\[.*\])", out)[1])
    assert "RayTrainWorker" in " ".join(name for _, _, name in listeners), listeners  # rank 0's rendezvous seen
    assert not beyond_loopback(listeners), f"listening beyond loopback: {beyond_loopback(listeners)}"

    reference, elastic = global_batches(tmp_path / "uninterrupted"), global_batches(tmp_path / "elastic")
    assert sorted(reference) == sorted(elastic) == list(range(1, MAX_STEPS + 1))
    for step, parts in reference.items():
        assert set(parts) == {(SLOTS, 0), (SLOTS, 1)}
        # every micro-batch read for a step holds the rows of that slot in the uninterrupted run (a worker taken
        # down mid-step read only part of its step)
        for (workers, slot), ids in elastic[step].items():
            assert ids == parts[(SLOTS, slot)], (step, workers, slot)
        assert {slot for _, slot in elastic[step]} == {0, 1}
    trained_by = {step: {workers for workers, _ in parts} for step, parts in elastic.items()}
    assert 1 in trained_by[int(drained[1]) + 1] and trained_by[MAX_STEPS] == {SLOTS}  # read: trained or skipped
    # the same batches in the same order: only the order of the sums over workers differs (fp32 all-reduce and
    # accumulation), which moves the loss by ~1e-6 a step; 40 steps of AdamW leave it within 1e-3 relative
    expected = json.loads(re.search(r"UNINTERRUPTED (\{.*\})", out)[1])["loss"]
    assert result["loss"] == pytest.approx(expected, rel=1e-3)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = re.search(r"MLFLOW_RUN (\w+)", out)[1]
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == list(range(4, MAX_STEPS + 1, 4))
    workers = dict(sorted((m.step, m.value) for m in client.get_metric_history(run_id, "workers")))
    assert list(workers) == list(range(4, MAX_STEPS + 1, 4))  # each logged step once
    assert workers[4] == workers[MAX_STEPS] == SLOTS and 1.0 in workers.values(), workers
    assert [m.value for m in client.get_metric_history(run_id, "drain_notice_step")] == [float(drained[1])]


if __name__ == "__main__":
    main(Path(sys.argv[1]))
