"""Pretraining on packed rows (`data.packing: true`) against padded rows: non-padding tokens/s of the training step.

Both sides run the same `PretrainingTask` on the same prepared corpus (standard-library docstrings, prepared as
`albert-dist data prepare` does it, so rows have the lengths real documents give) with the same batches, masks and
initial weights; a step is the task's collation (masking, and packing on the packed side), forward with the MLM +
SOP losses, backward and an AdamW step. Rounds alternate between the two sides so machine load hits both alike.
Prints, per shape, how full the rows are, each side's tokens/s and the ratio (goals: ≥ 1.15× at 128, ≥ 1.4× at 512).

    python benchmarks/bench_packing.py                          # tiny shape, fp32, 32 x 128 and 8 x 512
    python benchmarks/bench_packing.py --shapes 32x128 --rounds 3 --steps 4

`--config pretrain_zh --prepared DIR` instead: a shipped config's in-process step (`bench_job.step_rate`, its shape
and global batch) on prepared data with `data.packing` false, true and auto, arms interleaved, `--rounds` rounds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import tempfile
import time
from itertools import islice
from pathlib import Path
from types import SimpleNamespace

import torch
from bench_pretrain import prepare, pretraining_task


def timed_steps(task, model, optimizer, batches: list[tuple[int, dict]]) -> tuple[int, int, float]:
    """(non-padding tokens, token slots computed, seconds) of training steps on `batches` ((index, rows) pairs)."""
    from albert_dist.data.masking import batch_rng

    tokens = slots = 0
    start = time.perf_counter()
    for index, rows in batches:
        batch = task.collate(rows, batch_rng(0, 0, 0, index), task.train_length)
        loss, _ = task.loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += int(batch["attention_mask"].sum())
        slots += batch["input_ids"].numel()
    return tokens, slots, time.perf_counter() - start


def measure(root: Path, batch_size: int, seq: int, args) -> dict[str, float]:
    from albert_dist.data.loading import load_prepared
    from albert_dist.train.feed import rank_batches

    data_dir = prepare(root, seq)
    spec, _ = pretraining_task(data_dir, SimpleNamespace(preset=args.preset, batch_size=batch_size))
    rows = (
        piece
        for _, piece in rank_batches(
            load_prepared(data_dir).train,
            batch_size=batch_size,
            rank=0,
            world_size=1,
            seed=0,
            shuffle_buffer=2048,
        )
    )
    batches = list(enumerate(islice(rows, 1 + args.rounds * args.steps)))
    torch.manual_seed(0)
    tasks = {
        packing: dataclasses.replace(spec, packing=packing).build(0, 1, dataset=lambda split: None)
        for packing in (False, True)
    }
    initial = tasks[False].build_model().train()
    sides = {}
    for packing, task in tasks.items():
        model = copy.deepcopy(initial)
        sides[packing] = (task, model, torch.optim.AdamW(model.parameters(), lr=1e-4))
        timed_steps(*sides[packing], batches[:1])  # warm-up: first-call allocations
    totals = {packing: [0, 0, 0.0] for packing in sides}
    ratios = []
    for r in range(args.rounds):
        part = batches[1 + r * args.steps : 1 + (r + 1) * args.steps]
        rates = {}
        for packing, side in sides.items():
            tokens, slots, seconds = timed_steps(*side, part)
            totals[packing] = [a + b for a, b in zip(totals[packing], (tokens, slots, seconds))]
            rates[packing] = tokens / seconds
        ratios.append(rates[True] / rates[False])
        print(
            f"{batch_size}x{seq} round {r}: padded {rates[False]:.0f} tok/s, packed {rates[True]:.0f} tok/s, "
            f"ratio {ratios[-1]:.2f}",
            flush=True,
        )
    return {
        "fill_padded": totals[False][0] / totals[False][1],
        "fill_packed": totals[True][0] / totals[True][1],
        "padded": totals[False][0] / totals[False][2],
        "packed": totals[True][0] / totals[True][2],
        "ratio": statistics.median(ratios),
    }


def shipped_config_arms(args) -> None:
    """Tokens/s of the shipped config's in-process step with data.packing false, true and auto, interleaved."""
    from bench_job import step_rate

    rates: dict[str, list[float]] = {"false": [], "true": [], "auto": []}
    for r in range(args.rounds):
        for arm, found in rates.items():
            found.append(step_rate(args.config, args.prepared, [f"data.packing={arm}"], args.threads))
            print(f"round {r} data.packing={arm}: {found[-1]:.0f} tok/s", flush=True)
    means = {arm: statistics.mean(found) for arm, found in rates.items()}
    print(
        f"{args.config} on {args.prepared}, {args.threads} threads: "
        + ", ".join(f"{arm} {means[arm]:.0f} tok/s ({means[arm] / means['false']:.2f}x)" for arm in rates)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--shapes", default="32x128,8x512", help="batch x max_seq_length, comma-separated")
    parser.add_argument("--steps", type=int, default=5, help="training steps per side per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--config", help="a shipped pretraining config, measured on --prepared")
    parser.add_argument("--prepared", type=Path, help="prepared data (data prepare's output) for --config")
    parser.add_argument("--threads", type=int, default=2, help="the in-process step's threads (with --config)")
    args = parser.parse_args()
    if args.config:
        shipped_config_arms(args)
        return

    from ray.data import DataContext

    from albert_dist.cluster.ray_init import start_local_ray

    start_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    DataContext.get_current().enable_progress_bars = False
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            batch_size, seq = map(int, shape.split("x"))
            results[shape] = measure(Path(tmp) / shape, batch_size, seq, args)
    print(
        f"\n{args.preset}, fp32, {torch.get_num_threads()} threads, {args.steps} steps x {args.rounds} rounds "
        f"per side (median ratio of the rounds)"
    )
    print("shape    | rows full padded | packed | padded tok/s | packed tok/s | ratio")
    for shape, m in results.items():
        print(
            f"{shape:8} | {m['fill_padded']:16.0%} | {m['fill_packed']:6.0%} | {m['padded']:12.0f} | "
            f"{m['packed']:12.0f} | {m['ratio']:.2f}x"
        )


if __name__ == "__main__":
    main()
