"""Sentence splitting for English and Chinese.

Sentence order is the training signal of SOP, so the splitter errs on the side of not splitting: a false
boundary inside "Dr. Smith" or "3.14" produces nonsense pairs, a missed boundary only a longer sentence.
"""

from __future__ import annotations

import re

_CJK_RANGES = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff"
_CJK_CHAR = re.compile(f"[{_CJK_RANGES}]")
_CLOSERS = "\"')\\]}’”」』》〉＂＇）］｝"

# The text is split as it is, full-width forms included: the tokenizer's own normalization is the only one.
# English: terminator run, closing quotes/brackets, whitespace, then something that can start a sentence.
_EN_BOUNDARY = re.compile(rf"([.!?．！？…]+[{_CLOSERS}]*)\s+(?=[\"'(\[‘“「『（［＂Ａ-Ｚ０-９A-Z0-9{_CJK_RANGES}])")
# Chinese: 。！？； (full- or half-width) or an ellipsis, then closing quotes/brackets; no space needed.
_ZH_BOUNDARY = re.compile(rf"((?:[。｡！？；!?;]+|\.{{3,}}|…+)[{_CLOSERS}]*)\s*")

# Words after which a period never ends a sentence (titles, Latin abbreviations, references). Case matters:
# "No. 5" is an abbreviation, "said no." is not.
_ABBREVIATIONS = frozenset(
    """
    Mr Mrs Ms Dr Prof Sr Jr St Mt Gen Col Lt Sgt Capt Rev Hon mr mrs ms dr prof
    No Nos Vol Vols Fig Figs Eq Eqs Ch Sec Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec
    vs cf al approx pp
""".split()
)
# Dotted acronyms such as "e.g.", "i.e.", "U.S.", "a.m." (a word before the final period containing a period).
_DOTTED = re.compile(r"(?:^|\s|\()(?:[A-Za-z]\.)+[A-Za-z]?\.?$")
# Whitespace to both tokenizers (BERT's normalizer deletes \v \f \x1c-\x1f \x85 as control characters, so
# they are not replaced by spaces here): a run of it becomes one space without changing any token.
_WHITESPACE = re.compile(r"[^\S\x0b\x0c\x1c-\x1f\x85]+")


def collapse_whitespace(text: str) -> str:
    """`text` with whitespace runs as single spaces, stripped; the tokenizers' tokens stay the same."""
    return _WHITESPACE.sub(" ", text).strip()


def cjk_share(text: str) -> float:
    """Share of CJK characters among the non-space characters."""
    visible = len(text) - sum(1 for c in text if c.isspace())
    return len(_CJK_CHAR.findall(text)) / visible if visible else 0.0


def detect_language(text: str, threshold: float = 0.2) -> str:
    """'zh' when at least `threshold` of the visible characters are CJK, else 'en'."""
    return "zh" if cjk_share(text[:5000]) >= threshold else "en"


def split_sentences(text: str, language: str = "auto") -> list[str]:
    """Sentences of `text` (whitespace collapsed, nothing else changed); `language` is 'en', 'zh' or 'auto'."""
    text = collapse_whitespace(text)
    if not text:
        return []
    if language == "auto":
        language = detect_language(text)
    pieces = _split_zh(text) if language == "zh" else _split_en(text)
    return [p for p in (s.strip() for s in pieces) if p]


def _split_zh(text: str) -> list[str]:
    parts = _ZH_BOUNDARY.split(text)
    # re.split with one group alternates text and the captured terminator: glue each terminator back on.
    return [body + end for body, end in zip(parts[0::2], parts[1::2] + [""])]


def _split_en(text: str) -> list[str]:
    sentences, start = [], 0
    for match in _EN_BOUNDARY.finditer(text):
        end = match.end(1)
        if _is_abbreviation(text[start:end], match.group(1)):
            continue
        sentences.append(text[start:end])
        start = match.end()
    sentences.append(text[start:])
    return sentences


def _is_abbreviation(sentence: str, terminator: str) -> bool:
    """A single period after a known abbreviation, a dotted acronym or a single capital (an initial)."""
    if terminator.rstrip(_CLOSERS) != ".":
        return False
    head = sentence[: len(sentence) - len(terminator)]
    word = head.rsplit(None, 1)[-1] if head.strip() else ""
    if word.lstrip("(\"'") in _ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isupper():
        return True
    return bool(_DOTTED.search(head + "."))


def cap_length(sentence: str, max_chars: int) -> list[str]:
    """Split a sentence longer than `max_chars` into pieces, at the last space before the limit when there is
    one (else hard), so one runaway line (a 10 MB log dump) cannot stall the tokenizer."""
    if len(sentence) <= max_chars:
        return [sentence]
    pieces, start = [], 0
    while len(sentence) - start > max_chars:
        cut = sentence.rfind(" ", start + max_chars // 2, start + max_chars)
        cut = cut if cut > 0 else start + max_chars
        pieces.append(sentence[start:cut].strip())
        start = cut
    pieces.append(sentence[start:].strip())
    return [p for p in pieces if p]
