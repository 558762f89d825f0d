"""Exact match and F1 of predicted answers against gold answers, each the best over a question's gold answers, as
fractions (the official scripts print them ×100).

English (SQuAD's evaluate-v2.0.py): answers normalized (lowercase, punctuation and the articles a/an/the dropped,
whitespace collapsed), F1 over the bag of their whitespace tokens. Chinese (CMRC2018's cmrc2018_evaluate.py): EM on
the answers with its punctuation list removed; F1 from the longest common substring of the two segmented answers
(each CJK character a segment; runs of other characters split into words and punctuation marks, where the official
script calls nltk's word_tokenize). A question without a gold answer scores 1 exactly when the prediction is empty,
as SQuAD v2's script does.
"""

from __future__ import annotations

import collections
import re
import string

# cmrc2018_evaluate.py's list; its "……" never matches, as there: the script compares one character at a time
CMRC_PUNCTUATION = frozenset(
    ["-", ":", "_", "*", "^", "/", "\\", "~", "`", "+", "=", "，", "。", "：", "？", "！", "“", "”", "；", "’", "《",
     "》", "……", "·", "、", "「", "」", "（", "）", "－", "～", "『", "』"]
)  # fmt: skip
CMRC_CJK = re.compile(r"[\u4e00-\u9fa5]")
WORDS_AND_MARKS = re.compile(r"\w+|[^\w\s]")
ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
PUNCTUATION = frozenset(string.punctuation)


def squad_normalize(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def squad_exact(gold: str, predicted: str) -> float:
    return float(squad_normalize(gold) == squad_normalize(predicted))


def squad_f1(gold: str, predicted: str) -> float:
    gold_tokens, predicted_tokens = squad_normalize(gold).split(), squad_normalize(predicted).split()
    if not gold_tokens or not predicted_tokens:
        return float(gold_tokens == predicted_tokens)
    common = sum((collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def cmrc_segments(text: str) -> list[str]:
    """cmrc2018_evaluate.py's mixed_segmentation(rm_punc=True)."""
    out, run = [], ""
    for char in text.lower().strip():
        if char in CMRC_PUNCTUATION:
            continue
        if CMRC_CJK.match(char):
            out.extend(WORDS_AND_MARKS.findall(run))
            run = ""
            out.append(char)
        else:
            run += char
    return out + WORDS_AND_MARKS.findall(run)


def longest_common_substring(a: list[str], b: list[str]) -> int:
    best, previous = 0, [0] * (len(b) + 1)
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                current[j + 1] = previous[j] + 1
                best = max(best, current[j + 1])
        previous = current
    return best


def cmrc_exact(gold: str, predicted: str) -> float:
    strip = lambda text: "".join(c for c in text.lower().strip() if c not in CMRC_PUNCTUATION)  # noqa: E731
    return float(strip(gold) == strip(predicted))


def cmrc_f1(gold: str, predicted: str) -> float:
    gold_segments, predicted_segments = cmrc_segments(gold), cmrc_segments(predicted)
    common = longest_common_substring(gold_segments, predicted_segments)
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted_segments), common / len(gold_segments)
    return 2 * precision * recall / (precision + recall)


def score_answers(predicted: list[str], gold: list[tuple[str, ...]], language: str) -> dict[str, float]:
    """`exact_match` and `f1` over the questions (0 when there are none)."""
    exact, f1 = (cmrc_exact, cmrc_f1) if language == "zh" else (squad_exact, squad_f1)
    em_total = f1_total = 0.0
    for prediction, answers in zip(predicted, gold):
        if not answers:
            em_total += float(not prediction)
            f1_total += float(not prediction)
            continue
        em_total += max(exact(a, prediction) for a in answers)
        f1_total += max(f1(a, prediction) for a in answers)
    count = max(1, len(gold))
    return {"exact_match": em_total / count, "f1": f1_total / count}
