"""Learnable toy tasks and a tiny "pretrained" ALBERT directory for the fine-tuning tests and the benchmark."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

FILLER = (
    "the function returns a value from the object and the list of names in this module is used to "
    "read each file with a string of data for the class method when an error is raised"
).split()
KEYWORDS = ("socket", "thread", "parser", "archive")
POSITIVE = KEYWORDS[:2]  # single-text task: label "yes" when the text mentions one of these


def sentence(rng: random.Random, keywords: list[str], length: int = 10) -> str:
    words = [rng.choice(FILLER) for _ in range(length)]
    for word in keywords:
        words.insert(rng.randrange(len(words) + 1), word)
    return " ".join(words)


def single_rows(n: int, seed: int) -> list[dict]:
    """label "yes" iff the text holds a POSITIVE keyword; balanced."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        word = rng.choice(POSITIVE if positive else KEYWORDS[2:])
        rows.append({"text": sentence(rng, [word]), "label": "yes" if positive else "no"})
    rng.shuffle(rows)
    return rows


def pair_rows(n: int, seed: int) -> list[dict]:
    """label 1 iff the *second* text holds a POSITIVE keyword; the first holds a random keyword as a distractor,
    so only a model that reads segment B learns it."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        b = rng.choice(POSITIVE if i % 2 == 0 else KEYWORDS[2:])
        rows.append(
            {
                "sentence1": sentence(rng, [rng.choice(KEYWORDS)], 6),
                "sentence2": sentence(rng, [b], 6),
                "label": int(b in POSITIVE),
            }
        )
    rng.shuffle(rows)
    return rows


def count_rows(n: int, seed: int) -> list[dict]:
    """score = how many keywords the text holds (0-3), an STS-B-like regression target."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randrange(4)
        rows.append({"text": sentence(rng, rng.sample(KEYWORDS, k), 8), "score": float(k)})
    return rows


def write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_model_dir(directory: Path, tokenizer_dir: Path, **overrides) -> Path:
    """A randomly initialised tiny AlbertForPreTraining with its tokenizer, in the layout pretraining writes."""
    import torch

    from albert_dist.model import AlbertConfig, AlbertForPreTraining
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    torch.manual_seed(0)
    config = AlbertConfig(
        **{
            **dict(
                vocab_size=tokenizer.vocab_size,
                embedding_size=32,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
                max_position_embeddings=128,
            ),
            **overrides,
        }
    )
    AlbertForPreTraining(config).save_pretrained(directory)
    tokenizer.save(directory)
    return directory
