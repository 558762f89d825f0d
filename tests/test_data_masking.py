"""Dynamic (and static) masking: rates, 80/10/10, never specials, whole words, determinism, padding."""

import numpy as np
import pytest
import torch
from test_data_support import english_tokenizer, instance_batch  # noqa: F401 - fixture

from albert_dist.data.config import PrepareMaskingSection
from albert_dist.data.masking import IGNORE_INDEX, MaskingCollator, batch_rng, pad_ragged


@pytest.fixture(scope="module")
def batch(english_tokenizer, stdlib_corpus):
    docs = stdlib_corpus.read_text(encoding="utf-8").split("\n\n")[:600]
    return instance_batch(english_tokenizer, docs)


def collator(tokenizer, **overrides):
    return MaskingCollator.from_tokenizer(tokenizer, PrepareMaskingSection(**overrides))


def originals(batch, width):
    return pad_ragged(batch["input_ids"], 0, width)[0]


def test_rate_and_80_10_10(english_tokenizer, batch):
    col = collator(english_tokenizer, max_predictions_per_seq=128)
    out = col(batch, batch_rng(0, 0, 0, 0))
    ids = originals(batch, out["input_ids"].shape[1])
    labels, masked_ids = out["labels"].numpy(), out["input_ids"].numpy()
    candidates = (out["attention_mask"].numpy() == 1) & ~np.isin(ids, list(english_tokenizer.special_ids))
    chosen = labels != IGNORE_INDEX
    assert candidates.sum() > 30_000
    assert abs(chosen.sum() / candidates.sum() - 0.15) < 0.01
    assert np.array_equal(labels[chosen], ids[chosen])
    as_mask = (masked_ids[chosen] == english_tokenizer.mask_id).mean()
    unchanged = (masked_ids[chosen] == ids[chosen]).mean()
    assert abs(as_mask - 0.8) < 0.02 and abs(unchanged - 0.1) < 0.02 and abs(1 - as_mask - unchanged - 0.1) < 0.02
    assert not np.isin(
        masked_ids[chosen & (masked_ids != english_tokenizer.mask_id)], list(english_tokenizer.special_ids)
    ).any(), "random replacements are never special"


def test_never_masks_special_tokens_or_padding(english_tokenizer, batch):
    out = collator(english_tokenizer)(batch, batch_rng(1, 0, 0, 0))
    ids = originals(batch, out["input_ids"].shape[1])
    chosen = out["labels"].numpy() != IGNORE_INDEX
    assert not np.isin(ids[chosen], list(english_tokenizer.special_ids)).any()
    assert not (chosen & (out["attention_mask"].numpy() == 0)).any()
    padding = out["attention_mask"].numpy() == 0
    assert (out["input_ids"].numpy()[padding] == english_tokenizer.pad_id).all()


def test_whole_words_are_masked_together(english_tokenizer, batch):
    out = collator(english_tokenizer, max_predictions_per_seq=128)(batch, batch_rng(2, 0, 0, 0))
    width = out["input_ids"].shape[1]
    starts = pad_ragged(batch["word_start"], 1, width, bool)[0]
    ids = originals(batch, width)
    starts[:, 1:] |= np.isin(ids[:, :-1], list(english_tokenizer.special_ids))  # a segment starts a word
    chosen = out["labels"].numpy() != IGNORE_INDEX
    word = np.cumsum(starts, axis=1)
    for row in range(len(chosen)):
        for w in np.unique(word[row][chosen[row]]):
            assert chosen[row][word[row] == w].all(), "a word is masked entirely or not at all"


def test_max_predictions_caps_each_sequence(english_tokenizer, batch):
    out = collator(english_tokenizer, max_predictions_per_seq=5)(batch, batch_rng(3, 0, 0, 0))
    per_row = (out["labels"].numpy() != IGNORE_INDEX).sum(axis=1)
    long_rows = np.array([len(x) for x in batch["input_ids"]]) >= 80  # 15% of them exceeds the cap
    assert per_row.max() <= 5
    assert per_row[long_rows].mean() > 4.6, "spans that overflow the cap are skipped, smaller ones still fill it"


def test_same_seed_same_masks_other_epoch_other_masks(english_tokenizer, batch):
    col = collator(english_tokenizer)
    first, again = col(batch, batch_rng(5, 0, 1, 7)), col(batch, batch_rng(5, 0, 1, 7))
    other_epoch = col(batch, batch_rng(5, 1, 1, 7))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["labels"], other_epoch["labels"])


def test_pads_to_longest_rounded_to_multiple(english_tokenizer, batch):
    small = {k: v[:8] for k, v in batch.items()}
    longest = max(len(x) for x in small["input_ids"])
    out = collator(english_tokenizer, pad_to_multiple_of=8)(small, batch_rng(0, 0, 0, 0))
    assert out["input_ids"].shape == (8, -(-longest // 8) * 8)
    assert set(out) == {"input_ids", "attention_mask", "token_type_ids", "labels", "sentence_order_label"}
    assert all(t.dtype == torch.long for t in out.values())
    assert out["attention_mask"].sum(1).tolist() == [len(x) for x in small["input_ids"]]
    assert out["sentence_order_label"].tolist() == small["sop_label"].tolist()


def test_static_masks_round_trip_through_the_collator(english_tokenizer, stdlib_corpus):
    col = collator(english_tokenizer, static=True)
    docs = stdlib_corpus.read_text(encoding="utf-8").split("\n\n")[:50]
    batch = instance_batch(english_tokenizer, docs, collator=col)
    out = col(batch, batch_rng(0, 0, 0, 0))
    for row, (masked, positions, ids) in enumerate(
        zip(batch["masked_input_ids"], batch["masked_lm_positions"], batch["masked_lm_ids"])
    ):
        assert len(positions) >= 1
        assert out["input_ids"][row, : len(masked)].tolist() == masked.tolist()
        labels = out["labels"][row].numpy()
        assert labels[positions].tolist() == ids.tolist()
        assert (labels != IGNORE_INDEX).sum() == len(positions)
        assert batch["input_ids"][row][positions].tolist() == ids.tolist()


def test_mask_all_shows_mask_at_every_chosen_position_dynamic_or_static(english_tokenizer, stdlib_corpus):
    """Held-out evaluation's masks: the positions the 80/10/10 masks choose, each shown as [MASK] (none random or
    kept, which a model could copy), also from static masks written 80/10/10; the rest of the input unchanged."""
    docs = stdlib_corpus.read_text(encoding="utf-8").split("\n\n")[:50]
    static = collator(english_tokenizer, static=True)
    for batch in (instance_batch(english_tokenizer, docs), instance_batch(english_tokenizer, docs, collator=static)):
        drawn = collator(english_tokenizer)(batch, batch_rng(3, 0, 0, 0))
        every = collator(english_tokenizer)
        every.mask_all = True
        shown = every(batch, batch_rng(3, 0, 0, 0))
        assert torch.equal(shown["labels"], drawn["labels"])
        chosen = shown["labels"].numpy() != IGNORE_INDEX
        ids, drawn_ids = shown["input_ids"].numpy(), drawn["input_ids"].numpy()
        assert chosen.sum() > 100 and (ids[chosen] == english_tokenizer.mask_id).all()
        assert (drawn_ids[chosen] != english_tokenizer.mask_id).mean() > 0.1  # what 80/10/10 left visible
        assert np.array_equal(ids[~chosen], originals(batch, ids.shape[1])[~chosen])
