"""Torch threads in Ray Train workers: two workers of half a CPU each (as the demo and the tests run them on
2 cores) train ALBERT tiny at H=128 under DDP, once with torch's default thread count (every core of the machine in
each worker, what training did before) and once with `ray_runner.torch_threads` (the CPUs Ray reserved, at least
one). Prints rank 0's milliseconds per step of each and the ratio.

    python benchmarks/bench_threads.py                  # 20 timed steps, batch 16 x 64 per worker
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import ray.train
import ray.train.torch

from albert_dist.config import ScalingSection
from albert_dist.train.ray_runner import torch_threads


def steps(config: dict) -> None:
    import torch

    from albert_dist.model import AlbertConfig, AlbertForPreTraining

    if config["threads"]:
        torch.set_num_threads(config["threads"])
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(
        AlbertForPreTraining(
            AlbertConfig(
                vocab_size=3000,
                embedding_size=128,
                hidden_size=128,
                num_attention_heads=4,
                intermediate_size=512,
                num_hidden_layers=4,
            )
        )
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch, seq = config["batch_size"], 64
    ids = torch.randint(5, 3000, (batch, seq))
    labels = torch.full_like(ids, -100)
    labels[:, ::7] = ids[:, ::7]
    order = torch.randint(0, 2, (batch,))
    for step in range(config["steps"] + 5):
        if step == 5:
            start = time.perf_counter()
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, sentence_order_label=order)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if ray.train.get_context().get_world_rank() == 0:  # Train keeps no metrics reported without a checkpoint
        ms_per_step = 1000 * (time.perf_counter() - start) / config["steps"]
        Path(config["out"]).write_text(json.dumps({"ms_per_step": ms_per_step, "threads": torch.get_num_threads()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    from albert_dist.cluster.ray_init import start_local_ray

    start_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=True, configure_logging=False)
    scaling = ScalingSection(num_workers=2, cpus_per_worker=0.5)
    figures = {}
    with tempfile.TemporaryDirectory() as storage:
        for name, threads in (("torch-default", 0), ("torch_threads", torch_threads(scaling))):
            out = Path(storage) / f"{name}.json"
            ray.train.torch.TorchTrainer(
                steps,
                train_loop_config={
                    "threads": threads,
                    "steps": args.steps,
                    "batch_size": args.batch_size,
                    "out": str(out),
                },
                scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                run_config=ray.train.RunConfig(name=name, storage_path=storage),
            ).fit()
            figures[name] = json.loads(out.read_text())
            print(
                f"{name:14s}: {figures[name]['ms_per_step']:6.0f} ms/step with {figures[name]['threads']} "
                f"torch thread(s) per worker"
            )
    print(
        f"torch_threads vs torch default: "
        f"{figures['torch-default']['ms_per_step'] / figures['torch_threads']['ms_per_step']:.1f}x faster"
    )


if __name__ == "__main__":
    main()
