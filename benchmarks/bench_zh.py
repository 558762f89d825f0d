"""Chinese whole-word masking: preparation cost of jieba, and what it does to a tiny ALBERT's held-out accuracy.

    python benchmarks/bench_zh.py --corpus /work/corpora/zh_fortunes.txt            # prep throughput + WWM
    python benchmarks/bench_zh.py --corpus ... --skip-pretrain                       # prep throughput only

1. Preparation: the same corpus and vocab.txt prepared without and with `data.word_segmenter: jieba`, alternating
   (A, B, A, B ...) so that load from other processes falls on both. Measured twice: the DocumentProcessor alone
   in this process (sentence split, tokenize, segment, instances: the work jieba adds to), and the whole
   `prepare_dataset` on Ray Data (one actor).
2. WWM: the `tiny` preset pretrained for the same number of steps (same seed, vocab, documents and held-out
   split) on characters as words and on jieba words; both models evaluated on both held-out mask kinds with the
   same seeded masks, so each column compares the two models on identical inputs.

The corpus: Debian's fortunes-zh `chinese` file, see benchmarks/README.md for how to rebuild it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARMS = {"chars": None, "jieba": "jieba"}


def documents(corpus: Path) -> list[str]:
    return [d.strip() for d in corpus.read_text(encoding="utf-8").split("\n\n") if d.strip()]


def bench_processor(docs: list[str], tokenizer, rounds: int) -> dict[str, float]:
    """Seconds per pass of the DocumentProcessor over all documents, best of `rounds`, arms alternating."""
    from albert_dist.data.instances import InstanceSpec
    from albert_dist.data.process import DocumentProcessor, ProcessSettings

    spec = InstanceSpec(128, 0.1, tokenizer.cls_id, tokenizer.sep_id)
    processors = {
        arm: DocumentProcessor(tokenizer, ProcessSettings(spec=spec, word_segmenter=seg)) for arm, seg in ARMS.items()
    }  # jieba's dictionary loads here, once, as in an actor
    batch = {
        "doc_key": np.array([f"d{i}" for i in range(len(docs))], object),
        "text": np.array(docs, object),
        "presplit": np.zeros(len(docs), bool),
    }
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm, process in processors.items():
            started = time.perf_counter()
            table = process(batch)
            times[arm].append(time.perf_counter() - started)
    chars = sum(len(d) for d in docs)
    out = {f"{arm}_s": min(t) for arm, t in times.items()}
    out |= {f"{arm}_kchars_per_s": chars / min(t) / 1e3 for arm, t in times.items()}
    out["ratio"] = out["jieba_s"] / out["chars_s"]
    out["instances"] = table.num_rows
    return out


def data_config(corpus: Path, work: Path, tokenizer_dir: Path, arm: str, max_seq_length: int, name: str):
    from albert_dist.data.config import DataJobConfig

    return DataJobConfig.model_validate(
        {
            "run": {"output_dir": str(work)},
            "data": {
                "inputs": [str(corpus)],
                "format": "blocks",
                "language": "zh",
                "output": name,
                "max_seq_length": max_seq_length,
                "eval_fraction": 0.1,
                "word_segmenter": ARMS[arm],
                "tokenizer_actors": 1,
            },
            "tokenizer": {"kind": "wordpiece", "path": str(tokenizer_dir)},
        }
    )


def bench_prepare(corpus: Path, work: Path, tokenizer_dir: Path, rounds: int, max_seq_length: int) -> dict:
    """Seconds of the whole Ray Data preparation, best of `rounds`, arms alternating; the last outputs kept."""
    from albert_dist.data.prepare import prepare_dataset

    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm in ARMS:
            summary = prepare_dataset(
                data_config(corpus, work, tokenizer_dir, arm, max_seq_length, f"prep-{arm}"), log=lambda _: None
            )
            times[arm].append(summary["seconds"])
    out = {f"{arm}_s": min(t) for arm, t in times.items()}
    out["ratio"] = out["jieba_s"] / out["chars_s"]
    return out


def pretrain_arm(work: Path, arm: str, steps: int, batch_size: int) -> Path:
    from albert_dist.pretrain.config import PretrainJobConfig
    from albert_dist.pretrain.job import PRETRAIN

    cfg = PretrainJobConfig.model_validate(
        {
            "run": {"name": f"tiny-{arm}", "output_dir": str(work), "seed": 0},
            "data": {"output": f"prep-{arm}"},
            "model": {"preset": "tiny"},
            "scaling": {"num_workers": 1, "cpus_per_worker": 1.5},
            "train": {
                "precision": "fp32",
                "optimizer": "lamb",
                "learning_rate": 2e-3,
                "max_steps": steps,
                "warmup_steps": steps // 10,
                "batch_size": batch_size,
                "log_every": 50,
                "eval_every": steps,
                "checkpoint_every": steps,
                "eval_batches": 4,
            },
            "tracking": {"tracking_uri": f"sqlite:///{work}/mlflow.db"},
        }
    )
    started = time.perf_counter()
    outcome = PRETRAIN.run(cfg)
    print(f"pretrained {arm}: {steps} steps in {time.perf_counter() - started:.0f} s; {outcome.metrics}")
    return outcome.model_dir


def held_out_accuracy(model_dir: Path, data_dir: Path, limit: int, seed: int = 0) -> dict[str, float]:
    """MLM accuracy (masked tokens, every one shown as [MASK]) and SOP accuracy on the first `limit` held-out
    instances of `data_dir`, masked with a fixed seed: the same inputs for every model."""
    import torch

    from albert_dist.data.loading import load_prepared
    from albert_dist.data.masking import MaskingCollator, batch_rng
    from albert_dist.model import AlbertForPreTraining

    data = load_prepared(data_dir)
    model = AlbertForPreTraining.from_pretrained(model_dir)
    collator = MaskingCollator.from_manifest(data.manifest, mask_all=True)
    rows = data.eval.take_batch(limit, batch_format="numpy")
    correct = total = sop_correct = 0
    for start in range(0, len(rows["input_ids"]), 64):
        part = {k: v[start : start + 64] for k, v in rows.items()}
        batch = collator(part, batch_rng(seed, 0, 0, start))
        with torch.no_grad():
            out = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"],
            )
        masked = batch["labels"] != -100
        correct += int((out.prediction_logits.argmax(-1)[masked] == batch["labels"][masked]).sum())
        total += int(masked.sum())
        sop_correct += int((out.sop_logits.argmax(-1) == batch["sentence_order_label"]).sum())
    return {
        "mlm_accuracy": correct / total,
        "sop_accuracy": sop_correct / len(rows["input_ids"]),
        "masked_tokens": total,
        "instances": len(rows["input_ids"]),
    }


def start_ray(attempts: int = 3) -> None:
    """Ray gives a node 30 s to come up; on a machine shared with other jobs that can take longer: try again."""
    import ray

    for attempt in range(1, attempts + 1):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
            return
        except Exception:  # noqa: BLE001 - ray raises a bare Exception on a node start-up timeout
            ray.shutdown()
            if attempt == attempts:
                raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=None, help="Working directory (default: a temporary one).")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="Pretraining steps per arm (equal budgets).")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--eval-instances", type=int, default=1000)
    parser.add_argument("--skip-processor", action="store_true", help="Skip the in-process measurement.")
    parser.add_argument("--skip-pretrain", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="Also write the figures as JSON here.")
    args = parser.parse_args()

    import tempfile

    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
    from albert_dist.tokenizer.training import train_wordpiece

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-zh-"))
    tokenizer_dir = work / "vocab"
    train_wordpiece(args.corpus, tokenizer_dir, args.vocab_size, progress=lambda _: None)
    tokenizer = load_tokenizer(tokenizer_dir)
    docs = documents(args.corpus)
    print(f"corpus: {len(docs):,} documents, {sum(map(len, docs)):,} characters; vocab.txt {tokenizer.vocab_size}")
    figures = {}
    if not args.skip_processor:
        figures["processor"] = p = bench_processor(docs, tokenizer, args.rounds)
        print(
            f"DocumentProcessor, best of {args.rounds}: chars {p['chars_s']:.2f} s ({p['chars_kchars_per_s']:.0f}k"
            f" chars/s), jieba {p['jieba_s']:.2f} s ({p['jieba_kchars_per_s']:.0f}k chars/s): jieba/chars = "
            f"{p['ratio']:.2f}x"
        )
    start_ray()
    figures["prepare"] = bench_prepare(args.corpus, work, tokenizer_dir, args.rounds, args.max_seq_length)
    p = figures["prepare"]
    print(
        f"prepare_dataset on Ray Data: chars {p['chars_s']:.1f} s, jieba {p['jieba_s']:.1f} s: jieba/chars = "
        f"{p['ratio']:.2f}x"
    )
    if not args.skip_pretrain:
        models = {arm: pretrain_arm(work, arm, args.steps, args.batch_size) for arm in ARMS}
        table = {
            model: {
                masks: held_out_accuracy(models[model], work / f"prep-{masks}", args.eval_instances) for masks in ARMS
            }
            for model in ARMS
        }
        figures["wwm"] = {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "max_seq_length": args.max_seq_length,
            "held_out": table,
        }
        print(f"held-out accuracy after {args.steps} steps x {args.batch_size} (rows: trained with; columns: masks of)")
        print(f"{'model':<8}" + "".join(f"{'MLM ' + m:>14}{'SOP ' + m:>14}" for m in ARMS))
        for model, row in table.items():
            print(
                f"{model:<8}" + "".join(f"{row[m]['mlm_accuracy']:>14.3f}{row[m]['sop_accuracy']:>14.3f}" for m in ARMS)
            )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
