"""Data preparation's scaling on one corpus file: tokens/s end to end at 1 and 2 CPUs, the file cut into ranges
(`data.range_bytes` automatic) against the same file read whole by one task (range_bytes above its size).

    apt-get install -y manpages-zh python3-doc   # the real corpora (benchmarks/corpora.py)
    python benchmarks/bench_prepare_scaling.py                       # en SentencePiece, zh WordPiece ± jieba
    python benchmarks/bench_prepare_scaling.py --arms zh-jieba --cpus 1 2 --mb 2
    python benchmarks/bench_prepare_scaling.py --address auto --cpus 2   # a running Ray cluster (ray start ...)
    python benchmarks/bench_prepare_scaling.py --marginal --mb 16        # the steady-state rate: 16 MB against 48 MB

Arms: `en-spm` (Python's documentation, a SentencePiece model), `zh-wp` and `zh-wp-jieba` (Debian's Chinese
manual pages, a WordPiece vocabulary, without and with jieba whole-word masks). Tokenizers are trained first, not
timed. Each measurement is one `prepare_dataset` in a fresh Ray with that many CPUs and as many tokenizer actors;
its tokens/s is the summary's (input tokens over the job's wall time: ranges, tokenizing, instances, shards). The
load average is printed with each figure: on a shared machine the figures are only as good as the quiet.

`--marginal` measures each CPU count on the corpus at `--mb` and at three times that, and prints the rate of the
difference (extra tokens over extra seconds): the steady-state rate, without the fixed start-up costs (Ray's
actors and workers starting, jieba's dictionary) that decide a small job's end-to-end rate.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

ARMS = {
    "en-spm": ("en-pydocs", "sentencepiece", None),
    "zh-wp": ("zh-manpages", "wordpiece", None),
    "zh-wp-jieba": ("zh-manpages", "wordpiece", "jieba"),
}
WHOLE = 10**12  # a range size above any file: the file is read by one task, as before ranges existed


def write_corpus(name: str, path: Path, megabytes: float) -> Path:
    """The corpus as one blank-line separated file, its first `megabytes` (whole documents; the corpus read again
    from its start when it is smaller, so that the job's fixed start-up costs do not hide how its work scales)."""
    from corpora import documents

    limit, size, kept = int(megabytes * 2**20), 0, []
    for doc in itertools.cycle(list(documents(name))):
        kept.append(doc)
        size += len(doc.encode()) + 2
        if size >= limit:
            break
    path.write_text("\n\n".join(kept) + "\n", encoding="utf-8")
    return path


def train_tokenizer(kind: str, corpus: Path, out: Path, vocab_size: int) -> Path:
    from albert_dist.tokenizer.training import train_sentencepiece, train_wordpiece

    train = train_wordpiece if kind == "wordpiece" else train_sentencepiece
    train([corpus], out, vocab_size, input_sentence_size=200_000, progress=lambda _: None)
    return out


def prepare(
    corpus: Path, tokenizer: Path, kind: str, segmenter: str | None, actors: int, range_bytes: int | None, work: Path
) -> dict:
    from albert_dist.data.config import DataJobConfig
    from albert_dist.data.prepare import prepare_dataset

    cfg = DataJobConfig.model_validate(
        {
            "run": {"output_dir": str(work)},
            "data": {
                "inputs": [str(corpus)],
                "max_seq_length": 128,
                "tokenizer_actors": actors,
                "word_segmenter": segmenter,
                "range_bytes": range_bytes,
                "language": "zh" if kind == "wordpiece" else "en",
            },
            "tokenizer": {"kind": kind, "path": str(tokenizer)},
        }
    )
    return prepare_dataset(cfg, progress_bars=False, log=lambda _: None)


def per_core(corpus: Path, tokenizer: Path, kind: str, segmenter: str | None) -> dict:
    """The work one range's actor does (parse, split, tokenize, jieba, instances), in this process without Ray:
    tokens per second of this process's CPU time (what one core gives when it is not shared) and of wall time."""
    from albert_dist.data.instances import InstanceSpec
    from albert_dist.data.process import DocumentProcessor, ProcessSettings
    from albert_dist.data.readers import parse_file
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    settings = ProcessSettings(
        spec=InstanceSpec(128, 0.1, tok.cls_id, tok.sep_id),
        word_segmenter=segmenter,
        language="zh" if kind == "wordpiece" else "en",
    )
    totals: Counter = Counter()
    processor = DocumentProcessor(tok, settings, tally=totals.update)
    cpu, wall = time.process_time(), time.perf_counter()
    documents, _ = parse_file(str(corpus), corpus.read_bytes(), "auto", "text")
    for i in range(0, len(documents), 64):
        batch = documents[i : i + 64]
        processor(
            {
                "doc_key": np.array([d["doc_key"] for d in batch], object),
                "text": np.array([d["text"] for d in batch], object),
                "presplit": np.array([d["presplit"] for d in batch], bool),
            }
        )
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"tokens": totals["tokens"], "cpu_s": cpu, "wall_s": wall}


def measure(
    args,
    corpus: Path,
    tokenizer: Path,
    kind: str,
    segmenter: str | None,
    cpus: int,
    range_bytes: int | None,
    work: Path,
) -> dict:
    import ray

    if args.address:
        ray.init(address=args.address, log_to_driver=False, configure_logging=False)
        cpus = int(ray.cluster_resources()["CPU"])
    else:
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        load_before, driver_cpu = os.getloadavg()[0], time.process_time()
        summary = prepare(corpus, tokenizer, kind, segmenter, cpus, range_bytes, work)
        return {
            "cpus": cpus,
            "tokens": summary["tokens"],
            "seconds": summary["seconds"],
            "driver_cpu_s": time.process_time() - driver_cpu,
            "tokens_per_second": summary["tokens_per_second"],
            "load": (load_before, os.getloadavg()[0]),
        }
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--cpus", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--mb", type=float, default=3.0, help="corpus size (the first MB of each real corpus)")
    parser.add_argument("--no-whole", action="store_true", help="skip the read-whole reference at the most CPUs")
    parser.add_argument("--address", help="attach to this Ray cluster instead of starting one per measurement")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--marginal", action="store_true", help="the rate of --mb against three times --mb")
    parser.add_argument(
        "--per-core",
        action="store_true",
        help="only the per-core rate: one range's work in this process, CPU time (no Ray)",
    )
    args = parser.parse_args()

    print(f"machine: {_cpu_model()}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        work = Path(tmp)
        tokenizers: dict[tuple[str, str], tuple[Path, Path]] = {}
        for arm in args.arms:
            name, kind, segmenter = ARMS[arm]
            if (name, kind) not in tokenizers:
                corpus = write_corpus(name, work / f"{name}.txt", args.mb)
                tokenizers[name, kind] = corpus, train_tokenizer(kind, corpus, work / f"tok-{name}", args.vocab_size)
            corpus, tokenizer = tokenizers[name, kind]
            print(f"\n{arm}: {corpus.stat().st_size / 2**20:.1f} MB, one file")
            if args.marginal:
                bigger = write_corpus(name, work / f"{name}-x3.txt", 3 * args.mb)
                marginal(args, arm, corpus, bigger, tokenizer, kind, segmenter, work)
                continue
            if args.per_core:
                load = os.getloadavg()[0]
                r = per_core(corpus, tokenizer, kind, segmenter)
                rate = r["tokens"] / r["cpu_s"]
                print(
                    f"  one process, no Ray: {r['tokens']:,} tokens in {r['cpu_s']:.1f} s of CPU "
                    f"({r['wall_s']:.1f} s wall): {rate:,.0f} tokens per CPU-second "
                    f"({r['tokens'] / r['wall_s']:,.0f}/s wall)  load average {load:.1f} → {os.getloadavg()[0]:.1f}"
                )
                hours = 30e9 * r["tokens"] / corpus.stat().st_size / (rate * 64) / 3600
                print(
                    f"  30 GB of this text ({r['tokens'] / corpus.stat().st_size:.2f} tokens/byte) on 64 cores "
                    f"at this rate: {hours:.1f} h",
                    flush=True,
                )
                continue
            rates = {}
            runs = [(c, None) for c in args.cpus] + ([] if args.no_whole else [(max(args.cpus), WHOLE)])
            for index, (cpus, range_bytes) in enumerate(runs):
                r = measure(args, corpus, tokenizer, kind, segmenter, cpus, range_bytes, work / f"{arm}-{index}")
                how = "read whole (one task)" if range_bytes == WHOLE else "cut into ranges"
                rates[r["cpus"], range_bytes] = r["tokens_per_second"]
                print(
                    f"  {r['cpus']} CPU(s), {how:<22} {r['tokens']:>10,} tokens in {r['seconds']:>7.1f} s: "
                    f"{r['tokens_per_second']:>9,.0f} tokens/s ({r['tokens_per_second'] / r['cpus']:>8,.0f} per "
                    f"CPU)  load average {r['load'][0]:.1f} → {r['load'][1]:.1f}",
                    flush=True,
                )
            cut = sorted((c, rate) for (c, rb), rate in rates.items() if rb is None)
            if len(cut) > 1:
                (c1, r1), (c2, r2) = cut[0], cut[-1]
                print(f"  scaling {c1} → {c2} CPUs: {r2 / r1:.2f}x (goal >= 1.7x from 1 to 2)")
            if (max(args.cpus), WHOLE) in rates and (max(args.cpus), None) in rates:
                print(
                    f"  cut vs read whole at {max(args.cpus)} CPUs: "
                    f"{rates[max(args.cpus), None] / rates[max(args.cpus), WHOLE]:.2f}x"
                )
            one_cpu = rates.get((1, None))
            if one_cpu:
                tokens_per_byte = r["tokens"] / corpus.stat().st_size
                hours = 30e9 * tokens_per_byte / (one_cpu * 64) / 3600
                print(
                    f"  30 GB of this text ({tokens_per_byte:.2f} tokens/byte) on 64 cores at the 1-CPU rate: "
                    f"{hours:.1f} h"
                )


def marginal(args, arm, small: Path, big: Path, tokenizer: Path, kind, segmenter, work: Path) -> None:
    """The steady-state rate at each CPU count: (tokens of `big` − tokens of `small`) over the difference of their
    wall times; and how much of a core the driver (Ray Data's executor, the shard writer) used."""
    rates = {}
    for cpus in args.cpus:
        runs = [
            measure(args, c, tokenizer, kind, segmenter, cpus, None, work / f"{arm}-{cpus}-{c.stem}")
            for c in (small, big)
        ]
        (a, b), rates[cpus] = runs, (runs[1]["tokens"] - runs[0]["tokens"]) / (runs[1]["seconds"] - runs[0]["seconds"])
        print(
            f"  {cpus} CPU(s): {a['tokens']:,} tokens in {a['seconds']:.1f} s, {b['tokens']:,} in {b['seconds']:.1f} s: "
            f"{rates[cpus]:,.0f} tokens/s marginal; the driver used {b['driver_cpu_s'] / b['seconds']:.0%} of a core; "
            f"load average {a['load'][0]:.1f} → {b['load'][1]:.1f}",
            flush=True,
        )
    if len(rates) > 1:
        low, high = min(rates), max(rates)
        print(f"  marginal scaling {low} → {high} CPUs: {rates[high] / rates[low]:.2f}x (goal >= 1.7x from 1 to 2)")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    main()
