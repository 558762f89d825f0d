"""The whole pretraining job against its own training step: where a shipped job's wall time goes.

Prepares a corpus with the shipped prepare config once, then
- *step*: the same `Trainer` + `PretrainingTask` at the job's shape and global batch, in this process (no Ray, no
  evaluation, no checkpoints), with `--threads` intra-op threads: tokens/s over steady windows (the first, with its
  start-up, left out), the best of the thread counts;
- *job*: `albert-dist pretrain --config <shipped>` as a user runs it, a subprocess timed from launch to exit, once per
  `--arm` (overrides of the shipped config): its trained tokens (`tokens_seen`) over the whole wall time, and its
  loop's own accounting (`LoopClock`: evaluation, checkpoints, training), against the step's rate.

    python benchmarks/corpora.py zh-manpages /work/corpora/zh_manpages.txt
    python benchmarks/bench_job.py --corpus /work/corpora/zh_manpages.txt --steps 600 \\
        --arm shipped= --arm "one-worker=scaling.num_workers=1 scaling.cpus_per_worker=2"

Goal (the issue's): the whole job ≥ 90 % of the in-process step's tokens/s, evaluation and checkpoints ≤ 5 % of wall.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {"zh": ("prepare_zh", "pretrain_zh"), "en": ("prepare_en", "pretrain_en")}
LOOP_LINE = re.compile(
    r"loop time (?P<wall>.+?): training (?P<training>[\d.]+)%, evaluation (?P<evaluation>[\d.]+)%, "
    r"checkpoints (?P<checkpoint>[\d.]+)%; (?P<tokens>\d+) tokens, (?P<rate>\d+) tok/s"
)


def albert_dist(*args: str, cwd: Path) -> tuple[float, str]:
    """Run the CLI as a user does; (seconds from launch to exit, its output)."""
    started = time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "albert-dist"), *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(
            f"albert-dist {args[0]} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return seconds, done.stdout + done.stderr


def prepare(config: str, work: Path, corpus: Path, sets: list[str] = ()) -> Path:
    """The shipped prepare `config` on `corpus`, into work/prepared (kept when it is there)."""
    if not (work / "prepared" / "manifest.json").exists():
        albert_dist(
            "data", "prepare", "--config", config,
            "--set", f"run.output_dir={work}", "--set", "data.output=prepared", "--set", f"data.inputs=[{corpus}]",
            *[a for s in sets for a in ("--set", s)],
            cwd=work,
        )  # fmt: skip
    return work / "prepared"


def step_rate(config: str, data_dir: Path, sets: list[str], threads: int, window: int = 20, windows: int = 6) -> float:
    """Median tokens/s of the in-process loop's log windows after the first, at the job's shape and global batch."""
    import torch

    from albert_dist.config import TrainSection, load_config
    from albert_dist.data.loading import load_prepared
    from albert_dist.pretrain.config import PretrainJobConfig
    from albert_dist.pretrain.job import pretraining_spec
    from albert_dist.train.loop import Trainer, WorkerEnv

    torch.set_num_threads(threads)
    cfg = load_config(PretrainJobConfig, config, list(sets))
    spec = dataclasses.replace(pretraining_spec(cfg, load_prepared(data_dir), data_dir), has_eval=False)
    task = spec.build(rank=0, world_size=1, dataset=lambda split: None)
    rates: list[float] = []
    settings = TrainSection.model_validate(
        {
            **cfg.train.loop_settings().model_dump(),
            "max_steps": windows * window,
            "log_every": window,
            "eval_every": 10**9,
            "checkpoint_every": 10**9,
            "warmup_steps": 1,
        }
    )
    env = WorkerEnv(log_metrics=lambda m, step: "tokens_per_s" in m and rates.append(m["tokens_per_s"]),
                    print_fn=lambda line: None)  # fmt: skip
    Trainer(task, settings, env).fit()
    return statistics.median(rates[1:])


def pretrain(config: str, work: Path, name: str, sets: list[str]) -> dict:
    """`albert-dist pretrain --config config` on work/prepared as run `name`: its wall time from launch to exit,
    the tokens it trained and its loop's accounting."""
    run_name = f"{name}-{time.strftime('%H%M%S')}"  # a run of its own, not a resume of an earlier one
    seconds, output = albert_dist(
        "pretrain", "--config", config,
        "--set", f"run.output_dir={work}", "--set", "data.output=prepared", "--set", f"run.name={run_name}",
        *[a for s in sets for a in ("--set", s)],
        cwd=work,
    )  # fmt: skip
    loop = LOOP_LINE.search(output)
    if not loop:
        raise SystemExit(f"no loop-time line in the job's output:\n{output[-3000:]}")
    tokens = int(loop["tokens"])
    return {
        "seconds": seconds,
        "tokens": tokens,
        "job_tokens_per_s": tokens / seconds,
        "loop_tokens_per_s": int(loop["rate"]),
        "loop_wall": loop["wall"],
        "evaluation_pct": float(loop["evaluation"]),
        "checkpoint_pct": float(loop["checkpoint"]),
        "model": str(work / run_name / "model"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--language", choices=sorted(CONFIGS), default="zh")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_job"))
    parser.add_argument("--steps", type=int, default=600, help="max_steps of each job")
    parser.add_argument("--set", action="append", default=[], help="an override for the job and the step alike")
    parser.add_argument(
        "--arm", action="append", default=[], help='NAME=k=v k=v …: a job with these overrides ("shipped=": none)'
    )
    parser.add_argument("--threads", default="2,1", help="the in-process step's thread counts")
    parser.add_argument("--window", type=int, default=20, help="steps per log window of the in-process step")
    parser.add_argument("--step-windows", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    prepare_config, pretrain_config = CONFIGS[args.language]
    data_dir = prepare(prepare_config, args.work, args.corpus)
    steps = {
        int(t): step_rate(pretrain_config, data_dir, args.set, int(t), args.window, args.step_windows)
        for t in args.threads.split(",")
    }
    for threads, rate in steps.items():
        print(f"step in process, {threads} thread(s): {rate:.0f} tok/s", flush=True)
    best = max(steps.values())
    jobs = []
    for arm in args.arm or ["shipped="]:
        name, _, sets = arm.partition("=")
        job = {
            "arm": name,
            **pretrain(
                pretrain_config, args.work, name, [f"train.max_steps={args.steps}", *args.set, *shlex.split(sets)]
            ),
        }
        job["job_over_step"] = job["job_tokens_per_s"] / best
        jobs.append(job)
        print(
            f"job {name}: {job['seconds']:.0f} s, {job['tokens']} tokens, {job['job_tokens_per_s']:.0f} tok/s "
            f"= {job['job_over_step']:.2f} of the step; loop {job['loop_tokens_per_s']} tok/s over "
            f"{job['loop_wall']}, evaluation {job['evaluation_pct']} %, checkpoints {job['checkpoint_pct']} %",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps({"step": steps, "jobs": jobs, "args": vars(args)}, indent=1, default=str))


if __name__ == "__main__":
    main()
