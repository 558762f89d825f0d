"""Data pipeline throughput: preparation (tokens/s and instances/s per CPU) and masking/collation against
transformers' DataCollatorForLanguageModeling on the same token ids.

    python benchmarks/bench_data.py            # full: >= 50 MB generated corpus
    python benchmarks/bench_data.py --quick    # 5 MB, a few seconds of collation

The corpus is generated: sentences of the standard library's docstrings recombined by a seeded RNG into many
documents (no copied text is shipped). Training consumption is an assumption, not a measurement: ALBERT-base in
bf16 on this kind of CPU trains on about 1,500 tokens/s (--train-tokens-per-s to change it).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def generate_corpus(directory: Path, megabytes: float, files: int, seed: int) -> list[Path]:
    """Documents of 3-40 stdlib-docstring sentences drawn at random, blank-line separated, over `files` files."""
    from albert_dist.data.sentences import split_sentences
    from albert_dist.demo.corpus import stdlib_documents

    sentences = [s for doc in stdlib_documents() for s in split_sentences(doc, "en") if len(s) > 20]
    rng = np.random.default_rng(seed)
    target = int(megabytes * 2**20 / files)
    paths = []
    for index in range(files):
        path = directory / f"corpus-{index:02d}.txt"
        size = 0
        with open(path, "w", encoding="utf-8") as f:
            while size < target:
                doc = " ".join(sentences[i] for i in rng.integers(len(sentences), size=int(rng.integers(3, 41))))
                f.write(doc + "\n\n")
                size += len(doc) + 2
        paths.append(path)
    return paths


def bench_prepare(paths: list[Path], work: Path, args) -> tuple[dict, Path]:
    from albert_dist.data.config import DataJobConfig
    from albert_dist.data.prepare import prepare_dataset
    from albert_dist.tokenizer.training import train_sentencepiece

    started = time.perf_counter()
    tok_dir = work / "spm"
    train_sentencepiece(paths, tok_dir, args.vocab_size, input_sentence_size=200_000, progress=lambda _: None)
    print(f"tokenizer: trained {args.vocab_size} pieces in {time.perf_counter() - started:.1f} s (not counted)")
    cfg = DataJobConfig.model_validate(
        {
            "run": {"output_dir": str(work)},
            "data": {
                "inputs": [str(p) for p in paths],
                "max_seq_length": args.max_seq_length,
                "tokenizer_actors": args.cpus,
            },
            "tokenizer": {"path": str(tok_dir)},
        }
    )
    summary = prepare_dataset(cfg, progress_bars=False, log=lambda _: None)
    return summary, work / "data/prepared"


def bench_collation(prepared: Path, args) -> None:
    from transformers import AlbertTokenizer as HFAlbertTokenizer
    from transformers import DataCollatorForLanguageModeling

    from albert_dist.data.loading import load_prepared
    from albert_dist.data.masking import batch_rng

    data = load_prepared(prepared)
    rows = data.train.take_batch(args.batch_size * args.batches, batch_format="numpy")
    batches = [
        {k: v[i : i + args.batch_size] for k, v in rows.items()}
        for i in range(0, len(rows["input_ids"]), args.batch_size)
    ]
    ours = data.collator()
    hf_tok = HFAlbertTokenizer(vocab_file=str(prepared / "tokenizer/spiece.model"))
    hf = DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15, pad_to_multiple_of=8)
    # transformers takes a list of dicts of lists: converted up front, not timed.
    hf_batches = [
        [
            {"input_ids": ids.tolist(), "token_type_ids": tt.tolist()}
            for ids, tt in zip(b["input_ids"], b["token_type_ids"])
        ]
        for b in batches
    ]

    def timed(fn) -> float:
        fn()  # warm-up
        start = time.perf_counter()
        for _ in range(args.repeats):
            fn()
        return (time.perf_counter() - start) / args.repeats

    ours_s = timed(lambda: [ours(b, batch_rng(0, 0, 0, i)) for i, b in enumerate(batches)])
    hf_s = timed(lambda: [hf(b) for b in hf_batches])
    n = sum(len(b["input_ids"]) for b in batches)
    print(f"collation ({len(batches)} batches of {args.batch_size}, seq <= {args.max_seq_length}):")
    print(f"  albert-dist MaskingCollator (whole-word n-gram): {n / ours_s:>10,.0f} sequences/s")
    print(f"  transformers DataCollatorForLanguageModeling:    {n / hf_s:>10,.0f} sequences/s")
    print(f"  ratio: {hf_s / ours_s:.1f}x (goal >= 3x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 MB corpus, 3000 pieces, fewer collation repeats")
    parser.add_argument("--corpus-mb", type=float, default=50.0)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--cpus", type=int, default=2, help="Ray CPUs = tokenizer actors")
    parser.add_argument(
        "--vocab-size", type=int, default=4000, help="the recombined corpus has ~5k distinct pieces at most"
    )
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--train-tokens-per-s",
        type=float,
        default=1500.0,
        help="assumed ALBERT-base bf16 training throughput on this machine",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.corpus_mb, args.vocab_size, args.batches, args.repeats = 5.0, 3000, 20, 2

    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        (work / "corpus").mkdir()
        paths = generate_corpus(work / "corpus", args.corpus_mb, args.files, args.seed)
        size = sum(p.stat().st_size for p in paths) / 2**20
        print(f"corpus: {size:.1f} MB in {len(paths)} files, generated in {time.perf_counter() - started:.1f} s")
        summary, prepared = bench_prepare(paths, work, args)
        per_cpu = summary["tokens_per_second"] / args.cpus
        print(
            f"prepare: {summary['documents']:,} documents, {summary['tokens']:,} tokens, "
            f"{summary['instances']:,} instances in {summary['seconds']:.1f} s on {args.cpus} CPUs"
        )
        print(
            f"  {summary['tokens_per_second']:,.0f} input tokens/s ({per_cpu:,.0f} per CPU), "
            f"{summary['instances_per_second']:,.0f} instances/s "
            f"({summary['instances_per_second'] / args.cpus:,.0f} per CPU)"
        )
        print(
            f"  vs ALBERT-base training at an assumed {args.train_tokens_per_s:,.0f} tokens/s: "
            f"{summary['tokens_per_second'] / args.train_tokens_per_s:.0f}x ahead (goal >= 10x)"
        )
        bench_collation(prepared, args)
    ray.shutdown()


if __name__ == "__main__":
    main()
