"""Sentence-order-prediction instances, as google-research/albert's create_pretraining_data.py builds them.

Per document: a target length (`max_seq_length - 3`, or with `short_seq_prob` a random length in [2, target]);
sentences accumulate into a chunk until it reaches the target; A = the first `a_end` sentences (random in
[1, len-1]), B = the rest; with p=0.5 A and B swap (SOP label 1, transformers' convention: 0 = original order);
the pair is trimmed to fit by google's truncate_seq_pair.

One deliberate difference: google pairs a one-sentence chunk with a random sentence of another document (an
NSP-style negative that SOP does not want). Here such a sentence is cut in two at a random word boundary (at any
token boundary when it is one word) when it has at least 2 tokens, and skipped (counted) otherwise.

Randomness comes from a generator per (seed, document, copy), so the output does not depend on how Ray
partitions the corpus into blocks.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class InstanceSpec:
    max_seq_length: int
    short_seq_prob: float
    cls_id: int
    sep_id: int

    @property
    def max_tokens(self) -> int:
        """Room for A and B: [CLS] A [SEP] B [SEP]."""
        return self.max_seq_length - 3


@dataclass
class Instance:
    input_ids: np.ndarray  # int32: [CLS] A [SEP] B [SEP]
    token_type_ids: np.ndarray  # int8: 0 up to the first [SEP], 1 after
    word_start: np.ndarray  # bool: True where a whole word (or a special token) starts
    sop_label: int  # 0 = original order, 1 = swapped


def stable_hash(key: str) -> int:
    """A 64-bit hash that, unlike `hash()`, is the same in every process and every run."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def document_rng(seed: int, doc_key: str, copy: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, stable_hash(doc_key), copy])


def create_instances(
    sentences: list[np.ndarray],
    word_starts: list[np.ndarray],
    spec: InstanceSpec,
    rng: np.random.Generator,
    counts: Counter,
) -> list[Instance]:
    """Instances of one document given its tokenized sentences (and their word-start flags)."""
    target = spec.max_tokens
    if rng.random() < spec.short_seq_prob:
        target = int(rng.integers(2, spec.max_tokens + 1))
    instances, chunk, length = [], [], 0
    for i, sentence in enumerate(sentences):
        chunk.append(i)
        length += len(sentence)
        if i == len(sentences) - 1 or length >= target:
            pair = _split_chunk([sentences[j] for j in chunk], [word_starts[j] for j in chunk], rng, counts)
            if pair is not None:
                instances.append(_make_instance(*pair, spec, rng, counts))
            chunk, length = [], 0
    return instances


def _split_chunk(ids: list[np.ndarray], starts: list[np.ndarray], rng: np.random.Generator, counts: Counter):
    """(a_ids, a_starts, b_ids, b_starts), or None for a chunk that cannot make two non-empty segments."""
    if len(ids) >= 2:
        a_end = int(rng.integers(1, len(ids)))
        return (
            np.concatenate(ids[:a_end]),
            np.concatenate(starts[:a_end]),
            np.concatenate(ids[a_end:]),
            np.concatenate(starts[a_end:]),
        )
    sentence, flags = ids[0], starts[0]
    if len(sentence) < 2:
        counts["chunks_skipped_too_short"] += 1
        return None
    counts["sentences_cut_in_two"] += 1
    boundaries = np.flatnonzero(flags[1:]) + 1
    cut = int(rng.choice(boundaries)) if len(boundaries) else int(rng.integers(1, len(sentence)))
    return sentence[:cut], flags[:cut], sentence[cut:], flags[cut:]


def _make_instance(
    a: np.ndarray,
    a_starts: np.ndarray,
    b: np.ndarray,
    b_starts: np.ndarray,
    spec: InstanceSpec,
    rng: np.random.Generator,
    counts: Counter,
) -> Instance:
    swapped = rng.random() < 0.5
    if swapped:
        a, a_starts, b, b_starts = b, b_starts, a, a_starts
    keep_a, keep_b = truncated_lengths(len(a), len(b), spec.max_tokens)
    counts["tokens_truncated"] += len(a) + len(b) - keep_a - keep_b
    a_slice, b_slice = _trim(len(a), keep_a, rng), _trim(len(b), keep_b, rng)
    cls, sep = np.array([spec.cls_id], np.int32), np.array([spec.sep_id], np.int32)
    input_ids = np.concatenate([cls, a[a_slice], sep, b[b_slice], sep]).astype(np.int32)
    token_type_ids = np.zeros(len(input_ids), np.int8)
    token_type_ids[keep_a + 2 :] = 1
    true = np.ones(1, bool)
    word_start = np.concatenate([true, a_starts[a_slice], true, b_starts[b_slice], true])
    return Instance(input_ids, token_type_ids, word_start, int(swapped))


def truncated_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """The lengths google's truncate_seq_pair leaves: it removes one token at a time from the longer segment
    (from B when they are equal) until the pair fits."""
    excess = len_a + len_b - budget
    if excess <= 0:
        return len_a, len_b
    gap = min(abs(len_a - len_b), excess)
    if len_a > len_b:
        len_a -= gap
    else:
        len_b -= gap
    excess -= gap
    return len_a - excess // 2, len_b - (excess + 1) // 2


def _trim(length: int, keep: int, rng: np.random.Generator) -> slice:
    """google drops each surplus token from the front or the back with p=0.5: a binomial front count."""
    front = int(rng.binomial(length - keep, 0.5)) if keep < length else 0
    return slice(front, front + keep)
