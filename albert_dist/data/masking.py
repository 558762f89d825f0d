"""Masked-LM masking and batch collation, vectorised over the whole batch in numpy.

Whole-word n-gram masking as ALBERT: candidates are whole words (specials and padding never), spans of n = 1..
`max_ngram` words with p(n) ∝ 1/n, about `mlm_probability` of the candidate tokens per sequence (at most
`max_predictions_per_seq`), of those 80% → [MASK], 10% → a random non-special token, 10% unchanged (or, with
`mask_all`, all [MASK]: held-out evaluation, where a token left visible could simply be copied).

google picks span starts one at a time and rejects overlaps, a Python loop per sequence. Here each row's words are
cut into consecutive spans with lengths drawn from p(n); spans are taken in random order while the running token
count stays within the budget (a span is taken while its midpoint fits, so the expected count is the budget,
not below it). Span lengths and positions have the same distribution; the work is a dozen array operations per
batch instead of a loop per token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

IGNORE_INDEX = -100


def batch_rng(seed: int, epoch: int, slot: int, batch_index: int) -> np.random.Generator:
    """The generator for one micro-batch: the same (seed, epoch, slot of the global batch, global batch) always
    gives the same masks, whichever worker trains it."""
    return np.random.default_rng([seed, epoch, slot, batch_index])


def pad_ragged(column: Any, pad_value: int, width: int | None = None, dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """(padded matrix, lengths) from what Ray Data yields for a list column: an object array of 1-D arrays, or
    a 2-D array when all rows have the same length."""
    if isinstance(column, np.ndarray) and column.ndim == 2 and column.dtype != object:
        lengths = np.full(len(column), column.shape[1], np.int64)
        flat = column.reshape(-1)
    else:
        rows = [np.asarray(r) for r in column]
        lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
        flat = np.concatenate(rows) if rows else np.zeros(0, dtype)
    width = int(lengths.max(initial=0)) if width is None else width
    out = np.full((len(lengths), width), pad_value, dtype)
    starts = np.cumsum(lengths) - lengths
    row_index = np.repeat(np.arange(len(lengths)), lengths)
    col_index = np.arange(len(flat)) - np.repeat(starts, lengths)
    out[row_index, col_index] = flat
    return out, lengths


class MaskingCollator:
    """Pads a batch of instances to the longest sequence (rounded up to `pad_to_multiple_of`) and masks it.

    `collator(batch, rng)` takes a dict of numpy arrays as `Dataset.iter_batches(batch_format="numpy")` yields
    (`input_ids`, `token_type_ids`, `word_start`, `sop_label`; static masks when the data has them) and returns
    torch tensors `input_ids, attention_mask, token_type_ids, labels, sentence_order_label`.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        pad_id: int,
        mask_id: int,
        special_ids: Iterable[int],
        mlm_probability: float = 0.15,
        max_predictions_per_seq: int = 20,
        max_ngram: int = 3,
        whole_word: bool = True,
        pad_to_multiple_of: int = 8,
        mask_all: bool = False,
    ):
        self.vocab_size, self.pad_id, self.mask_id = vocab_size, pad_id, mask_id
        self.special_ids = np.array(sorted(set(special_ids) | {pad_id}), np.int64)
        self.mlm_probability = mlm_probability
        self.max_predictions = max_predictions_per_seq
        #: the most labels one sequence of a batch holds: the cap of the masks drawn here, which `from_manifest`
        #: raises to the data's own (that of static masks, and of the held-out masks drawn as the data was prepared)
        self.most_predictions = max_predictions_per_seq
        self.whole_word = whole_word
        self.pad_to_multiple_of = pad_to_multiple_of
        self.mask_all = mask_all
        self.ngrams = np.arange(1, max_ngram + 1)
        self.ngram_p = (1.0 / self.ngrams) / (1.0 / self.ngrams).sum()
        self.random_ids = np.setdiff1d(np.arange(vocab_size), self.special_ids)

    @classmethod
    def from_tokenizer(cls, tokenizer, masking) -> MaskingCollator:
        """From an `AlbertTokenizer` and a `MaskingSection`."""
        return cls(
            vocab_size=tokenizer.vocab_size,
            pad_id=tokenizer.pad_id,
            mask_id=tokenizer.mask_id,
            special_ids=tokenizer.special_ids,
            **_masking_kwargs(masking),
        )

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], masking=None, mask_all: bool = False) -> MaskingCollator:
        """From a prepared dataset's manifest; `masking` (a `MaskingSection`) overrides the one it was made with."""
        tok = manifest["tokenizer"]
        settings = masking.model_dump() if masking is not None else manifest["config"]["masking"]
        collator = cls(
            vocab_size=tok["vocab_size"],
            pad_id=tok["pad_id"],
            mask_id=tok["mask_id"],
            special_ids=tok["special_ids"],
            mask_all=mask_all,
            **_masking_kwargs(settings),
        )
        data_cap = manifest["config"]["masking"]["max_predictions_per_seq"]
        collator.most_predictions = max(collator.max_predictions, data_cap)
        return collator

    # ---- masking ----

    def mask(
        self, input_ids: np.ndarray, lengths: np.ndarray, word_start: np.ndarray | None, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """(masked input ids, labels) for a padded (B, P) id matrix; labels are -100 where nothing is predicted."""
        batch, width = input_ids.shape
        positions = np.arange(width)
        candidate = (positions < lengths[:, None]) & ~np.isin(input_ids, self.special_ids)
        starts = candidate.copy()
        if self.whole_word and word_start is not None:
            after_non_candidate = np.ones_like(candidate)
            after_non_candidate[:, 1:] = ~candidate[:, :-1]
            starts &= word_start | after_non_candidate
        word = np.cumsum(starts, axis=1) - 1  # word index of each token (within its row)
        span_of_word = self._spans(batch, width, rng)
        span = np.take_along_axis(span_of_word, np.maximum(word, 0), axis=1)
        chosen_span = self._choose_spans(span, candidate, rng)
        masked = candidate & np.take_along_axis(chosen_span, span, axis=1)
        labels = np.where(masked, input_ids, IGNORE_INDEX)
        roll = rng.random((batch, width))
        out = input_ids.copy()
        out[masked & (roll < 0.8)] = self.mask_id
        randomised = masked & (roll >= 0.8) & (roll < 0.9)
        out[randomised] = self.random_ids[rng.integers(len(self.random_ids), size=int(randomised.sum()))]
        return out, labels

    def _spans(self, batch: int, width: int, rng: np.random.Generator) -> np.ndarray:
        """For each row, word index → span index, the words cut into consecutive spans of n ~ p(n) words."""
        lengths = rng.choice(self.ngrams, size=(batch, width), p=self.ngram_p)
        span_starts = np.cumsum(lengths, axis=1) - lengths
        is_start = np.zeros((batch, width), np.int32)
        rows, cols = np.nonzero(span_starts < width)
        is_start[rows, span_starts[rows, cols]] = 1
        return np.cumsum(is_start, axis=1) - 1

    def _choose_spans(self, span: np.ndarray, candidate: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """(B, P) bool by span index: spans in random order while the token count fits the row's budget."""
        batch, width = span.shape
        row = np.broadcast_to(np.arange(batch)[:, None], span.shape)
        size = np.bincount((row * width + span)[candidate], minlength=batch * width).reshape(batch, width)
        key = np.where(size > 0, rng.random((batch, width)), 2.0)
        order = np.argsort(key, axis=1)
        size_in_order = np.take_along_axis(size, order, axis=1)
        budget = self.mlm_probability * candidate.sum(axis=1, keepdims=True)
        cap = self.max_predictions
        # Pass 1: a prefix of the random order within the budget (soft: midpoint rule) and the cap (hard);
        # at least one span per sequence, as google's max(1, ...).
        total = np.cumsum(size_in_order, axis=1)
        first = np.arange(width) == 0
        wanted = ((total - size_in_order / 2 < budget) | first) & (size_in_order > 0)
        take = wanted & (total <= cap)
        # Pass 2, in rows the cap stopped: as google, a span that would overflow the cap is skipped and smaller
        # later ones are still taken.
        capped = (wanted & ~take).any(axis=1, keepdims=True)
        room = cap - (size_in_order * take).sum(axis=1, keepdims=True)
        fits = capped & ~take & (size_in_order > 0) & (size_in_order <= room)
        take |= fits & (np.cumsum(size_in_order * fits, axis=1) <= room)
        chosen = np.zeros((batch, width), bool)
        np.put_along_axis(chosen, order, take, axis=1)
        return chosen

    def static_masks(
        self, input_ids: list[np.ndarray], word_start: list[np.ndarray], rng: np.random.Generator
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(masked input ids, masked_lm_positions, masked_lm_ids) per sequence, to write with the data."""
        ids, lengths = pad_ragged(input_ids, self.pad_id)
        starts, _ = pad_ragged(word_start, 0, ids.shape[1], bool)
        masked, labels = self.mask(ids, lengths, starts, rng)
        out = []
        for row, length in enumerate(lengths):
            positions = np.flatnonzero(labels[row] != IGNORE_INDEX)
            out.append(
                (
                    masked[row, :length].astype(np.int32),
                    positions.astype(np.int32),
                    labels[row, positions].astype(np.int32),
                )
            )
        return out

    # ---- collation ----

    def pad_width(self, lengths: np.ndarray) -> int:
        longest = int(lengths.max(initial=1))
        return -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of

    def mask_rows(
        self,
        input_ids: np.ndarray,
        lengths: np.ndarray,
        word_start: np.ndarray | None,
        rngs: Sequence[np.random.Generator],
    ) -> tuple[np.ndarray, np.ndarray]:
        """As `mask`, but each row alone at its own length with its own generator: a row's mask then depends on
        nothing else in the batch (nor on its padding), so evaluation can fix it per row."""
        out, labels = input_ids.copy(), np.full_like(input_ids, IGNORE_INDEX)
        for row, (length, rng) in enumerate(zip(lengths, rngs)):
            starts = None if word_start is None else word_start[row : row + 1, :length]
            masked, row_labels = self.mask(input_ids[row : row + 1, :length], lengths[row : row + 1], starts, rng)
            out[row, :length], labels[row, :length] = masked[0], row_labels[0]
        return out, labels

    def __call__(self, batch: Mapping[str, Any], rng: np.random.Generator | Sequence[np.random.Generator]) -> dict:
        """`rng` is one generator for the batch, or one per row (see `mask_rows`)."""
        import torch

        lengths = np.fromiter((len(r) for r in batch["input_ids"]), np.int64, len(batch["input_ids"]))
        width = self.pad_width(lengths)
        input_ids, _ = pad_ragged(batch["input_ids"], self.pad_id, width)
        token_type_ids, _ = pad_ragged(batch["token_type_ids"], 0, width)
        if "masked_lm_positions" in batch:  # static masks written with the data
            masked_ids, _ = pad_ragged(batch["masked_input_ids"], self.pad_id, width)
            labels = static_labels(batch["masked_lm_positions"], batch["masked_lm_ids"], len(lengths), width)
        else:
            word_start = pad_ragged(batch["word_start"], 0, width, bool)[0] if "word_start" in batch else None
            mask = self.mask if isinstance(rng, np.random.Generator) else self.mask_rows
            masked_ids, labels = mask(input_ids, lengths, word_start, rng)
        if self.mask_all:  # after drawing: the same positions either way, and static masks written 80/10/10 too
            masked_ids = np.where(labels != IGNORE_INDEX, self.mask_id, masked_ids)
        attention_mask = (np.arange(width) < lengths[:, None]).astype(np.int64)
        return {
            "input_ids": torch.from_numpy(masked_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "labels": torch.from_numpy(labels.astype(np.int64, copy=False)),
            "sentence_order_label": torch.from_numpy(np.asarray(batch["sop_label"], np.int64)),
        }


def static_labels(positions: Any, ids: Any, batch: int, width: int) -> np.ndarray:
    """Labels (B, width) from google-style `masked_lm_positions` / `masked_lm_ids` lists."""
    pos, counts = pad_ragged(positions, 0)
    values, _ = pad_ragged(ids, 0)
    labels = np.full((batch, width), IGNORE_INDEX, np.int64)
    valid = np.arange(pos.shape[1]) < counts[:, None]
    rows = np.broadcast_to(np.arange(batch)[:, None], pos.shape)
    labels[rows[valid], pos[valid]] = values[valid]
    return labels


def _masking_kwargs(masking) -> dict:
    settings = masking if isinstance(masking, Mapping) else masking.model_dump()
    return {
        key: settings[key]
        for key in ("mlm_probability", "max_predictions_per_seq", "max_ngram", "whole_word", "pad_to_multiple_of")
    }
