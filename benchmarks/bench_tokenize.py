"""Tokens per CPU second of the tokenizer data prepare runs, side by side with the pure-Python path, on the same
lines in one process, one core (`TOKENIZERS_PARALLELISM=false`, sentencepiece `num_threads=1`), ids checked equal.

    apt-get install manpages-zh
    python benchmarks/corpora.py zh-manpages /tmp/zh_manpages.txt
    OMP_NUM_THREADS=1 python benchmarks/bench_tokenize.py --zh /tmp/zh_manpages.txt

- WordPiece (the Chinese path; a 21,128-token vocabulary trained on the corpus as prepare_zh.yaml does): the
  reference is transformers' pure-Python BERT tokenizer (v5's BertTokenizerLegacy, v4's slow BertTokenizer), the
  algorithm albert-dist ran in Python before; against `AlbertTokenizer.tokenize_batch` (`tokenizers`).
- SentencePiece (the English path; a 4,000-piece model trained on standard-library docstrings, about all they
  hold): the reference is one `encode` per line plus google's digit-comma re-split (albert-dist's former
  per-sentence path); against `tokenize_batch` (sentencepiece's batch encoder).

Run with PYTHONPATH pointing at another albert-dist checkout, the "albert-dist" row measures that version (a
version without `tokenize_batch` is timed through its per-sentence `tokenize` + `convert_tokens_to_ids`, what its
data prepare ran).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from albert_dist.data.sentences import split_sentences  # noqa: E402
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.backends import albert_preprocess
from albert_dist.tokenizer.training import train_sentencepiece, train_wordpiece


def sentences_of(path: Path, limit: int) -> list[str]:
    """The corpus's sentences (as data prepare splits them), at most `limit`."""
    out: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        out.extend(split_sentences(line))
        if len(out) >= limit:
            break
    return out[:limit]


def project_path(tokenizer):
    """What data prepare calls: `tokenize_batch`, or per sentence in a version without it."""
    if hasattr(tokenizer, "tokenize_batch"):
        return lambda lines: [ids for _, ids in tokenizer.tokenize_batch(lines)]
    return lambda lines: [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line)) for line in lines]


def python_wordpiece(vocab_dir: Path):
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as python_class
    except ImportError:
        from transformers import BertTokenizer as python_class
    tokenizer = python_class(str(vocab_dir / "vocab.txt"))
    return lambda lines: [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line)) for line in lines]


def per_line_sentencepiece(model_file: Path):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))

    def encode(line: str) -> list[int]:
        pieces = []
        for piece in sp.encode(albert_preprocess(line), out_type=str):
            if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
                cur = sp.encode(piece[:-1].replace("\u2581", ""), out_type=str)
                if piece[0] != "\u2581" and cur[0][0] == "\u2581":
                    cur = cur[1:] if len(cur[0]) == 1 else [cur[0][1:], *cur[1:]]
                pieces.extend([*cur, piece[-1]])
            else:
                pieces.append(piece)
        return [sp.piece_to_id(p) for p in pieces]

    return lambda lines: [encode(line) for line in lines]


def race(name: str, lines: list[str], contenders: dict, repeats: int) -> None:
    """Each contender once per round (so a busy spell slows them alike), the median round per contender, as tokens
    per CPU second of this process (every contender runs on one thread: on a shared machine, the figure a quiet
    core would give) and per wall second."""
    results = {label: fn(lines) for label, fn in contenders.items()}
    first = next(iter(results.values()))
    for label, ids in results.items():
        mismatched = sum(a != b for a, b in zip(ids, first))
        assert not mismatched, f"{name}: {label} differs from the reference on {mismatched} of {len(lines)} lines"
    tokens = sum(map(len, first))
    cpu: dict[str, list[float]] = {label: [] for label in contenders}
    wall: dict[str, list[float]] = {label: [] for label in contenders}
    for _ in range(repeats):
        for label, fn in contenders.items():
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            fn(lines)
            cpu[label].append(time.process_time() - start_cpu)
            wall[label].append(time.perf_counter() - start_wall)
    cpu_s = {label: statistics.median(t) for label, t in cpu.items()}
    wall_s = {label: statistics.median(t) for label, t in wall.items()}
    reference = next(iter(contenders))
    print(f"{name}: {len(lines):,} sentences, {tokens:,} tokens, identical ids")
    for label in contenders:
        print(
            f"  {label:<44} {tokens / cpu_s[label]:>10,.0f} tokens/CPU-s  ×{cpu_s[reference] / cpu_s[label]:.2f}"
            f"   ({tokens / wall_s[label]:,.0f} tokens/wall-s  ×{wall_s[reference] / wall_s[label]:.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zh", type=Path, help="Chinese corpus (benchmarks/corpora.py zh-manpages)")
    parser.add_argument("--en-chars", type=int, default=3_000_000, help="standard-library docstring characters")
    parser.add_argument("--sentences", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.zh:
            zh = sentences_of(args.zh, args.sentences)
            (tmp / "zh.txt").write_text("\n".join(zh) + "\n", encoding="utf-8")
            train_wordpiece(tmp / "zh.txt", tmp / "wp", 21128, progress=lambda _: None)
            race(
                "WordPiece, Chinese",
                zh,
                {
                    "pure Python (transformers' BasicTokenizer)": python_wordpiece(tmp / "wp"),
                    "albert-dist": project_path(load_tokenizer(tmp / "wp")),
                },
                args.repeats,
            )
        from albert_dist.demo.corpus import write_stdlib_corpus

        corpus = write_stdlib_corpus(tmp / "en.txt", max_chars=args.en_chars)
        en = sentences_of(corpus, args.sentences)
        train_sentencepiece(corpus, tmp / "sp", 4000, progress=lambda _: None)
        race(
            "SentencePiece, English",
            en,
            {
                "per line (encode + digit-comma split)": per_line_sentencepiece(tmp / "sp" / "spiece.model"),
                "albert-dist": project_path(load_tokenizer(tmp / "sp")),
            },
            args.repeats,
        )


if __name__ == "__main__":
    main()
