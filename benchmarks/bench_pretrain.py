"""Pretraining throughput through Ray Train (one worker) against the same loop in a plain PyTorch process.

Both sides run the shared `Trainer` with the same `PretrainingTask` on the same prepared data (standard-library
docstrings, prepared once with Ray Data and held in Ray's object store, as pretraining
holds data this small); rounds alternate between the two so machine noise hits both alike.
Prints non-padding tokens/s of each, their ratio (goal ≥ 0.9) and model FLOPs utilisation against the measured
matmul peak of the chosen precision.

    python benchmarks/bench_pretrain.py                       # ALBERT-base shape, fp32, batch 8 x 128
    python benchmarks/bench_pretrain.py --preset tiny --steps 20 --precision bf16
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from albert_dist.config import ScalingSection, TrainSection, load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.pretrain.config import PretrainJobConfig


def matmul_peak_tflops(precision: str, size: int = 2048, repeats: int = 5) -> float:
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    torch.nn.functional.linear(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.nn.functional.linear(a, b)
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e12


def prepare(root: Path, max_seq_length: int, max_chars: int = 1_500_000) -> Path:
    from albert_dist.data.prepare import prepare_dataset
    from albert_dist.demo.corpus import write_stdlib_corpus

    corpus = write_stdlib_corpus(root / "corpus.txt", max_chars=max_chars)
    cfg = load_config(
        DataJobConfig,
        None,
        [
            f"run.output_dir={root}",
            f"data.inputs=[{corpus}]",
            "data.format=blocks",
            "data.output=prepared",
            f"data.max_seq_length={max_seq_length}",
            "data.eval_fraction=0.01",
            "tokenizer.vocab_size=4000",
        ],
    )
    prepare_dataset(cfg)
    return root / "prepared"


def pretraining_task(data_dir: Path, args):
    """The pretraining job's task on `data_dir` with the `args` preset and batch size, and the prepared data."""
    from albert_dist.data.loading import load_prepared
    from albert_dist.pretrain.job import pretraining_spec

    prepared = load_prepared(data_dir)
    cfg = load_config(PretrainJobConfig, None, [f"model.preset={args.preset}", f"train.batch_size={args.batch_size}"])
    return pretraining_spec(cfg, prepared, data_dir), prepared


def settings(args) -> TrainSection:
    return TrainSection(
        precision=args.precision,
        max_steps=args.steps,
        warmup_steps=1,
        log_every=args.steps,
        eval_every=10**6,
        checkpoint_every=10**6,
        batch_size=args.batch_size,
        max_failures=0,
    )


def plain_loop(spec, train, args) -> float:
    """The Trainer in this process, no Ray Train: the reference, with as many threads as the Ray worker gets
    (Ray sets OMP_NUM_THREADS to the worker's CPUs)."""
    from albert_dist.train.loop import Trainer, WorkerEnv

    torch.set_num_threads(max(1, int(args.cpus)))
    task = spec.build(rank=0, world_size=1, dataset=lambda split: train)
    seen: dict = {}
    trainer = Trainer(task, settings(args), WorkerEnv(report=lambda m, c: seen.update(m), print_fn=lambda s: None))
    return trainer.fit()["tokens_per_s"]


def ray_train(spec, train, args, storage: Path, round_index: int) -> float:
    from albert_dist.train.plan import Plan
    from albert_dist.train.ray_runner import run_training

    plan = Plan(
        task=spec,
        train=settings(args),
        scaling=ScalingSection(num_workers=1, cpus_per_worker=args.cpus),
        seed=0,
        name=f"bench-{round_index}",
        storage_path=storage,
        publish_to=None,
        fingerprint=None,
        resume_changes="refuse",
        tracking=None,
        datasets=lambda: {"train": train},
    )
    result = run_training(plan)
    return result.metrics["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument(
        "--steps",
        type=int,
        default=8,
        help="optimizer steps per measurement (the first window includes start-up, as in any real run)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpus", type=float, default=1.0, help="CPUs reserved by the Ray Train worker")
    args = parser.parse_args()

    import ray

    from albert_dist.model import AlbertConfig, AlbertForPreTraining

    ray.init(include_dashboard=False, configure_logging=False, log_to_driver=False)
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = prepare(Path(tmp), args.seq)
        spec, prepared = pretraining_task(data_dir, args)
        train = prepared.train.materialize()
        plain, distributed = [], []
        for r in range(args.rounds):
            plain.append(plain_loop(spec, train, args))
            distributed.append(ray_train(spec, train, args, Path(tmp) / "ray", r))
            print(f"round {r}: plain {plain[-1]:.0f} tok/s, Ray Train {distributed[-1]:.0f} tok/s", flush=True)
    model = AlbertForPreTraining(AlbertConfig.from_dict(spec.model_config))
    flops = model.flops_per_token(args.seq)
    peak = matmul_peak_tflops(args.precision)
    p, d = statistics.median(plain), statistics.median(distributed)
    print(
        f"\n{args.preset} ({model.num_parameters() / 1e6:.1f}M params), {args.precision}, "
        f"batch {args.batch_size} x {args.seq}, {args.steps} steps x {args.rounds} rounds"
    )
    print(f"plain PyTorch loop : {p:8.0f} tok/s  MFU {flops * p / 1e12 / peak:6.1%}")
    print(f"Ray Train, 1 worker: {d:8.0f} tok/s  MFU {flops * d / 1e12 / peak:6.1%}")
    print(
        f"ratio Ray Train / plain: {d / p:.2f}   (matmul peak {peak * 1e3:.1f} GFLOP/s, {flops / 1e9:.2f} GFLOP/token)"
    )


if __name__ == "__main__":
    main()
