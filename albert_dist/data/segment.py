"""Word starts for whole-word masking, with Chinese words from jieba.

For Latin text the tokenizer knows where words start (`▁` in SentencePiece, no `##` in WordPiece). Chinese has
no spaces: without a segmenter every CJK character counts as a word. With `data.word_segmenter: jieba` the
sentence is segmented and a token that begins with a CJK character starts a word only where a jieba word starts
(a token right after a CJK character: only where a jieba word ends). Between two non-CJK tokens the tokenizer's
own rule stays, so English words inside Chinese text remain words. Only the flags change: the ids fed to the
model stay the plain characters (never BERT-Chinese's `##字` ids, brightmart's bug).

Tokens are aligned with jieba's words through the CJK characters, which both tokenizers' normalisation leaves
as they are: the k-th CJK character in the tokens is the k-th of the sentence. When the counts disagree (a CJK
character the vocabulary maps to [UNK]) the sentence falls back to one word per character, counted.
"""

from __future__ import annotations

import io
import logging
import re
from collections import Counter

import numpy as np

CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff]")
_CONTINUATION_MARKS = {"sentencepiece": "\u2581", "wordpiece": "#"}


class JiebaSegmenter:
    """A private jieba dictionary (plus the user dictionary's words); build it once per process (about a
    second), e.g. in a Ray Data actor's constructor."""

    def __init__(self, user_dict: str | None = None):
        import jieba

        jieba.setLogLevel(logging.WARNING)
        self._jieba = jieba.Tokenizer()
        self._jieba.initialize()
        if user_dict:
            self._jieba.load_userdict(io.BytesIO(user_dict.encode("utf-8")))

    def words(self, text: str) -> list[str]:
        return self._jieba.lcut(text)

    def cjk_boundaries(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """For each CJK character of `text`, in order: (a jieba word starts at it, a jieba word ends after it)."""
        boundary = np.zeros(len(text) + 1, bool)
        for _, start, end in self._jieba.tokenize(text):
            boundary[start] = boundary[end] = True
        positions = np.array([m.start() for m in CJK.finditer(text)], np.int64)
        return boundary[positions], boundary[positions + 1]


def word_starts(
    tokenizer, pieces: list[str], ids: list[int], sentence: str, segmenter: JiebaSegmenter | None, counts: Counter
) -> np.ndarray:
    """Whole-word flags of a sentence's tokens: the tokenizer's, with CJK words as the module docstring says."""
    starts = np.array(tokenizer.word_starts(ids), bool)
    if not any(CJK.search(p) for p in pieces):
        return starts
    cjk_total = sum(len(CJK.findall(p)) for p in pieces)
    if segmenter is not None:
        begins, ends = segmenter.cjk_boundaries(sentence)
        if len(begins) != cjk_total:
            counts["segmentation_fallbacks"] += 1
            segmenter = None
    if segmenter is None:  # every CJK character a word
        begins = ends = np.ones(cjk_total, bool)
    mark = _CONTINUATION_MARKS[tokenizer.kind]
    k, previous_cjk = 0, False
    for i, piece in enumerate(pieces):
        core = piece.lstrip(mark)
        if not core:
            previous_cjk = False
            continue
        if CJK.match(core[0]):
            starts[i] = begins[k]
        elif previous_cjk:
            starts[i] = ends[k - 1]
        k += len(CJK.findall(core))
        previous_cjk = bool(CJK.match(core[-1]))
    return starts
