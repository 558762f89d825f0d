"""Length-grouped against random batches: fine-tuning training examples/s, and prediction rows/s sorted by length
against input order, on a real short-text classification set.

The data are the fortune-cookie files of Debian's `fortunes` package (`apt-get install fortunes`): each text is
labelled with its file (computers, politics, science, law, food, love), 1 to ~60 words. A SentencePiece model is
trained on them; the classifier is randomly initialised (speed does not depend on the weights). Training steps
(forward, loss, backward, fused AdamW) run the same model on batches of both orders interleaved round by round,
each round taking an evenly spread sample of each epoch's batches; medians are reported.

    python benchmarks/bench_grouping.py                    # ALBERT tiny, batch 32, max_seq_length 128
    python benchmarks/bench_grouping.py --preset base --rounds 2 --steps 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from albert_dist.data import batching
from albert_dist.finetune import inference
from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.training import train_sentencepiece
from albert_dist.train import optim

FORTUNES = Path("/usr/share/games/fortunes")
CATEGORIES = ("computers", "politics", "science", "law", "food", "love")


def fortune_rows() -> tuple[list[str], np.ndarray]:
    """Every fortune of CATEGORIES as one line of text, and its category's index."""
    texts, labels = [], []
    for label, category in enumerate(CATEGORIES):
        path = FORTUNES / category
        if not path.is_file():
            raise SystemExit(f"{path} not found: install Debian's fortunes package (apt-get install fortunes)")
        for entry in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            text = " ".join(entry.split())
            if text:
                texts.append(text)
                labels.append(label)
    return texts, np.asarray(labels, dtype=np.int64)


def encode(texts: list[str], labels: np.ndarray, max_seq_length: int, vocab_size: int, workdir: Path):
    corpus = workdir / "fortunes.txt"
    corpus.write_text("\n".join(texts) + "\n")
    train_sentencepiece(corpus, workdir / "tokenizer", vocab_size, progress=lambda _: None)
    tokenizer = load_tokenizer(workdir / "tokenizer")
    arrays = batching.encode_texts(tokenizer, texts, None, max_seq_length)
    return batching.EncodedSplit({**arrays, "label": labels}), tokenizer.vocab_size


def train_rates(
    model, encoded: batching.EncodedSplit, orders: dict[str, np.ndarray], batch_size: int, steps: int, rounds: int
) -> dict[str, float]:
    """Median training examples/s of each order: per round, `steps` batches spread evenly over the epoch."""
    optimizer = optim.build_optimizer(
        "adamw",
        optim.parameter_groups(model.named_parameters(), 0.01),
        lr=1e-5,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=0.01,
    )
    model.train()
    count = len(encoded) // batch_size
    batches = {
        name: [
            batching.collate({k: v[order[i * batch_size : (i + 1) * batch_size]] for k, v in encoded.arrays.items()}, 8)
            for i in range(count)
        ]
        for name, order in orders.items()
    }

    def step(batch):
        loss = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            labels=batch["label"],
        ).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for name in orders:  # warm-up
        step(batches[name][0])
    rates = {name: [] for name in orders}
    for r in range(rounds):
        picks = [(r + j * rounds) * count // (steps * rounds) for j in range(steps)]
        for name in list(orders) if r % 2 == 0 else list(reversed(orders)):
            start = time.perf_counter()
            for i in picks:
                step(batches[name][i])
            rates[name].append(steps * batch_size / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


def predict_rates(model, encoded: batching.EncodedSplit, batch_size: int, rounds: int) -> dict[str, float]:
    """Median rows/s of prediction over the whole split: input order against sorted by length (then restored)."""
    runs = {
        "input order": lambda: inference.predict_logits(model, batching.batches(encoded, batch_size, 8)),
        "sorted": lambda: inference.split_logits(model, encoded, batch_size),
    }
    rates = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(reversed(runs)):
            start = time.perf_counter()
            runs[name]()
            rates[name].append(len(encoded) / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


def mean_width(encoded: batching.EncodedSplit, order: np.ndarray, batch_size: int) -> float:
    lengths = encoded.arrays["length"][order]
    return float(np.mean([-(-lengths[i : i + batch_size].max() // 8) * 8 for i in range(0, len(order), batch_size)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="timed training steps per order per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--predict-rows", type=int, default=1024)
    args = parser.parse_args()

    texts, labels = fortune_rows()
    with tempfile.TemporaryDirectory() as tmp:
        encoded, vocab_size = encode(texts, labels, args.max_seq_length, 4000, Path(tmp))
    lengths = encoded.arrays["length"]
    torch.manual_seed(0)
    model = AlbertForSequenceClassification(
        AlbertConfig.from_preset(
            args.preset, vocab_size=vocab_size, num_labels=len(CATEGORIES), max_position_embeddings=512
        )
    )
    rng = np.random.default_rng(0)
    orders = {
        "random": rng.permutation(len(encoded)),
        "grouped": batching.length_grouped_order(lengths, args.batch_size, np.random.default_rng(0)),
    }
    print(
        f"fortunes: {len(encoded)} texts in {len(CATEGORIES)} classes, tokens p10/p50/p90/max "
        f"{np.percentile(lengths, [10, 50, 90]).astype(int).tolist()}/{lengths.max()} (cut at "
        f"{args.max_seq_length}); ALBERT {args.preset}, batch {args.batch_size}, fp32, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    widths = {name: mean_width(encoded, order, args.batch_size) for name, order in orders.items()}
    print(
        f"mean batch width: random {widths['random']:.1f}, grouped {widths['grouped']:.1f} tokens "
        f"(real tokens per row: {lengths.mean():.1f})"
    )
    rates = train_rates(model, encoded, orders, args.batch_size, args.steps, args.rounds)
    print(
        f"fine-tuning examples/s: random {rates['random']:.1f}, grouped {rates['grouped']:.1f}, "
        f"ratio {rates['grouped'] / rates['random']:.2f}x",
        flush=True,
    )
    subset = batching.EncodedSplit({k: v[: args.predict_rows] for k, v in encoded.arrays.items()})
    predicted = predict_rates(model, subset, 64, args.rounds)
    print(
        f"prediction rows/s ({len(subset)} rows, batch 64): input order {predicted['input order']:.1f}, sorted "
        f"{predicted['sorted']:.1f}, ratio {predicted['sorted'] / predicted['input order']:.2f}x"
    )


if __name__ == "__main__":
    main()
