"""Chinese reading comprehension built from the NER helpers' sentences: a passage, a question about the one person,
place or organisation it names once, and that name's span as the answer; written in SQuAD's (CMRC2018's) layout or
as flat JSON lines."""

from __future__ import annotations

import json
import random
from pathlib import Path

from ner_helpers import tagged_sentence

QUESTIONS = {"PER": "文中提到的人是谁？", "LOC": "文中提到的地方是哪里？", "ORG": "文中提到的机构是哪个？"}


def questions(n: int, seed: int, most: int = 2) -> list[dict]:
    """`n` records {id, question, context, answers: [(text, start)]} over passages of 1 to `most` sentences, each
    asking for an entity type named exactly once in its passage."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        context, spans = "", []
        for sentence, sentence_spans in [tagged_sentence(rng) for _ in range(rng.randint(1, most))]:
            spans += [(kind, first + len(context), last + len(context)) for kind, first, last in sentence_spans]
            context += sentence
        once = [s for s in spans if sum(kind == s[0] for kind, _, _ in spans) == 1]
        if not once:
            continue
        kind, first, last = rng.choice(once)
        out.append(
            {
                "id": f"q{seed}-{len(out)}",
                "question": QUESTIONS[kind],
                "context": context,
                "answers": [(context[first : last + 1], first)],
            }
        )
    return out


def write_squad(path: Path, records: list[dict]) -> Path:
    """One paragraph per record, in SQuAD v1's (CMRC2018's) layout."""
    paragraphs = [
        {
            "context": r["context"],
            "qas": [
                {
                    "id": r["id"],
                    "question": r["question"],
                    "answers": [{"text": t, "answer_start": s} for t, s in r["answers"]],
                    **({"is_impossible": True} if not r["answers"] else {}),
                }
            ],
        }
        for r in records
    ]
    path.write_text(json.dumps({"version": "v1", "data": [{"paragraphs": paragraphs}]}, ensure_ascii=False))
    return path


def write_flat(path: Path, records: list[dict]) -> Path:
    """JSON lines as Hugging Face's squad dataset holds them."""
    lines = [
        json.dumps(
            {
                "id": r["id"],
                "question": r["question"],
                "context": r["context"],
                "answers": {"text": [t for t, _ in r["answers"]], "answer_start": [s for _, s in r["answers"]]},
            },
            ensure_ascii=False,
        )
        for r in records
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_vocab_corpus(path: Path) -> Path:
    """The NER sentences and the questions, so that the vocabulary spells both."""
    from ner_helpers import sentences

    lines = [text for text, _ in sentences(300, seed=99)] + list(QUESTIONS.values())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
