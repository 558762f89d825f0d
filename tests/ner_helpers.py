"""Chinese sentences with tagged people, places and organisations, in the layouts NER sets ship in."""

from __future__ import annotations

import json
import random
from pathlib import Path

PEOPLE = ["张伟", "李娜", "王芳", "刘洋", "陈静", "赵磊", "孙丽", "周杰"]
PLACES = ["北京", "上海", "广州", "深圳", "杭州", "南京", "成都", "西安"]
ORGANISATIONS = ["清华大学", "华为公司", "人民日报", "中国银行", "北京大学", "国家统计局"]
TEMPLATES = [
    "{PER}昨天去{LOC}参加了{ORG}的会议。",
    "{ORG}在{LOC}开设了新的办公室，{PER}担任负责人。",
    "听说{PER}和{PER}都在{LOC}工作。",
    "今天天气很好，我们一起去公园散步吧。",
    "{LOC}的{ORG}发布了新的报告。",
    "记者{PER}从{LOC}发回报道。",
]
NAMES = {"PER": PEOPLE, "LOC": PLACES, "ORG": ORGANISATIONS}


def tagged_sentence(rng: random.Random) -> tuple[str, list[tuple[str, int, int]]]:
    """A sentence and its entities as (type, first character, last character)."""
    template = rng.choice(TEMPLATES)
    text, spans = "", []
    while template:
        head, brace, rest = template.partition("{")
        text += head
        if not brace:
            break
        kind, _, template = rest.partition("}")
        name = rng.choice(NAMES[kind])
        spans.append((kind, len(text), len(text) + len(name) - 1))
        text += name
    return text, spans


def sentences(n: int, seed: int) -> list[tuple[str, list[tuple[str, int, int]]]]:
    rng = random.Random(seed)
    return [tagged_sentence(rng) for _ in range(n)]


def passages(n: int, seed: int, most: int = 4) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """`n` texts of 1 to `most` sentences run together: longer than a small model's length, read in windows."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text, spans = "", []
        for sentence, sentence_spans in [tagged_sentence(rng) for _ in range(rng.randint(1, most))]:
            spans += [(kind, first + len(text), last + len(text)) for kind, first, last in sentence_spans]
            text += sentence
        out.append((text, spans))
    return out


def write_conll(path: Path, rows, scheme: str = "BIO") -> Path:
    from albert_dist.finetune.entities import tags_from_spans

    blocks = []
    for text, spans in rows:
        tags = tags_from_spans(len(text), spans, scheme)
        blocks.append("\n".join(f"{char}\t{tag}" for char, tag in zip(text, tags)))
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


def write_cluener(path: Path, rows) -> Path:
    lines = []
    for text, spans in rows:
        label: dict = {}
        for kind, first, last in spans:
            label.setdefault(kind, {}).setdefault(text[first : last + 1], []).append([first, last])
        lines.append(json.dumps({"text": text, "label": label}, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_vocab_corpus(path: Path) -> Path:
    rows = sentences(300, seed=99)
    path.write_text("\n".join(text for text, _ in rows) + "\n", encoding="utf-8")
    return path
