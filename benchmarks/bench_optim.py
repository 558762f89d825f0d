"""Optimizer step time on ALBERT-base parameters: today's multi-tensor LAMB against the per-parameter loop it
replaced, and AdamW as the loop builds it against torch's for-loop AdamW.

The replaced LAMB is loaded from git history (`--reference-commit`, the last commit with the loop), so both run
side by side in one process on the same gradients, interleaved round by round; medians are reported.

    python benchmarks/bench_optim.py                 # ALBERT-base (V=30000), 5 rounds x 10 steps
    python benchmarks/bench_optim.py --preset tiny --rounds 2 --steps 3   # smoke run
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
import types
from pathlib import Path

import torch

from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist.train import optim

REPO = Path(__file__).resolve().parents[1]


def module_at_commit(commit: str, path: str) -> types.ModuleType:
    """The source of `path` as it was at `commit`, imported as a throwaway module."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType(f"{Path(path).stem}_at_{commit}")
    exec(compile(source, f"{commit}:{path}", "exec"), module.__dict__)
    return module


def optimizers(model: torch.nn.Module, reference: types.ModuleType) -> dict[str, torch.optim.Optimizer]:
    settings = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)

    def groups():
        return optim.parameter_groups(model.named_parameters(), settings["weight_decay"])

    return {
        "lamb loop (before)": reference.Lamb(groups(), **settings),
        "lamb foreach (now)": optim.build_optimizer("lamb", groups(), **settings),
        "adamw for-loop (before)": torch.optim.AdamW(groups(), **settings, foreach=False),
        "adamw (now)": optim.build_optimizer("adamw", groups(), **settings),
    }


def step_times(opts: dict[str, torch.optim.Optimizer], steps: int, rounds: int) -> dict[str, float]:
    """Median seconds per step of each optimizer, rounds interleaved (the order flips every round)."""
    for opt in opts.values():
        opt.step()  # state allocation
    times = {name: [] for name in opts}
    for r in range(rounds):
        for name in list(opts) if r % 2 == 0 else list(reversed(opts)):
            start = time.perf_counter()
            for _ in range(steps):
                opts[name].step()
            times[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reference-commit", default="78d3d0f", help="a commit whose optim.py has the loop LAMB")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = AlbertForPreTraining(AlbertConfig.from_preset(args.preset))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    count = sum(p.numel() for p in model.parameters())
    reference = module_at_commit(args.reference_commit, "albert_dist/train/optim.py")
    times = step_times(optimizers(model, reference), args.steps, args.rounds)
    print(
        f"ALBERT-{args.preset}: {count / 1e6:.1f}M parameters in {len(list(model.parameters()))} tensors, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; {args.rounds} rounds x {args.steps} steps"
    )
    for name, seconds in times.items():
        print(f"  {name:24s} {seconds * 1e3:8.2f} ms/step")
    for kind in ("lamb", "adamw"):
        before, now = (seconds for name, seconds in times.items() if name.startswith(kind))
        print(f"{kind}: {before / now:.2f}x faster than before")


if __name__ == "__main__":
    main()
