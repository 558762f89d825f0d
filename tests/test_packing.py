"""Packing for pretraining (`data.packing`): the packer's layout, attention confined to each instance, and the
same losses and gradients as the unpacked batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from albert_dist.data.masking import IGNORE_INDEX, MaskingCollator
from albert_dist.data.packing import AUTO_MAX_SLOT_SHARE, first_fit, pack_batch, packed_layout, packing_pays
from albert_dist.model import AlbertConfig, AlbertForPreTraining

PAD, CLS, SEP, MASK = 0, 2, 3, 4
CAPACITY = 64


def instances(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows as prepared data holds them: [CLS] A [SEP] B [SEP] of mixed lengths (up to CAPACITY), a SOP label."""
    rng = np.random.default_rng(seed)
    rows = {"input_ids": [], "token_type_ids": [], "word_start": [], "sop_label": rng.integers(0, 2, count)}
    for _ in range(count):
        a, b = rng.integers(1, 30), rng.integers(1, CAPACITY - 33)
        ids = np.concatenate([[CLS], rng.integers(5, 100, a), [SEP], rng.integers(5, 100, b), [SEP]])
        rows["input_ids"].append(ids)
        rows["token_type_ids"].append((np.arange(len(ids)) > a + 1).astype(np.int64))
        rows["word_start"].append(rng.random(len(ids)) < 0.7)
    return {k: np.array(v, dtype=object) if k != "sop_label" else v for k, v in rows.items()}


def masked_batch(count: int, seed: int = 0) -> dict[str, torch.Tensor]:
    collator = MaskingCollator(vocab_size=100, pad_id=PAD, mask_id=MASK, special_ids=[CLS, SEP, MASK])
    return collator(instances(count, seed), np.random.default_rng(seed))


def tiny_model() -> AlbertForPreTraining:
    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=100,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=CAPACITY,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0,
    )
    return AlbertForPreTraining(config)


def forward(model, batch):
    packed = {k: batch[k] for k in ("position_ids", "sequence_ids", "cls_positions") if k in batch}
    return model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        labels=batch["labels"],
        sentence_order_label=batch["sentence_order_label"],
        **packed,
    )


def masked_order(labels, instance, position) -> torch.Tensor:
    """The order that sorts a batch's masked tokens (as the MLM head gets them) by instance, then position."""
    masked = labels != IGNORE_INDEX
    return torch.from_numpy(np.lexsort((position[masked].numpy(), instance[masked].numpy())))


def test_first_fit_places_every_length_once_within_capacity():
    lengths = np.random.default_rng(1).integers(1, CAPACITY + 1, 300)
    rows, offsets, n_rows = first_fit(lengths, CAPACITY)
    fill = np.zeros((n_rows, CAPACITY), int)
    for row, offset, length in zip(rows, offsets, lengths):
        fill[row, offset : offset + length] += 1
    assert fill.max() == 1 and fill.sum() == lengths.sum()  # no overlap, nothing lost, nothing past CAPACITY
    assert n_rows < len(lengths) and n_rows * CAPACITY < 1.1 * lengths.sum()  # dense: under 10 % left empty
    with pytest.raises(ValueError, match="does not fit"):
        first_fit(np.array([CAPACITY + 1]), CAPACITY)


def test_packed_rows_hold_each_instance_once_with_its_own_positions_types_and_cls():
    batch = masked_batch(40)
    packed = pack_batch(batch, CAPACITY, PAD)
    lengths = batch["attention_mask"].sum(1)
    assert packed["input_ids"].shape[0] < 40 and packed["input_ids"].shape[1] <= CAPACITY
    assert int(packed["attention_mask"].sum()) == int(lengths.sum())
    flat = {k: v.flatten() for k, v in packed.items() if v.dim() == 2}
    for i, length in enumerate(lengths.tolist()):
        where = torch.nonzero(flat["sequence_ids"] == i + 1).flatten()
        assert len(where) == length and int(where[-1] - where[0]) == length - 1  # contiguous, whole
        assert int(packed["cls_positions"][i]) == int(where[0]) and int(flat["input_ids"][where[0]]) == CLS
        assert flat["position_ids"][where].tolist() == list(range(length))  # restart at 0 per instance
        for key in ("input_ids", "token_type_ids", "labels"):
            assert torch.equal(flat[key][where], batch[key][i, :length])
    padding = flat["sequence_ids"] == 0
    assert (flat["labels"][padding] == IGNORE_INDEX).all() and (flat["input_ids"][padding] == PAD).all()
    assert torch.equal(packed["sentence_order_label"], batch["sentence_order_label"])


def test_packed_losses_and_gradients_equal_the_unpacked_batch():
    batch = masked_batch(24)
    packed = pack_batch(batch, CAPACITY, PAD)
    assert packed["input_ids"].numel() < batch["input_ids"].numel()  # there was padding to save
    results = []
    for inputs in (batch, packed):
        model = tiny_model()
        out = forward(model, inputs)
        out.loss.backward()
        results.append((out, {name: p.grad for name, p in model.named_parameters()}))
    (plain, plain_grads), (dense, dense_grads) = results
    for name in ("loss", "mlm_loss", "sop_loss", "sop_logits"):
        torch.testing.assert_close(getattr(dense, name), getattr(plain, name), atol=1e-5, rtol=1e-5)
    # the masked tokens come in another order: match them by (instance, position)
    plain_order = masked_order(
        batch["labels"],
        torch.arange(1, 25)[:, None].expand_as(batch["labels"]),
        torch.arange(batch["labels"].shape[1]).expand_as(batch["labels"]),
    )
    dense_order = masked_order(packed["labels"], packed["sequence_ids"], packed["position_ids"])
    for name in ("prediction_logits", "mlm_labels"):
        torch.testing.assert_close(
            getattr(dense, name)[dense_order], getattr(plain, name)[plain_order], atol=1e-5, rtol=1e-5
        )
    for name, grad in plain_grads.items():
        torch.testing.assert_close(dense_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_an_instance_never_sees_the_others_in_its_row():
    batch = masked_batch(24)
    packed = pack_batch(batch, CAPACITY, PAD)
    shared_row = next(r for r in range(len(packed["input_ids"])) if len(set(packed["sequence_ids"][r].tolist())) > 2)
    first, second = sorted(set(packed["sequence_ids"][shared_row].tolist()) - {0})[:2]
    model = tiny_model().eval()

    def hidden(ids):
        with torch.no_grad():
            return model.albert(
                ids,
                packed["attention_mask"],
                packed["token_type_ids"],
                position_ids=packed["position_ids"],
                sequence_ids=packed["sequence_ids"],
                cls_positions=packed["cls_positions"],
            )

    changed = packed["input_ids"].clone()
    changed[packed["sequence_ids"] == first] = 7
    before, after = hidden(packed["input_ids"]), hidden(changed)
    others = packed["sequence_ids"] != first
    torch.testing.assert_close(after.last_hidden_state[others], before.last_hidden_state[others])
    assert not torch.allclose(after.last_hidden_state[~others], before.last_hidden_state[~others])
    assert not torch.allclose(after.pooler_output[first - 1], before.pooler_output[first - 1])
    torch.testing.assert_close(after.pooler_output[second - 1], before.pooler_output[second - 1])


def test_packing_pays_when_it_spares_enough_token_slots():
    """Packing pays by the token slots it spares, not the rows: ten instances of 32 tokens pack into five rows of
    64, as many slots as ten padded rows of 32 (no gain); one long instance among short ones widens every padded
    row (a gain). Ten rows, 2m of them 32 tokens (m ≤ 4) and the rest full, pack into 10 − m rows as wide: the rule
    packs exactly when that share of slots is at most AUTO_MAX_SLOT_SHARE."""

    def pays(lengths: list[int]) -> bool:
        """The rule for a padded batch of `lengths`: as wide as its longest instance, as the collator pads."""
        _, _, n_rows, width = packed_layout(np.array(lengths), CAPACITY, 8)
        return packing_pays(n_rows, width, len(lengths) * max(lengths))

    assert not pays([32] * 10) and not pays([CAPACITY] * 10)
    assert pays([CAPACITY] + [16] * 9)  # 10 rows of 64 padded, 4 packed
    decisions = set()
    for pairs in range(5):
        lengths = [CAPACITY] * (10 - 2 * pairs) + [32] * (2 * pairs)
        share = (10 - pairs) / 10  # packed rows over padded rows, both 64 wide
        assert pays(lengths) == (share <= AUTO_MAX_SLOT_SHARE), pairs
        decisions.add(share <= AUTO_MAX_SLOT_SHARE)
    assert decisions == {True, False}  # the threshold lies inside the cases tried


def test_a_batch_that_packing_would_not_pay_for_comes_back_as_it_was():
    """`only_if_it_pays`: a batch of full rows is returned itself; one of short rows is packed as without it."""
    full = {"attention_mask": torch.ones(4, CAPACITY, dtype=torch.long)}
    assert pack_batch(full, CAPACITY, PAD, only_if_it_pays=True) is full
    short = masked_batch(16)
    packed, always = pack_batch(short, CAPACITY, PAD, only_if_it_pays=True), pack_batch(short, CAPACITY, PAD)
    assert packed.keys() == always.keys() and all(torch.equal(packed[k], always[k]) for k in always)
