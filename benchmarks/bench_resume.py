"""Resume time of pretraining: from a checkpoint at 10 %, 50 % and 90 % of an epoch to the first micro-batch the
resumed run trains, with the feed that seeks (this tree) against the feed that makes and drops every skipped
micro-batch (a reference checkout, e.g. `git worktree add --detach /tmp/wt 133ad4a`, the commit before the seek).

Both sides run their own `Trainer._micro_batches` (the loop's feed at a restored position) on the same prepared data
(standard-library docstrings) with their own `PretrainingTask`, each in its own process with its tree on
PYTHONPATH; the reference reads the training split from Ray's object store, as it did for data this small
(`data.cache: auto`). What is timed: the task built (untimed) → the first micro-batch of the restored position
(wall clock, and CPU time of the process as a second measure), and how many micro-batches were masked (collated) on
the way. Goal: flat across positions. Prints each side, the ratio, and the positions' spread.

    python benchmarks/bench_resume.py --reference /tmp/wt
    python benchmarks/bench_resume.py --reference /tmp/wt --chars 3000000 --batch-size 8 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

FRACTIONS = (0.0, 0.1, 0.5, 0.9)


def measure(data_dir: Path, batch_size: int, repeats: int) -> dict[str, list[dict]]:
    """In this process's tree: per fraction of the epoch, each repeat's seconds (wall, CPU) and collations."""
    import ray
    from bench_pretrain import pretraining_task

    from albert_dist.train.loop import Position, Trainer

    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    spec, prepared = pretraining_task(data_dir, SimpleNamespace(preset="tiny", batch_size=batch_size))
    train = prepared.train.materialize()  # the reference's feed reads it; the seeking feed reads the Parquet shards
    batches = prepared.rows("train") // (batch_size * (spec.slots or 1))  # global micro-batches
    figures: dict[str, list[dict]] = {}
    for _ in range(repeats):  # positions interleaved: the machine's load moves all of them alike
        for fraction in FRACTIONS:
            task = spec.build(0, 1, lambda split: train)
            collated = counting_collations(task)
            holder = SimpleNamespace(task=task, position=Position(batch_in_epoch=int(fraction * batches)))
            wall, cpu = time.perf_counter(), time.process_time()
            next(Trainer._micro_batches(holder))
            figures.setdefault(str(fraction), []).append(
                {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "collated": len(collated)}
            )
    figures["batches"] = batches
    figures["tree"] = str(Path(Trainer.__module__ and sys.modules[Trainer.__module__].__file__).parents[2])
    return figures


def counting_collations(task) -> list[int]:
    """A list that grows by one at each micro-batch `task` masks."""
    collated, collate = [], task.collate

    def counted(*args, **kw):
        collated.append(1)
        return collate(*args, **kw)

    task.collate = counted
    return collated


def run_side(tree: Path, data_dir: Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{Path(__file__).parent}", "RAY_AUTH_MODE": "disabled"}
    command = [sys.executable, __file__, "--measure", str(data_dir), "--batch-size", str(args.batch_size)]
    out = subprocess.run(
        [*command, "--repeats", str(args.repeats)], env=env, cwd=tree, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, help="a checkout of the commit to compare against")
    parser.add_argument("--chars", type=int, default=3_000_000, help="corpus size (more: a longer epoch)")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.batch_size, args.repeats)))
        return

    from bench_pretrain import prepare

    from albert_dist.cluster.ray_init import ensure_ray

    here = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        ensure_ray()
        data_dir = prepare(Path(tmp), args.seq, args.chars)
        import ray

        ray.shutdown()
        sides = {"seek": run_side(here, data_dir, args)}
        if args.reference:
            sides["skip"] = run_side(args.reference.resolve(), data_dir, args)
    batches = sides["seek"].pop("batches")
    for name, figures in sides.items():
        print(f"{name}: {figures.pop('tree')}")
    print(f"{batches} global batches an epoch ({args.batch_size} x {args.seq} a slot), median of {args.repeats}")
    medians = {}
    for name, figures in sides.items():
        figures.pop("batches", None)
        for fraction, runs in figures.items():
            wall = statistics.median(r["wall_s"] for r in runs)
            cpu = statistics.median(r["cpu_s"] for r in runs)
            medians[name, fraction] = wall, cpu
            print(
                f"{name:4s} at {float(fraction):4.0%}: {wall:7.3f} s wall, {cpu:7.3f} s CPU, "
                f"{runs[0]['collated']} micro-batches masked"
            )
    for name in sides:
        walls, cpus = zip(*(medians[name, f] for f in sides[name]))
        print(
            f"{name}: slowest position / fastest {max(walls) / min(walls):.2f}x wall, {max(cpus) / min(cpus):.2f}x CPU"
        )
    if "skip" in sides:
        for fraction in sides["seek"]:
            (skip_wall, skip_cpu), (seek_wall, seek_cpu) = medians["skip", fraction], medians["seek", fraction]
            print(
                f"at {float(fraction):4.0%}: skip / seek {skip_wall / seek_wall:.1f}x wall, {skip_cpu / seek_cpu:.1f}x CPU"
            )


if __name__ == "__main__":
    main()
