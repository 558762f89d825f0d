"""Token classification's pieces without Ray: entities read as seqeval reads them, the readers and their errors,
alignment of tags to pieces, and windows that put a long sentence back together."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ner_helpers import sentences, write_cluener, write_conll, write_vocab_corpus
from seqeval.metrics import classification_report, f1_score
from seqeval.scheme import IOB2, IOBES

from albert_dist.data import batching
from albert_dist.errors import DataError
from albert_dist.finetune import entities, token_data, token_task
from albert_dist.finetune.config import FinetuneJobConfig
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.training import train_wordpiece

DATA = SimpleNamespace(format="auto", tokens_column="tokens", tags_column="tags")


def random_tags(rng: random.Random, n: int, scheme: str) -> list[str]:
    prefixes = "BI" if scheme == "BIO" else "BIES"
    return [rng.choice(["O"] + [f"{p}-{t}" for p in prefixes for t in ("PER", "LOC")]) for _ in range(n)]


@pytest.mark.parametrize("scheme, reference", [("BIO", IOB2), ("BIOES", IOBES)])
def test_entity_f1_equals_seqeval_strict_on_random_tags(scheme, reference):
    """Random (mostly ill-formed) tag sequences: our F1, overall and per type, is seqeval's in strict mode."""
    rng = random.Random(7)
    gold = [random_tags(rng, rng.randint(1, 12), scheme) for _ in range(300)]
    predicted = [[tag if rng.random() < 0.7 else random_tags(rng, 1, scheme)[0] for tag in s] for s in gold]
    ours = entities.entity_metrics(gold, predicted, scheme)
    theirs = classification_report(gold, predicted, mode="strict", scheme=reference, output_dict=True, zero_division=0)
    assert ours["f1"] == pytest.approx(f1_score(gold, predicted, mode="strict", scheme=reference))
    assert ours["precision"] == pytest.approx(theirs["micro avg"]["precision"])
    assert ours["recall"] == pytest.approx(theirs["micro avg"]["recall"])
    for kind in ("PER", "LOC"):
        assert ours[f"{kind}_f1"] == pytest.approx(theirs[kind]["f1-score"])


def test_spans_to_tags_and_back():
    spans = [("PER", 0, 1), ("LOC", 3, 3), ("ORG", 5, 8)]
    for scheme in ("BIO", "BIOES"):
        tags = entities.tags_from_spans(10, spans, scheme)
        assert entities.scheme_of(tags) == scheme
        assert sorted(entities.entities(tags, scheme)) == sorted(spans)
    with pytest.raises(ValueError, match="overlaps"):
        entities.tags_from_spans(5, [("PER", 0, 2), ("LOC", 2, 3)])


def test_conll_cluener_and_columns_read_the_same_sentences(tmp_path):
    rows = sentences(20, seed=3)
    conll = token_data.read_tagged(str(write_conll(tmp_path / "a.conll", rows)), DATA)
    cluener = token_data.read_tagged(str(write_cluener(tmp_path / "a.json", rows)), DATA)
    pq.write_table(pa.table({"tokens": conll.words, "tags": conll.tags}), tmp_path / "a.parquet")
    columns = token_data.read_tagged(str(tmp_path / "a.parquet"), DATA)
    assert conll.words == cluener.words == columns.words == [list(text) for text, _ in rows]
    assert conll.tags == cluener.tags == columns.tags
    assert conll.lines[:2] == [1, len(rows[0][0]) + 2]  # where each sentence starts, for errors


def test_bmes_reads_as_bioes(tmp_path):
    path = tmp_path / "resume.char.bmes"
    path.write_text("张 B-NAME\n伟 M-NAME\n明 E-NAME\n在 O\n京 S-LOC\n\n", encoding="utf-8")
    split = token_data.read_tagged(str(path), DATA)
    assert split.tags == [["B-NAME", "I-NAME", "E-NAME", "O", "S-LOC"]]
    assert entities.entities(split.tags[0], entities.scheme_of(split.tags[0])) == [("NAME", 0, 2), ("LOC", 4, 4)]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.conll", "北\tB-LOC\n京\tX-LOC\n", r"bad.conll, line 2: tag 'X-LOC' is neither O"),
        (
            "bad.json",
            '{"text": "去北京", "label": {"LOC": {"北京": [[1, 3]]}}}\n',
            r"line 1: LOC '北京' at \[1, 3\] is outside",
        ),
        ("bad2.json", '{"text": "去北京", "label": {"LOC": {"上海": [[1, 2]]}}}\n', r"reads '北京', not '上海'"),
        ("bad3.json", '{"text": "去北京"}\n{"label": {}}\n', r"bad3.json, line 1: no 'label' object"),
    ],
)
def test_bad_tagged_input_names_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        token_data.read_tagged(str(path), DATA)


def test_tokens_and_tags_of_different_lengths_name_the_row(tmp_path):
    pq.write_table(pa.table({"tokens": [["a", "b"], ["c"]], "tags": [["O", "O"], ["O", "O"]]}), tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"t.parquet, row 2: 1 tokens but 2 tags"):
        token_data.read_tagged(str(tmp_path / "t.parquet"), DATA)


def test_a_dev_tag_missing_from_train_is_named(tmp_path):
    train = token_data.read_tagged(str(write_conll(tmp_path / "train.conll", [("去北京", [("LOC", 1, 2)])])), DATA)
    dev = token_data.read_tagged(str(write_conll(tmp_path / "dev.conll", [("张伟好", [("PER", 0, 1)])])), DATA)
    label2id = {tag: i for i, tag in enumerate(token_data.tag_names(train, None))}
    with pytest.raises(DataError, match=r"dev.conll, sentence at line 1: tag 'B-PER' is not in the label set"):
        token_data.tag_ids(dev, label2id)


@pytest.fixture(scope="module")
def zh_tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("ner_tok")
    train_wordpiece(write_vocab_corpus(root / "corpus.txt"), root / "tok", 200, progress=lambda _: None)
    return load_tokenizer(root / "tok")


def test_first_piece_carries_the_tag_and_unknown_characters_stay_aligned(zh_tokenizer):
    split = token_data.TaggedSplit(
        "x", [["去", "北", "京", "𪚥", "tokenization"]], [["O", "B-LOC", "I-LOC", "O", "O"]], [1]
    )
    ids = [[0, 1, 2, 0, 0]]
    encoded = token_data.encode_tagged(split, zh_tokenizer, 32, 4, ids)
    row = encoded.arrays
    pieces = zh_tokenizer.convert_ids_to_tokens(row["input_ids"][0, : row["length"][0]])
    assert pieces[:5] == ["[CLS]", "去", "北", "京", "[UNK]"]  # a character the vocabulary lacks is one [UNK]
    labels = row["label"][0, : row["length"][0]].tolist()
    assert labels[:5] == [-100, 0, 1, 2, 0] and len(pieces) > 7  # the Latin word is several pieces
    assert labels[5] == 0 and set(labels[6:]) == {-100}  # its first piece tagged, the rest out of the loss


def test_a_long_sentence_is_read_in_windows_and_put_back_word_for_word(zh_tokenizer):
    text, spans = "", []
    for sentence, sentence_spans in sentences(12, seed=5):
        spans += [(kind, first + len(text), last + len(text)) for kind, first, last in sentence_spans]
        text += sentence
    tags = entities.tags_from_spans(len(text), spans)
    names = ["O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    split = token_data.TaggedSplit("x", [list(text)], [tags], [1])
    encoded = token_data.encode_tagged(split, zh_tokenizer, 32, 8, [[names.index(t) for t in tags]])
    rows = encoded.arrays
    assert len(rows["length"]) > len(text) // 30 and rows["length"].max() == 32  # windows, none over the length
    scored = rows["word_index"][rows["word_index"] >= 0]
    assert sorted(scored.tolist()) == list(range(len(text)))  # every word scored by exactly one window
    assert token_data.words_per_sentence(encoded).tolist() == [len(text)]
    # tables filled as the training loop fills them give back the tags, hence the entities
    gold = np.zeros(len(text), np.int64)
    gold[rows["word_index"][rows["word_index"] >= 0]] = rows["label"][rows["word_index"] >= 0]
    assert [names[i] for i in gold] == tags
    perfect = token_task.score_words(gold, gold, np.array([len(text)]), names, "BIO")
    assert perfect["f1"] == 1.0 and perfect["accuracy"] == 1.0
    shifted = token_task.score_words(np.roll(gold, 1), gold, np.array([len(text)]), names, "BIO")
    assert shifted["f1"] < 0.2


def test_windows_cover_every_piece_with_the_overlap_asked():
    for n, budget, stride in [(5, 10, 2), (100, 30, 8), (31, 30, 29), (61, 30, 0)]:
        spans = batching.windows(n, budget, stride)
        covered = set().union(*(range(a, b) for a, b in spans))
        assert covered == set(range(n)) and all(b - a <= budget for a, b in spans)
        for (_, b1), (a2, _) in zip(spans, spans[1:]):
            assert b1 - a2 >= min(stride, budget)  # consecutive windows share at least the stride


def test_raw_text_words_and_offsets():
    text = "张伟在 Beijing工作, 2024年！"
    words = token_data.words_with_offsets(text)
    assert [w for w, _ in words] == ["张", "伟", "在", "Beijing", "工", "作", ",", "2024", "年", "！"]
    assert all(text[o : o + len(w)] == w for w, o in words)


def test_token_classification_config():
    base = {"model": {"init_from": "x"}, "data": {"train": "t.conll", "max_seq_length": 32}}
    cfg = FinetuneJobConfig.model_validate({**base, "finetune": {"task": "token_classification"}})
    assert cfg.finetune.best_metric == "f1" and cfg.data.window_overlap == 8
    with pytest.raises(ValueError, match="metric pearson does not apply to token_classification"):
        FinetuneJobConfig.model_validate({**base, "finetune": {"task": "token_classification", "metric": "pearson"}})
    with pytest.raises(ValueError, match="doc_stride 30 must be below"):
        FinetuneJobConfig.model_validate({**base, "data": {**base["data"], "doc_stride": 30}})
    assert json.dumps(cfg.model_dump())  # the config serializes (it is logged as YAML)


def test_per_token_distillation_leaves_untagged_positions_out():
    """The KD and CE terms over [B, T, C] logits equal those over the tagged positions alone (a sentence
    classifier's loss being the case of one position per row)."""
    import torch

    from albert_dist.finetune.distill import distillation_loss

    torch.manual_seed(0)
    student, teacher = torch.randn(3, 7, 5), torch.randn(3, 7, 5)
    labels = torch.randint(0, 5, (3, 7))
    labels[:, 0] = labels[0, 4:] = labels[2, 5:] = -100
    kept = labels != -100
    whole = distillation_loss(student, teacher, labels, 2.0, 0.3)
    tagged = distillation_loss(student[kept], teacher[kept], labels[kept], 2.0, 0.3)
    for a, b in zip(whole, tagged):
        assert a.item() == pytest.approx(b.item(), rel=1e-6)
    # and the untagged positions' logits change nothing
    noisy = student.clone()
    noisy[~kept] += 100
    assert distillation_loss(noisy, teacher, labels, 2.0, 0.3)[0].item() == pytest.approx(whole[0].item(), rel=1e-6)
