"""Pretraining at equal wall time against transformers' Trainer, both scored by the same code.

Ours: `albert-dist data prepare` and `albert-dist pretrain` on their shipped configs (prepare_zh.yaml and
pretrain_zh.yaml for Chinese, prepare_en.yaml and pretrain_en.yaml for English; `--ours-set` adds overrides,
e.g. a shorter `train.max_steps`), each command run as a user runs it (`bench_job`: a subprocess that starts its
own local Ray), `pretrain` timed from launch to exit; its in-process training step at the same shape and threads is
measured before and after it (`bench_job.step_rate`), for the job-to-step ratio. Theirs, as transformers' `run_mlm`
example trains:
`AlbertForMaskedLM` of the same shape (our export's config.json) and the same vocabulary (our export's tokenizer,
through `AutoTokenizer`), the same training text tokenized raw and grouped into 128-token blocks,
`DataCollatorForLanguageModeling` (15 %, 80/10/10), AdamW with a linear schedule, batch 16 (ours: 2 workers x 8),
all the machine's CPUs, given ours' wall time for its `Trainer.train()` alone (tokenizing and saving not counted:
in its favour), once per learning rate in `--hf-lrs`, the best kept (chosen on the held-out text it is scored on:
in its favour too). Its `max_steps`, which sets the schedule's end, comes from a timed probe of 12 steps
(the first two not timed).

The corpus (blank-line separated documents, one paragraph a line: `benchmarks/corpora.py` writes them) is split
by document: every `--heldout-every`-th document is held out from both, the rest is what both train on. Both
exports are scored by `eval_hf_mlm.score`: transformers, raw held-out paragraphs through the export's
`AutoTokenizer` (cut at 128 tokens), 15 % single tokens every one shown as [MASK], the same positions for both,
next to their unigram baseline.

    apt-get install -y manpages-zh && python benchmarks/corpora.py zh-manpages /tmp/zh_manpages.txt
    pip install -e .[bench]
    python benchmarks/bench_vs_hf_pretrain.py --corpus /tmp/zh_manpages.txt --language zh
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import bench_job
import transformers
from bench_finetune_hf import machine

CONFIGS = bench_job.CONFIGS
BLOCK = 128
HF_BATCH = 16
PROBE_STEPS = 12


def split_corpus(corpus: Path, work: Path, every: int) -> tuple[Path, Path]:
    """(training text, held-out text): every `every`-th document held out."""
    documents = [d for d in corpus.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    held = [d for i, d in enumerate(documents) if i % every == every - 1]
    train = [d for i, d in enumerate(documents) if i % every != every - 1]
    (work / "train.txt").write_text("\n\n".join(train) + "\n", encoding="utf-8")
    (work / "heldout.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
    return work / "train.txt", work / "heldout.txt"


def run_ours(args, work: Path, train_text: Path) -> dict:
    """Ours as a user runs it (`bench_job.pretrain`: the command from launch to exit, local Ray started by it), and
    the job's tokens/s against its in-process step at the same shape on 2 threads, measured before and after."""
    prepare, pretrain = CONFIGS[args.language]
    data_dir = bench_job.prepare(prepare, work, train_text, args.prepare_set)
    threads = os.cpu_count() or 1
    before = bench_job.step_rate(pretrain, data_dir, args.ours_set, threads)
    ours = bench_job.pretrain(pretrain, work, "ours", args.ours_set)
    after = bench_job.step_rate(pretrain, data_dir, args.ours_set, threads)
    step = (before + after) / 2
    from albert_dist.config import load_config
    from albert_dist.pretrain.config import PretrainJobConfig

    steps = load_config(PretrainJobConfig, pretrain, list(args.ours_set)).train.max_steps
    return {
        **ours,
        "steps": steps,
        "step_tokens_per_s": [before, after],
        "job_over_step": ours["job_tokens_per_s"] / step,
    }


class TimeLimit(transformers.TrainerCallback):
    """Stops training once `seconds` have passed since it began."""

    def __init__(self, seconds: float):
        self.seconds, self.started = seconds, 0.0

    def on_train_begin(self, *_, **__):
        self.started = time.perf_counter()

    def on_step_end(self, _args, _state, control, **__):
        if time.perf_counter() - self.started >= self.seconds:
            control.should_training_stop = True


class StepClock(transformers.TrainerCallback):
    """The time each training step ended."""

    def __init__(self):
        self.ends: list[float] = []

    def on_step_end(self, *_, **__):
        self.ends.append(time.perf_counter())


def hf_blocks(tokenizer, train_text: Path) -> list[dict]:
    """run_mlm's preprocessing: each line tokenized (with its specials), all concatenated, cut into blocks."""
    lines = [line for line in train_text.read_text(encoding="utf-8").splitlines() if line.strip()]
    ids = [i for encoded in tokenizer(lines)["input_ids"] for i in encoded]
    return [{"input_ids": ids[start : start + BLOCK]} for start in range(0, len(ids) - BLOCK + 1, BLOCK)]


def run_hf(args, work: Path, train_text: Path, ours: dict, lr: float) -> dict:
    import torch

    torch.manual_seed(args.seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(ours["model"])
    blocks = hf_blocks(tokenizer, train_text)
    config = transformers.AlbertConfig.from_pretrained(ours["model"])
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15)

    def trainer(out: Path, max_steps: int, callbacks=()):
        training = transformers.TrainingArguments(
            output_dir=str(out),
            per_device_train_batch_size=HF_BATCH,
            learning_rate=lr,
            max_steps=max_steps,
            lr_scheduler_type="linear",
            optim="adamw_torch",
            logging_steps=50,
            save_strategy="no",
            report_to=[],
            seed=args.seed,
            use_cpu=True,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        model = transformers.AlbertForMaskedLM(config)
        return transformers.Trainer(
            model=model, args=training, train_dataset=blocks, data_collator=collator, callbacks=list(callbacks)
        )

    clock = StepClock()
    trainer(work / "hf-probe", PROBE_STEPS, [clock]).train()
    per_step = (clock.ends[-1] - clock.ends[1]) / (len(clock.ends) - 2)  # the first two steps warm up
    max_steps = max(10, int(ours["seconds"] / per_step))
    out = work / f"hf-{lr:g}"
    run = trainer(out, max_steps, [TimeLimit(ours["seconds"])])
    started = time.perf_counter()
    result = run.train()
    seconds = time.perf_counter() - started
    run.save_model(str(out / "model"))
    tokenizer.save_pretrained(str(out / "model"))
    steps = result.global_step
    return {
        "seconds": seconds,
        "steps": steps,
        "planned_steps": max_steps,
        "tokens": steps * HF_BATCH * BLOCK,
        "lr": lr,
        "model": str(out / "model"),
    }


def held_out(model_dir: str, heldout: Path, seed: int) -> dict:
    from eval_hf_mlm import score, text_rows

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AlbertForMaskedLM.from_pretrained(model_dir).eval()
    return score(model, tokenizer, text_rows(tokenizer, str(heldout), BLOCK), seed=seed)


def table(ours: dict, hf: dict) -> str:
    diff = 100 * (ours["mlm_accuracy"] - hf["mlm_accuracy"])
    rows = [
        ("held-out MLM accuracy (every masked token [MASK])", "mlm_accuracy", "{:.4f}"),
        ("unigram baseline, same positions", "unigram_baseline", "{:.4f}"),
        ("training wall time, s", "seconds", "{:.0f}"),
        ("optimizer steps", "steps", "{:.0f}"),
        ("tokens processed", "tokens", "{:,.0f}"),
        ("tokens/s of wall time", "tokens_per_s", "{:,.0f}"),
    ]
    ours, hf = (
        {**ours, "tokens_per_s": ours["tokens"] / ours["seconds"]},
        {**hf, "tokens_per_s": hf["tokens"] / hf["seconds"]},
    )
    lines = ["| | ours (albert-dist pretrain) | transformers Trainer (run_mlm) |", "|---|---|---|"]
    lines += [f"| {name} | {fmt.format(ours[key])} | {fmt.format(hf[key])} |" for name, key, fmt in rows]
    lines.append(f"| learning rate | shipped config | {hf['lr']:g} (best of {hf['lrs']}) |")
    lines.append(f"\ntokens/s ours / theirs {ours['tokens_per_s'] / hf['tokens_per_s']:.2f} (goal 1.5)")
    if "job_over_step" in ours:  # an --ours-result of an older run has no accounting
        lines.append(
            f"ours' job at {ours['job_over_step']:.2f} of its in-process step ({ours['step_tokens_per_s']} tok/s "
            f"before and after); evaluation {ours['evaluation_pct']} %, checkpoints {ours['checkpoint_pct']} % of its "
            f"loop's wall time"
        )
    lines.append(
        f"\nours - theirs: {diff:+.1f} points of held-out MLM accuracy (goal: +3): {'met' if diff >= 3 else 'NOT met'}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--language", choices=sorted(CONFIGS), default="zh")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-vs-hf-pretrain"))
    parser.add_argument(
        "--ours-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of ours' pretraining config (repeatable)",
    )
    parser.add_argument(
        "--prepare-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of ours' data preparation config, e.g. tokenizer.vocab_size=8000 for a small corpus",
    )
    parser.add_argument(
        "--hf-lrs", default="2e-4,5e-4,1e-3", help="the peer's learning rates; the best is kept (none: ours alone)"
    )
    parser.add_argument(
        "--ours-result",
        type=json.loads,
        metavar="JSON",
        help="the `ours:` line of an earlier run on the same --work: the peer gets its wall time, ours is not rerun",
    )
    parser.add_argument("--heldout-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    args.work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}", flush=True)
    train_text, heldout = split_corpus(args.corpus, args.work, args.heldout_every)
    if args.ours_result:
        ours = args.ours_result
    else:
        ours = run_ours(args, args.work, train_text)
        ours.update(held_out(ours["model"], heldout, args.seed))
    print(f"ours: {json.dumps(ours)}\nload average {os.getloadavg()}", flush=True)
    torch.set_num_threads(os.cpu_count() or 1)
    lrs = [float(x) for x in args.hf_lrs.split(",") if x]
    runs = []
    for lr in lrs:
        run = run_hf(args, args.work, train_text, ours, lr)
        run.update(held_out(run["model"], heldout, args.seed))
        print(f"theirs: {json.dumps(run)}\nload average {os.getloadavg()}", flush=True)
        runs.append(run)
    if not runs:  # ours alone (`--hf-lrs ""`), to set beside a peer measured at the same wall time
        return
    best = max(runs, key=lambda r: r["mlm_accuracy"])
    best["lrs"] = ", ".join(f"{lr:g}" for lr in lrs)
    (args.work / "results.json").write_text(json.dumps({"ours": ours, "theirs": runs}, indent=1))
    print(f"\n{args.language} corpus {args.corpus.name}; machine: {machine()}\n" + table(ours, best))


if __name__ == "__main__":
    main()
