"""Ray Data's feed inside Ray Train workers, as pretraining reads its held-out split: prepared data streamed from Parquet
every pass (the reference, `data.cache: stream`) against read once into Ray's object store (`data.cache: memory`).
The training splits are read by row number instead (`data.loading.SplitRows`: benchmarks/bench_resume.py).

Two workers with half a CPU each (as the tests and the demo run them) each read their slice of every global batch
(`albert_dist.train.feed.rank_batches`, as pretraining does) for a few epochs, without a model, so what is timed is
the feed alone: the wait for an epoch's first batch (start-up) and the whole epoch. Prints both and the ratios. A
third arm streams through Ray's default Parquet reader (v2 in Ray 2.60: 32 footer-reading actors per read) against
the v1 reader `PreparedData` uses.

    python benchmarks/bench_feed.py                   # 3 epochs, batch 16 per worker, sequences of 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import ray
import ray.train
import ray.train.torch
from bench_pretrain import prepare


def read_epochs(config: dict) -> None:
    from albert_dist.train.feed import rank_batches

    context = ray.train.get_context()
    source = ray.train.get_dataset_shard("train")
    first_batch_s, epoch_s = [], []
    for epoch in range(config["epochs"]):
        start = time.perf_counter()
        first = None
        for _ in rank_batches(
            source,
            batch_size=config["batch_size"],
            rank=context.get_world_rank(),
            world_size=context.get_world_size(),
            seed=epoch,
            shuffle_buffer=2048,
        ):
            first = first if first is not None else time.perf_counter() - start
        first_batch_s.append(first)
        epoch_s.append(time.perf_counter() - start)
    if context.get_world_rank() == 0:  # Train keeps no metrics reported without a checkpoint: write them
        Path(config["out"]).write_text(json.dumps({"first_batch_s": first_batch_s, "epoch_s": epoch_s}))


def run(datasets: dict, args, storage: Path, name: str) -> dict[str, list[float]]:
    """Rank 0's per-epoch figures."""
    from ray.train import DataConfig, RunConfig, ScalingConfig

    from albert_dist.train.ray_runner import training_data_context

    training_data_context()
    trainer = ray.train.torch.TorchTrainer(
        read_epochs,
        train_loop_config={"epochs": args.epochs, "batch_size": args.batch_size, "out": str(storage / f"{name}.json")},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(name=name, storage_path=str(storage)),
        datasets=datasets,
        dataset_config=DataConfig(datasets_to_split=[]),
    )
    trainer.fit()
    return json.loads((storage / f"{name}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()

    from albert_dist.cluster.ray_init import ensure_ray
    from albert_dist.data.loading import load_prepared

    ensure_ray()
    with tempfile.TemporaryDirectory() as tmp:
        prepared = load_prepared(prepare(Path(tmp), args.seq))
        print(
            f"{prepared.rows('train')} training instances of up to {args.seq} tokens, "
            f"~{prepared.in_memory_bytes('train') / 1e6:.1f} MB in memory"
        )
        figures = {}
        (Path(tmp) / "ray").mkdir()
        arms = {
            "stream-v2": lambda: {"train": ray_default_parquet_read(prepared)},
            "stream": lambda: {"train": prepared.train},
            "memory": lambda: {"train": prepared.train.materialize()},
        }
        for mode, datasets_of in arms.items():
            start = time.perf_counter()
            datasets = datasets_of()
            prepare_s = time.perf_counter() - start
            timings = run(datasets, args, Path(tmp) / "ray", mode)
            figures[mode] = statistics.median(timings["first_batch_s"]), statistics.median(timings["epoch_s"])
            print(
                f"{mode:9s}: read into memory {prepare_s:5.1f} s | epoch start-up (median of {args.epochs}) "
                f"{figures[mode][0]:6.2f} s | whole epoch {figures[mode][1]:6.2f} s"
            )
    for slow, fast in (("stream-v2", "stream"), ("stream", "memory")):
        print(
            f"{fast} vs {slow}: epoch start-up {figures[slow][0] / figures[fast][0]:.1f}x faster, "
            f"whole epoch {figures[slow][1] / figures[fast][1]:.1f}x faster"
        )


def ray_default_parquet_read(prepared):
    """The reference for the reader: the training split read by Ray's default Parquet reader (v2 in Ray 2.60)."""
    dataset = ray.data.read_parquet(prepared.shard_paths("train"))
    dataset.context.execution_options.preserve_order = True
    return dataset


if __name__ == "__main__":
    main()
