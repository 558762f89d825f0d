"""Named entities from tag sequences (BIO or BIOES), and entity-level precision, recall and F1.

Entities are read as seqeval reads them in strict mode (`mode="strict"` with `IOB2` or `IOBES`): an entity is a
`B-X` followed by `I-X` tags (BIO), or an `S-X`, or a `B-X I-X… E-X` (BIOES); a tag sequence that breaks these
rules (an `I-X` with no `B-X` before it, a `B-X` never closed by `E-X` in BIOES) yields no entity there. A predicted
entity counts as correct only when its type, start and end all equal a gold entity's.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

TAG = re.compile(r"^(?:O|([BIES])-(.+))$")
SCHEMES = {"BIO": "BI", "BIOES": "BIES"}

Entity = tuple[str, int, int]  # (type, first word, last word), both ends included


def parse_tag(tag: str) -> tuple[str, str | None]:
    """("O", None) or (prefix, type); ValueError for anything else."""
    match = TAG.match(tag)
    if not match:
        raise ValueError(f"tag {tag!r} is neither O nor <B|I|E|S>-<type>")
    return (match.group(1), match.group(2)) if match.group(1) else ("O", None)


def scheme_of(tags: Iterable[str]) -> str:
    """BIOES when any tag uses E- or S-, else BIO."""
    prefixes = {parse_tag(tag)[0] for tag in tags}
    return "BIOES" if prefixes & {"E", "S"} else "BIO"


def entities(tags: Sequence[str], scheme: str) -> list[Entity]:
    """The entities of one sentence's tags, read strictly in `scheme` ("BIO" or "BIOES")."""
    found: list[Entity] = []
    start: int | None = None
    kind: str | None = None
    for i, tag in enumerate(tags):
        prefix, tag_type = parse_tag(tag)
        inside = start is not None and prefix in ("I", "E") and tag_type == kind
        if scheme == "BIO":
            if start is not None and not inside:
                found.append((kind, start, i - 1))
                start = None
            if prefix == "B":
                start, kind = i, tag_type
            elif not inside:
                start = None
        else:
            if prefix == "S":
                found.append((tag_type, i, i))
                start = None
            elif prefix == "B":
                start, kind = i, tag_type
            elif inside and prefix == "E":
                found.append((kind, start, i))
                start = None
            elif not (inside and prefix == "I"):
                start = None
    if scheme == "BIO" and start is not None:
        found.append((kind, start, len(tags) - 1))
    return found


def entity_counts(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], scheme: str) -> Counter:
    """Per type and overall ("") counts of gold, predicted and correct entities over sentences."""
    counts: Counter = Counter()
    for gold_tags, predicted_tags in zip(gold, predicted):
        true = set(entities(gold_tags, scheme))
        guessed = set(entities(predicted_tags, scheme))
        for kind, *_ in true:
            counts["gold", kind] += 1
        for kind, *_ in guessed:
            counts["predicted", kind] += 1
        for kind, *_ in true & guessed:
            counts["correct", kind] += 1
    return counts


def entity_metrics(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], scheme: str) -> dict[str, float]:
    """precision, recall, f1 (micro, over all entities) and `<type>_f1` per entity type seen in either side."""
    counts = entity_counts(gold, predicted, scheme)
    types = sorted({kind for (_, kind) in counts})
    out = _prf(
        sum(counts["gold", t] for t in types),
        sum(counts["predicted", t] for t in types),
        sum(counts["correct", t] for t in types),
    )
    for kind in types:
        out[f"{kind}_f1"] = _prf(counts["gold", kind], counts["predicted", kind], counts["correct", kind])["f1"]
    return out


def _prf(gold: int, predicted: int, correct: int) -> dict[str, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def tags_from_spans(length: int, spans: Iterable[Entity], scheme: str = "BIO") -> list[str]:
    """Tags of a sentence of `length` words holding the entities `spans` (type, first, last); overlapping spans
    raise ValueError."""
    tags = ["O"] * length
    for kind, first, last in sorted(spans, key=lambda span: span[1]):
        if any(tag != "O" for tag in tags[first : last + 1]):
            raise ValueError(f"entity {kind} at {first}..{last} overlaps another")
        if scheme == "BIOES" and first == last:
            tags[first] = f"S-{kind}"
            continue
        tags[first] = f"B-{kind}"
        for i in range(first + 1, last + 1):
            tags[i] = f"I-{kind}"
        if scheme == "BIOES":
            tags[last] = f"E-{kind}"
    return tags
