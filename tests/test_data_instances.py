"""SOP instance creation (google's algorithm), on token ids that encode their sentence index."""

from collections import Counter

import numpy as np
import pytest

from albert_dist.data.instances import InstanceSpec, create_instances, document_rng, truncated_lengths

CLS, SEP = 2, 3
SPEC = InstanceSpec(max_seq_length=64, short_seq_prob=0.1, cls_id=CLS, sep_id=SEP)


def document(rng, n_sentences):
    """Sentence i is made of the token 100 + i, so order is visible in the output."""
    sentences = [np.full(int(rng.integers(1, 40)), 100 + i, np.int32) for i in range(n_sentences)]
    starts = [rng.random(len(s)) < 0.6 for s in sentences]
    return sentences, starts


def corpus_instances(n_docs=400, seed=0):
    rng = np.random.default_rng(123)
    counts, out = Counter(), []
    for d in range(n_docs):
        sentences, starts = document(rng, int(rng.integers(1, 30)))
        out += create_instances(sentences, starts, SPEC, document_rng(seed, f"doc{d}"), counts)
    return out, counts


def segments(inst):
    ids = inst.input_ids
    seps = np.flatnonzero(ids == SEP)
    assert ids[0] == CLS and len(seps) == 2 and seps[1] == len(ids) - 1
    return ids[1 : seps[0]], ids[seps[0] + 1 : -1]


def test_layout_lengths_and_segments():
    instances, _ = corpus_instances()
    assert len(instances) > 500
    for inst in instances:
        a, b = segments(inst)
        assert len(a) >= 1 and len(b) >= 1
        assert len(inst.input_ids) <= SPEC.max_seq_length
        assert inst.input_ids.dtype == np.int32 and inst.token_type_ids.dtype == np.int8
        assert inst.token_type_ids.tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert inst.word_start[[0, len(a) + 1, -1]].all()  # specials count as word starts


def test_sentence_order_kept_unless_swapped():
    instances, _ = corpus_instances()
    for inst in instances:
        a, b = segments(inst)
        if inst.sop_label == 0:
            assert np.all(np.diff(np.concatenate([a, b])) >= 0), "label 0 must keep the document order"
        else:
            assert a.min() >= b.max(), "label 1 puts the later segment first"


def test_sop_labels_balanced():
    instances, _ = corpus_instances(n_docs=1500)
    share = np.mean([i.sop_label for i in instances])
    assert abs(share - 0.5) < 0.03, share


def test_deterministic_per_document():
    first, _ = corpus_instances(seed=7)
    again, _ = corpus_instances(seed=7)
    other, _ = corpus_instances(seed=8)
    assert all(np.array_equal(x.input_ids, y.input_ids) and x.sop_label == y.sop_label for x, y in zip(first, again))
    assert any(not np.array_equal(x.input_ids, y.input_ids) for x, y in zip(first, other))


def test_one_sentence_chunk_is_cut_inside_the_sentence_or_skipped():
    counts = Counter()
    sentence = np.arange(200, 210, dtype=np.int32)
    starts = np.array([1, 0, 0, 1, 0, 1, 0, 0, 0, 1], bool)
    (inst,) = create_instances([sentence], [starts], SPEC, document_rng(0, "one"), counts)
    a, b = segments(inst)
    joined = np.concatenate([a, b]) if inst.sop_label == 0 else np.concatenate([b, a])
    assert joined.tolist() == sentence.tolist()
    cut = len(a) if inst.sop_label == 0 else len(b)
    assert starts[cut], "cut at a word boundary"
    assert counts["sentences_cut_in_two"] == 1
    assert create_instances([np.array([300], np.int32)], [np.ones(1, bool)], SPEC, document_rng(0, "x"), counts) == []
    assert counts["chunks_skipped_too_short"] == 1


def test_long_sentences_are_truncated_to_fit():
    counts = Counter()
    sentences = [np.full(500, 100, np.int32), np.full(300, 101, np.int32)]
    instances = create_instances(
        sentences, [np.ones(500, bool), np.ones(300, bool)], SPEC, document_rng(0, "long"), counts
    )
    assert all(len(i.input_ids) == SPEC.max_seq_length for i in instances)
    assert counts["tokens_truncated"] > 0


@pytest.mark.parametrize(
    "len_a, len_b, budget", [(5, 5, 7), (10, 2, 5), (2, 10, 5), (3, 4, 100), (1, 1, 1 + 1), (9, 8, 6), (1, 500, 5)]
)
def test_truncated_lengths_match_googles_loop(len_a, len_b, budget):
    a, b = len_a, len_b
    while a + b > budget:  # google's truncate_seq_pair, one token at a time
        if a > b:
            a -= 1
        else:
            b -= 1
    assert truncated_lengths(len_a, len_b, budget) == (a, b)
