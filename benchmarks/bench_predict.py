"""`albert-dist predict` streamed through Ray (read in ranges by Ray tasks, an actor pool predicting) against the same
input predicted in one process: rows/s of each, their ratio, and the streamed path's fixed cost.

Each side runs in a fresh Python process as the command does (the streamed one starts its own local Ray), on the
same CSV of standard-library docstring lines, with an ALBERT preset (random init: speed does not depend on the
weights) and a SentencePiece tokenizer trained on the same lines. The wall time of each whole run is measured, and
the rate its own progress line prints is read back as a second measure. The fixed cost is a streamed run of
`--small-rows` rows less an in-process one.

    python benchmarks/bench_predict.py                          # ALBERT tiny, 10,000 rows, max_seq_length 128
    python benchmarks/bench_predict.py --preset base --rows 2000
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN = """
import sys
from albert_dist.finetune.predict import run_predict
model, source, target, threshold = sys.argv[1:]
run_predict(model, source, target, precision="fp32", actor_threshold=int(threshold))
"""


def build(workdir: Path, preset: str, max_seq_length: int) -> tuple[Path, list[str]]:
    """A randomly initialised classifier of `preset` with a SentencePiece tokenizer, and the lines to predict."""
    import torch

    from albert_dist.demo.corpus import write_stdlib_corpus
    from albert_dist.finetune import inference
    from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
    from albert_dist.tokenizer.training import train_sentencepiece

    corpus = write_stdlib_corpus(workdir / "stdlib.txt", max_chars=2_000_000)
    lines = [" ".join(line.split()) for line in corpus.read_text().splitlines() if len(line.split()) >= 3]
    model = workdir / "model"
    train_sentencepiece(corpus, model, 4000, progress=lambda _: None)
    torch.manual_seed(0)
    config = AlbertConfig.from_preset(preset, vocab_size=load_tokenizer(model).vocab_size, num_labels=2)
    AlbertForSequenceClassification(config).save_pretrained(model)
    load_tokenizer(model).save(model)
    inference.save_reading(model, max_seq_length)
    return model, lines


def write_input(path: Path, lines: list[str], rows: int) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        writer.writerows((i, lines[i % len(lines)]) for i in range(rows))
    return path


def timed_run(model: Path, source: Path, streamed: bool) -> tuple[float, float]:
    """Wall seconds of a whole run in a fresh process, and the rows/s its last progress line says."""
    target = source.with_suffix(".streamed.csv" if streamed else ".here.csv")
    env = {**os.environ, "RAY_ADDRESS": "local"}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", RUN, str(model), str(source), str(target), "0" if streamed else str(1 << 62)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"predict failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    rate = re.findall(r"^predict: [\d,/]+ rows \(([\d,.]+)/s\)", result.stdout, re.MULTILINE)[-1]
    return seconds, float(rate.replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--small-rows", type=int, default=200)
    parser.add_argument("--max-seq-length", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as tmp:
        workdir = Path(tmp)
        model, lines = build(workdir, args.preset, args.max_seq_length)
        source = write_input(workdir / "in.csv", lines, args.rows)
        small = write_input(workdir / "small.csv", lines, args.small_rows)
        print(
            f"ALBERT {args.preset}, max_seq_length {args.max_seq_length}, fp32; {args.rows:,} rows "
            f"({source.stat().st_size / 2**20:.1f} MiB) of stdlib docstring lines; {os.cpu_count()} CPUs"
        )
        results = {}
        for name, streamed in (("in-process", False), ("streamed", True)):
            seconds, rate = timed_run(model, source, streamed)
            results[name] = args.rows / seconds
            print(
                f"{name:>10}: {seconds:6.1f} s wall, {args.rows / seconds:7.1f} rows/s; its progress line: {rate:,.1f} rows/s"
            )
        print(f"streamed / in-process, rows/s over the whole run: {results['streamed'] / results['in-process']:.2f}x")
        here, _ = timed_run(model, small, False)
        streamed, _ = timed_run(model, small, True)
        print(f"fixed cost of streaming ({args.small_rows} rows): {streamed:.1f} s against {here:.1f} s in process")


if __name__ == "__main__":
    main()
