"""Length-grouped and length-sorted batch orders (fine-tuning, distillation, evaluation, prediction)."""

import numpy as np
import torch

from albert_dist.data import batching
from albert_dist.finetune import inference
from albert_dist.model import AlbertConfig, AlbertForSequenceClassification


def padded_tokens(lengths: np.ndarray, order: np.ndarray, batch_size: int) -> int:
    return sum(
        int(lengths[order[i : i + batch_size]].max()) * len(order[i : i + batch_size])
        for i in range(0, len(order), batch_size)
    )


def test_grouped_order_is_a_seeded_permutation_of_batches_of_similar_length():
    lengths = np.random.default_rng(0).integers(4, 128, 1000)
    order = batching.length_grouped_order(lengths, 16, np.random.default_rng([3, 0]))
    assert sorted(order.tolist()) == list(range(1000))
    # the same seed and epoch give the same order (what exact resume relies on); another epoch another order
    assert np.array_equal(order, batching.length_grouped_order(lengths, 16, np.random.default_rng([3, 0])))
    assert not np.array_equal(order, batching.length_grouped_order(lengths, 16, np.random.default_rng([3, 1])))
    random_order = np.random.default_rng(0).permutation(1000)
    assert padded_tokens(lengths, order, 16) < 0.7 * padded_tokens(lengths, random_order, 16)
    # batches are shuffled: the widths of the full batches do not simply decrease through the epoch
    widths = [lengths[order[i : i + 16]].max() for i in range(0, 992, 16)]
    assert widths != sorted(widths, reverse=True)


def test_mega_batches_keep_the_order_random_beyond_their_size():
    lengths = np.arange(2000)  # every length distinct: sorting the whole split would put 1999 first
    order = batching.length_grouped_order(lengths, 4, np.random.default_rng(1), bucket=1)  # mega-batches of 200 rows
    first = order[:4]
    assert lengths[first].max() - lengths[first].min() < 200  # one batch from one mega-batch
    batch_maxima = [lengths[order[i : i + 4]].max() for i in range(0, 2000, 4)]
    assert max(batch_maxima) == 1999 and batch_maxima.index(1999) > 0


def test_rows_of_one_padded_width_keep_their_random_order():
    """Lengths 9..16 all pad to 16: grouping cannot save padding among them, so it leaves the batches random (a
    length that tells the label apart does not make batches of one label)."""
    lengths = np.random.default_rng(0).integers(9, 17, 640)
    grouped = batching.length_grouped_order(lengths, 16, np.random.default_rng(5), bucket=8)
    plain = np.random.default_rng(5).permutation(640)
    assert set(map(tuple, np.sort(grouped.reshape(-1, 16), 1))) == set(map(tuple, np.sort(plain.reshape(-1, 16), 1)))
    assert np.ptp(lengths[grouped[:16]]) >= 5  # a batch still mixes lengths


def test_small_splits_get_at_least_four_mega_batches():
    lengths = np.arange(320)  # 20 batches of 16: mega-batches of 5 batches (transformers' rule), not one of 50
    order = batching.length_grouped_order(lengths, 16, np.random.default_rng(2), bucket=1)
    maxima = sorted(lengths[order.reshape(-1, 16)].max(1))
    assert sum(m > 300 for m in maxima) >= 4  # four mega-batches each lead with one of their longest rows


def test_sorted_prediction_restores_row_order():
    torch.manual_seed(0)
    model = AlbertForSequenceClassification(
        AlbertConfig(
            vocab_size=40,
            embedding_size=8,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
            num_labels=3,
        )
    )
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 32, 37).astype(np.int32)
    ids = np.where(np.arange(32) < lengths[:, None], rng.integers(5, 40, (37, 32)), 0).astype(np.int32)
    encoded = batching.EncodedSplit(
        {"input_ids": ids, "token_type_ids": np.zeros_like(ids, dtype=np.int8), "length": lengths}
    )
    in_row_order = inference.predict_logits(model, batching.batches(encoded, 8, 8))
    sorted_then_restored = inference.split_logits(model, encoded, batch_size=8)
    np.testing.assert_allclose(sorted_then_restored, in_row_order, rtol=1e-4, atol=1e-5)
    order = batching.length_sorted_order(lengths)
    assert list(lengths[order]) == sorted(lengths, reverse=True)
