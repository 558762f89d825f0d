"""Chinese whole-word masking with real jieba output, for WordPiece (BERT-Chinese) and SentencePiece vocabularies."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from chinese_helpers import ZH_SENTENCES

from albert_dist.data.instances import InstanceSpec
from albert_dist.data.masking import IGNORE_INDEX, MaskingCollator, batch_rng
from albert_dist.data.process import DocumentProcessor, ProcessSettings
from albert_dist.data.segment import CJK, JiebaSegmenter, word_starts
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.backends import albert_preprocess
from albert_dist.tokenizer.training import train_sentencepiece, train_wordpiece


@pytest.fixture(scope="module")
def segmenter():
    return JiebaSegmenter()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("zh-wwm") / "corpus.txt"
    path.write_text("\n".join(ZH_SENTENCES * 3) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=["wordpiece", "sentencepiece"])
def tokenizer(request, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "wordpiece":
        train_wordpiece(corpus, out, 400, progress=lambda _: None)
    else:
        train_sentencepiece(corpus, out, 190, character_coverage=1.0, progress=lambda _: None)
    return load_tokenizer(out)


def jieba_word_of_tokens(tokenizer, segmenter, sentence: str) -> list[int]:
    """For each token, the index of the jieba word its first character lies in (-1 for a bare `▁`), found by
    walking the tokens' surface characters along the sentence: independent of the code under test."""
    text = albert_preprocess(sentence) if tokenizer.kind == "sentencepiece" else sentence.lower()
    word_at = np.zeros(len(text), np.int64)
    offset = 0
    for index, word in enumerate(segmenter.words(text)):
        word_at[offset : offset + len(word)] = index
        offset += len(word)
    out, pos = [], 0
    for piece in tokenizer.tokenize(sentence):
        surface = piece.lstrip("\u2581") if tokenizer.kind == "sentencepiece" else piece.removeprefix("##")
        if not surface:
            out.append(-1)
            continue
        while text[pos] == " ":
            pos += 1
        assert text[pos : pos + len(surface)] == surface, (sentence, piece)
        out.append(int(word_at[pos]))
        pos += len(surface)
    return out


def test_masked_spans_cover_whole_jieba_words(tokenizer, segmenter):
    collator = MaskingCollator.from_tokenizer(tokenizer, _masking(max_predictions_per_seq=40))
    ids, flags, words = [], [], []
    for sentence in ZH_SENTENCES:
        pieces = tokenizer.tokenize(sentence)
        token_ids = tokenizer.convert_tokens_to_ids(pieces)
        assert tokenizer.unk_id not in token_ids
        ids.append(np.array(token_ids))
        flags.append(word_starts(tokenizer, pieces, token_ids, sentence, segmenter, Counter()))
        words.append(jieba_word_of_tokens(tokenizer, segmenter, sentence))
    multi_token_words_masked = 0
    for seed in range(30):
        masked_ids, labels = collator.mask(*_padded(ids, flags), np.random.default_rng(seed))
        for row, word_of in enumerate(words):
            is_masked = labels[row, : len(word_of)] != IGNORE_INDEX
            for word in set(word_of) - {-1}:
                members = is_masked[np.array(word_of) == word]
                assert members.all() or not members.any(), (ZH_SENTENCES[row], word, members)
                multi_token_words_masked += len(members) > 1 and members.all()
    assert multi_token_words_masked > 50


def test_jieba_words_are_the_masking_units(tokenizer, segmenter):
    """With jieba, a word of several characters is one unit; without it each CJK character is one; English words
    inside Chinese text stay words either way."""
    sentence = "他用ALBERT模型做中文文本分类"
    pieces = tokenizer.tokenize(sentence)
    ids = tokenizer.convert_tokens_to_ids(pieces)
    with_jieba = word_starts(tokenizer, pieces, ids, sentence, segmenter, Counter())
    characters = word_starts(tokenizer, pieces, ids, sentence, None, Counter())
    cjk = np.array([bool(CJK.search(p)) for p in pieces])
    assert characters[cjk].all()
    assert with_jieba.sum() < characters.sum()
    surface = [p.lstrip("\u2581#") for p in pieces]
    units = _units(surface, with_jieba)
    assert {"模型", "中文", "文本", "分类", "albert"} <= set(units)
    assert "albert" in _units(surface, characters) and "模型" not in _units(surface, characters)


def test_user_dictionary_joins_a_domain_word(segmenter):
    sentence = "阿尔伯特蒸馏法很有效"
    custom = JiebaSegmenter("阿尔伯特蒸馏法 100 n\n")
    assert "阿尔伯特蒸馏法" not in segmenter.words(sentence)
    assert custom.words(sentence)[0] == "阿尔伯特蒸馏法"
    begins, ends = custom.cjk_boundaries(sentence)
    assert begins[:7].tolist() == [True] + [False] * 6 and ends[6]


def test_ids_stay_plain_characters_with_a_bert_chinese_vocab(tmp_path, segmenter):
    """A vocabulary like bert-base-chinese's holds `##字` entries; whole-word masking must still feed and
    predict the plain characters (brightmart's bug was to label `##字`)."""
    sentence = "自然语言处理很重要"
    chars = sorted(set(sentence))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = load_tokenizer(tmp_path)
    pieces = tok.tokenize(sentence)
    ids = tok.convert_tokens_to_ids(pieces)
    flags = word_starts(tok, pieces, ids, sentence, segmenter, Counter())
    assert pieces == list(sentence) and not flags.all()
    collator = MaskingCollator.from_tokenizer(tok, _masking(mlm_probability=0.5))
    for seed in range(10):
        _, labels = collator.mask(*_padded([np.array(ids)], [flags]), np.random.default_rng(seed))
        predicted = labels[labels != IGNORE_INDEX]
        assert not any(t.startswith("##") for t in tok.convert_ids_to_tokens(predicted))


def test_prepared_instances_carry_jieba_word_starts_and_masks_change_per_epoch(tokenizer):
    spec = InstanceSpec(64, 0.0, tokenizer.cls_id, tokenizer.sep_id)
    documents = {
        "doc_key": np.array(["a", "b"], object),
        "presplit": np.zeros(2, bool),
        "text": np.array(["".join(ZH_SENTENCES[:6]), "".join(ZH_SENTENCES[6:])], object),
    }
    jieba_rows = DocumentProcessor(tokenizer, ProcessSettings(spec=spec, word_segmenter="jieba"))(documents)
    char_rows = DocumentProcessor(tokenizer, ProcessSettings(spec=spec))(documents)
    assert jieba_rows.column("input_ids").to_pylist() == char_rows.column("input_ids").to_pylist()
    jieba_starts = np.concatenate(jieba_rows.column("word_start").to_pylist())
    char_starts = np.concatenate(char_rows.column("word_start").to_pylist())
    assert jieba_starts.sum() < 0.8 * char_starts.sum()
    batch = {name: np.array(jieba_rows.column(name).to_pylist(), object) for name in ("input_ids", "word_start")}
    batch |= {
        "token_type_ids": np.array(jieba_rows.column("token_type_ids").to_pylist(), object),
        "sop_label": np.array(jieba_rows.column("sop_label").to_pylist()),
    }
    collator = MaskingCollator.from_tokenizer(tokenizer, _masking())
    epoch0, epoch1 = (collator(batch, batch_rng(0, epoch, 0, 0))["labels"] for epoch in (0, 1))
    assert not np.array_equal(epoch0.numpy(), epoch1.numpy())


def _units(surface: list[str], starts: np.ndarray) -> list[str]:
    units: list[str] = []
    for s, start in zip(surface, starts):
        if start or not units:
            units.append(s)
        else:
            units[-1] += s
    return units


def _padded(ids: list[np.ndarray], flags: list[np.ndarray]):
    from albert_dist.data.masking import pad_ragged

    padded, lengths = pad_ragged(ids, 0)
    starts, _ = pad_ragged(flags, 0, padded.shape[1], bool)
    return padded, lengths, starts


def _masking(**overrides):
    from albert_dist.data.config import MaskingSection

    return MaskingSection(**overrides)


def test_exported_tokenizer_loads_in_transformers_with_the_same_ids(tokenizer, tmp_path):
    """SentencePiece (spiece.model, AlbertTokenizer) and WordPiece (vocab.txt, BertTokenizer) exports alike."""
    import transformers

    tokenizer.save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for a, b in zip(ZH_SENTENCES, ZH_SENTENCES[1:]):
        assert hf(a, b)["input_ids"] == tokenizer.encode_pair(a, b)["input_ids"]
