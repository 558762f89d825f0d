"""Training-step throughput of our AlbertForPreTraining against transformers', same config, weights and inputs.

One step = forward (MLM + SOP losses) + backward + AdamW step. Throughput counts non-padding tokens. The two
models run interleaved in one process (alternating which goes first each round) and medians are reported, so
background load hits both alike. MFU = model FLOPs/s over the device's measured GEMM peak in the same dtype.
fp16 runs without a GradScaler: this times the step, it does not train.

On CUDA the run ends with one PASS/FAIL line per goal whose row it measured (`CUDA_GOALS`) and exits 1 when one
fails; on the CPU no goal applies and it exits 0.

    python benchmarks/bench_model.py                      # ALBERT-base, 8x128 and 2x512, fp32 and bf16 autocast
    python benchmarks/bench_model.py --steps 1 --rounds 1 --shapes 2x64 --dtypes fp32   # smoke run
    python benchmarks/bench_model.py --device cuda --presets base,large --shapes 32x128,8x512 --dtypes bf16,fp16
    python benchmarks/bench_model.py --presets tiny --shapes 8x128 --dtypes fp32 --compile   # + torch.compile
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import transformers

from albert_dist.model import AlbertConfig, AlbertForPreTraining

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MASK_ID = 4


@dataclass(frozen=True)
class Goal:
    """The least value that one measure of one row (preset, dtype, shape) must reach: "ratio", ours over
    transformers' tokens/s, or "mfu", ours."""

    preset: str
    dtype: str
    shape: str
    measure: str
    least: float

    def shown(self, value: float) -> str:
        if self.measure == "ratio":
            return f"ours / transformers {value:.2f}x (goal >= {self.least:g}x)"
        return f"MFU of ours {value:.1%} (goal >= {self.least:.0%})"


#: What the GPU check (benchmarks/gpu_check.sh, step 3) holds the model to; a run on the CPU reports its table only.
CUDA_GOALS = (
    Goal("base", "bf16", "32x128", "ratio", 1.5),
    Goal("large", "bf16", "8x512", "mfu", 0.5),
)


def check_goals(goals: tuple[Goal, ...], measured: dict[tuple[str, str, str], dict[str, float]]) -> bool:
    """Print one line per goal, PASS or FAIL for a measured row, and whether none failed."""
    passed = True
    for goal in goals:
        row = f"{goal.preset} {goal.dtype} {goal.shape}"
        values = measured.get((goal.preset, goal.dtype, goal.shape))
        if values is None:
            print(f"goal not checked: {row} is not among the rows of this run")
            continue
        ok = values[goal.measure] >= goal.least
        passed &= ok
        print(f"{'PASS' if ok else 'FAIL'}  {row}: {goal.shown(values[goal.measure])}")
    return passed


def make_batch(config: AlbertConfig, B: int, T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids, rows 70-100% full, two segments, 15% of real tokens as MLM targets, random SOP labels."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(int(0.7 * T), T + 1, (B,), generator=g)
    lengths[0] = T
    real = torch.arange(T) < lengths[:, None]
    ids = torch.randint(5, config.vocab_size, (B, T), generator=g).masked_fill(~real, config.pad_token_id)
    types = (torch.arange(T) >= lengths[:, None] // 2) & real
    targets = (torch.rand(B, T, generator=g) < 0.15) & real
    targets[:, 0] = False
    return dict(
        input_ids=ids.masked_fill(targets, MASK_ID),
        attention_mask=real.long(),
        token_type_ids=types.long(),
        labels=torch.where(targets, ids, -100),
        sentence_order_label=torch.randint(0, 2, (B,), generator=g),
    )


def gemm_peak(dtype: torch.dtype, device: torch.device, n: int = 2048, reps: int = 3) -> tuple[float, str]:
    """Best FLOP/s of an n x n x n product in `dtype`, and the op that reached it.

    torch.matmul and F.linear are both probed (at n=256) because they can take different kernels: on CPUs without
    native bf16, bf16 torch.matmul falls back to a slow generic kernel while F.linear (what the models' dense
    layers run) goes through oneDNN. The faster one is then timed at full size (8192 on a GPU).
    """
    n = 8192 if device.type == "cuda" else n

    def rate(op, size: int) -> float:
        a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
        op(a, b)
        best = 0.0
        for _ in range(reps):
            synchronize(device)
            start = time.perf_counter()
            op(a, b)
            synchronize(device)
            best = max(best, 2 * size**3 / (time.perf_counter() - start))
        return best

    op = max((torch.matmul, F.linear), key=lambda op: rate(op, 256))
    return rate(op, n), "torch.matmul" if op is torch.matmul else "F.linear"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def flops_per_token(config: AlbertConfig, T: int) -> float:
    """6 * N_eff + 12 * blocks * H * T, N_eff counting the shared blocks once per use (dense layers only:
    encoder blocks, E->H mapping, pooler, MLM dense + the full E x V decoder)."""
    H, I, E, V = config.hidden_size, config.intermediate_size, config.embedding_size, config.vocab_size
    blocks = config.num_hidden_layers * config.inner_group_num
    n_eff = blocks * (4 * H * H + 2 * H * I) + E * H + H * H + H * E + E * V + 2 * H
    return 6 * n_eff + 12 * blocks * H * T


def train_step(model, optimizer, batch, dtype: torch.dtype) -> None:
    device_type = batch["input_ids"].device.type
    with torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(models: dict, batch, dtype, steps: int, rounds: int) -> dict[str, float]:
    """Median non-padding tokens/s of each model over `rounds` rounds of `steps` steps, interleaved."""
    tokens = int(batch["attention_mask"].sum()) * steps
    for name, (model, optimizer) in models.items():  # warm-up: allocator, AdamW state, autocast caches, compile
        start = time.perf_counter()
        train_step(model, optimizer, batch, dtype)
        if name == "compiled":
            print(f"  torch.compile + first step: {time.perf_counter() - start:.0f} s", flush=True)
    rates = {name: [] for name in models}
    for r in range(rounds):
        for name in list(models) if r % 2 == 0 else list(reversed(models)):
            model, optimizer = models[name]
            synchronize(batch["input_ids"].device)
            start = time.perf_counter()
            for _ in range(steps):
                train_step(model, optimizer, batch, dtype)
            synchronize(batch["input_ids"].device)
            rates[name].append(tokens / (time.perf_counter() - start))
    return {name: statistics.median(r) for name, r in rates.items()}


def build_models(config: AlbertConfig, device: torch.device, compiled: bool = False) -> dict:
    """Ours and transformers' with the same weights; with `compiled`, also ours under torch.compile."""
    torch.manual_seed(0)
    ours = AlbertForPreTraining(config).train()
    hf_config = transformers.AlbertConfig(**config.to_dict(), attn_implementation="sdpa")  # its fastest on CPU
    theirs = transformers.AlbertForPreTraining(hf_config).train()
    theirs.load_state_dict(ours.state_dict(), strict=False)  # same weights; its decoder is tied as ours
    models = [("ours", ours), ("hf", theirs)]
    if compiled:
        models.append(("compiled", torch.compile(copy.deepcopy(ours))))
    return {name: (m.to(device), torch.optim.AdamW(m.parameters(), lr=1e-4)) for name, m in models}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return names[0] if names else platform.processor()
    except OSError:
        return platform.processor()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per model per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--presets", default="base", help="comma-separated model presets (base, large, ...)")
    parser.add_argument("--shapes", default="8x128,2x512", help="comma-separated BxT")
    parser.add_argument("--dtypes", default="fp32,bf16", help=f"comma-separated, of {', '.join(DTYPES)}")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--compile", action="store_true", help="also time ours under torch.compile")
    args = parser.parse_args()

    device = torch.device(args.device)
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{cpu_name()}, {torch.get_num_threads()} threads"
    )
    print(
        f"machine: {where}; torch {torch.__version__}, transformers {transformers.__version__}; AdamW, "
        f"{args.rounds} rounds x {args.steps} steps"
    )
    measured: dict[tuple[str, str, str], dict[str, float]] = {}
    print("| preset | dtype | shape | ours tok/s | transformers tok/s | ratio | MFU ours / transformers |")
    print("|---|---|---|---|---|---|---|")
    for dtype_name in args.dtypes.split(","):
        dtype = DTYPES[dtype_name]
        peak, op = gemm_peak(dtype, device)
        print(f"[{dtype_name}] measured GEMM peak {peak / 1e12:.3g} TFLOP/s ({op})", flush=True)
        for preset in args.presets.split(","):
            config = AlbertConfig.from_preset(preset)
            for shape in args.shapes.split(","):
                B, T = (int(v) for v in shape.lower().split("x"))
                models = build_models(config, device, args.compile)
                batch = {k: v.to(device) for k, v in make_batch(config, B, T).items()}
                rates = measure(models, batch, dtype, args.steps, args.rounds)
                mfu = {name: rate * flops_per_token(config, T) / peak for name, rate in rates.items()}
                measured[(preset, dtype_name, f"{B}x{T}")] = {"ratio": rates["ours"] / rates["hf"], "mfu": mfu["ours"]}
                print(
                    f"| {preset} | {dtype_name} | {B}x{T} | {rates['ours']:.0f} | {rates['hf']:.0f} | "
                    f"{rates['ours'] / rates['hf']:.2f}x | {mfu['ours']:.1%} / {mfu['hf']:.1%} |",
                    flush=True,
                )
                if "compiled" in rates:
                    print(
                        f"  ours under torch.compile: {rates['compiled']:.0f} tok/s, "
                        f"{rates['compiled'] / rates['ours']:.2f}x eager",
                        flush=True,
                    )
                del models
    return 0 if check_goals(CUDA_GOALS if device.type == "cuda" else (), measured) else 1


if __name__ == "__main__":
    sys.exit(main())
