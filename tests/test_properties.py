"""Property-based tests: whatever a user feeds the input layers (config text, --set strings, corpus bytes, labelled
files, unicode text, ragged id batches), the answer is a valid result or one of our clear errors, never a crash."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from albert_dist.config import load_config
from albert_dist.data.masking import IGNORE_INDEX, MaskingCollator, batch_rng
from albert_dist.data.process import document_sentences
from albert_dist.data.readers import parse_file
from albert_dist.errors import ConfigError, DataError
from albert_dist.pretrain.config import PretrainJobConfig

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Text that looks like YAML, config keys and corpora often enough to get past the first parser.
YAML_PIECES = st.sampled_from(
    [
        "run:",
        "model:",
        "train:",
        "data:",
        "  name: x",
        "  max_steps: 5",
        "  preset: base",
        "  hidden_size: -1",
        "  inputs: [a, b]",
        "- 1",
        "{",
        "}",
        "[",
        ":",
        "\t",
        "'",
        '"',
        "&a",
        "*a",
        "!!python/object:os.system",
        "~",
        "null",
        "1e-4",
        "\n",
        " ",
        "#",
    ]
)
yaml_text = st.one_of(st.text(), st.lists(YAML_PIECES, max_size=12).map("\n".join))
OVERRIDE_KEYS = st.sampled_from(
    [
        "run.name",
        "train.max_steps",
        "train",
        "model.preset",
        "model.allow_pickle",
        "scaling.num_workers",
        "a.b.c",
        "",
        ".",
        "run.",
    ]
)
override = st.one_of(
    st.text(max_size=30),
    st.tuples(OVERRIDE_KEYS, st.sampled_from(["=", "", "=="]), st.one_of(st.text(max_size=12), YAML_PIECES)).map(
        "".join
    ),
)


@FAST
@given(text=st.one_of(yaml_text, st.binary(max_size=200)), overrides=st.lists(override, max_size=3))
def test_config_loader_gives_a_config_or_a_config_error(tmp_path, text, overrides):
    path = tmp_path / "job.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    try:
        cfg = load_config(PretrainJobConfig, path, overrides)
    except ConfigError:
        return
    assert isinstance(cfg, PretrainJobConfig) and cfg.train.warmup_steps <= cfg.train.max_steps


CORPUS_PIECES = st.sampled_from(
    [
        "Dr. Smith",
        " went home.",
        " 他说：“好。”",
        "\n",
        "\n\n",
        "\r\n",
        "\t",
        "!",
        "?",
        '{"text": "a. b."}',
        '{"text": 3}',
        "{",
        "\x00",
        "\ufeff",
        "…",
        "e.g.",
        " " * 5,
    ]
)
corpus_bytes = st.one_of(
    st.binary(max_size=300), st.lists(CORPUS_PIECES, max_size=20).map(lambda parts: "".join(parts).encode("utf-8"))
)


@FAST
@given(
    data=corpus_bytes,
    name=st.sampled_from(["c.txt", "c.jsonl", "c.parquet", "c.txt.gz"]),
    fmt=st.sampled_from(["auto", "sentences", "lines", "blocks", "jsonl"]),
    max_chars=st.integers(16, 64),
)
def test_corpus_reader_and_sentence_splitter_give_documents_or_a_data_error(data, name, fmt, max_chars):
    try:
        documents, counts = parse_file(name, data, fmt, "text")
    except DataError:
        return
    assert counts["files"] == 1
    for document in documents:
        assert document["text"].strip()
        sentences = document_sentences(document["text"], document["presplit"], "auto", max_chars, Counter())
        assert all(s.strip() and len(s) <= max_chars for s in sentences)


# ------------------------------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """A small SentencePiece model and a small WordPiece vocabulary: the two kinds the wrapper loads."""
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
    from albert_dist.tokenizer.training import train_sentencepiece

    root = tmp_path_factory.mktemp("prop-tok")
    corpus = root / "corpus.txt"
    corpus.write_text(
        "\n".join(
            f"The {w} of {v} is {n} times larger, said Dr. Lee. 他们说{c}。"
            for n, (w, v, c) in enumerate(
                zip(
                    ["cat", "dog", "house", "river"] * 30, ["town", "sea", "tree", "road"] * 30, "天地人和山水日月" * 15
                )
            )
        )
    )
    spm_dir = root / "spm"
    train_sentencepiece([corpus], spm_dir, 60, progress=lambda _: None)
    wp_dir = root / "wp"
    wp_dir.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "dog", ".", ",", "天", "地"]
    (wp_dir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return [load_tokenizer(spm_dir), load_tokenizer(wp_dir)]


@FAST
@given(
    a=st.text(max_size=80),
    b=st.one_of(st.none(), st.text(max_size=80)),
    max_length=st.integers(3, 40),
    which=st.integers(0, 1),
)
def test_tokenizer_ids_are_in_range_and_pairs_fit_max_length(tokenizers, a, b, max_length, which):
    tokenizer = tokenizers[which]
    ids = tokenizer.encode(a)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    encoded = tokenizer.encode_pair(a, b, max_length=max_length)
    input_ids, types = encoded["input_ids"], encoded["token_type_ids"]
    assert len(input_ids) <= max_length and len(types) == len(input_ids) == len(encoded["attention_mask"])
    assert input_ids[0] == tokenizer.cls_id and input_ids[-1] == tokenizer.sep_id
    assert input_ids.count(tokenizer.sep_id) == (1 if b is None else 2)  # literal "[SEP]" text is plain text
    assert all(0 <= i < tokenizer.vocab_size for i in input_ids)


# ---------------------------------------------------------------------------------------------- masking

VOCAB, PAD, MASK, SPECIALS = 40, 0, 4, [0, 2, 3, 4]


def ragged(arrays: list[np.ndarray]) -> np.ndarray:
    """A list column as Ray Data yields it: an object array of 1-D arrays."""
    column = np.empty(len(arrays), object)
    for i, array in enumerate(arrays):
        column[i] = array
    return column


@FAST
@given(
    rows=st.lists(st.lists(st.integers(0, VOCAB - 1), max_size=50), min_size=1, max_size=6),
    whole_word=st.booleans(),
    multiple=st.sampled_from([1, 8]),
    seed=st.integers(0, 2**16),
)
def test_masking_collator_labels_only_real_tokens_and_pads_to_a_multiple(rows, whole_word, multiple, seed):
    collator = MaskingCollator(
        vocab_size=VOCAB,
        pad_id=PAD,
        mask_id=MASK,
        special_ids=SPECIALS,
        whole_word=whole_word,
        pad_to_multiple_of=multiple,
    )
    rng = np.random.default_rng(seed)
    batch = {
        "input_ids": ragged([np.array(r, np.int32) for r in rows]),
        "token_type_ids": ragged([np.zeros(len(r), np.int32) for r in rows]),
        "word_start": ragged([rng.random(len(r)) < 0.5 for r in rows]),
        "sop_label": np.zeros(len(rows), np.int64),
    }
    out = collator(batch, batch_rng(seed, 0, 0, 0))
    width = max(max(len(r) for r in rows), 1)
    assert (
        out["input_ids"].shape
        == out["labels"].shape
        == out["attention_mask"].shape
        == (len(rows), out["labels"].shape[1])
    )
    assert out["labels"].shape[1] % multiple == 0 and width <= out["labels"].shape[1] < width + multiple
    for row, ids in enumerate(rows):
        labels = out["labels"][row].numpy()
        assert (out["attention_mask"][row].numpy() == (np.arange(labels.size) < len(ids))).all()
        predicted = np.flatnonzero(labels != IGNORE_INDEX)
        assert all(p < len(ids) and ids[p] not in SPECIALS and labels[p] == ids[p] for p in predicted)
        assert (out["input_ids"][row, len(ids) :] == PAD).all()


# ----------------------------------------------------------------------------------------- fine-tuning data

CELLS = st.one_of(st.text(max_size=10), st.integers(-3, 3).map(str), st.sampled_from(["", '"', ",", "\t", "\n"]))


def labelled_file(kind: str, header: list[str], rows: list[list[str]]) -> str:
    if kind == "jsonl":
        return "".join(json.dumps(dict(zip(header, r))) + "\n" for r in rows)
    sep = "\t" if kind == "tsv" else ","
    return "\n".join(sep.join(line) for line in [header, *rows])


finetune_files = st.one_of(
    st.tuples(st.sampled_from(["csv", "tsv", "jsonl"]), st.text(max_size=200)),
    st.tuples(
        st.sampled_from(["csv", "tsv", "jsonl"]),
        st.builds(
            lambda kind, header, rows: labelled_file(kind, header, rows),
            st.shared(st.sampled_from(["csv", "tsv", "jsonl"]), key="kind"),
            st.lists(st.sampled_from(["text", "label", "other", ""]), min_size=1, max_size=3),
            st.lists(st.lists(CELLS, min_size=1, max_size=3), max_size=12),
        ),
    ),
)


@FAST
@given(file=finetune_files, task=st.sampled_from(["classification", "regression"]))
def test_finetune_reader_gives_rows_or_a_data_error(tmp_path, file, task):
    from albert_dist.finetune.config import TaskDataSection
    from albert_dist.finetune.data import label_ids, label_names, load_splits

    kind, content = file
    path = tmp_path / f"train.{kind}"
    path.write_text(content, encoding="utf-8", errors="surrogatepass")
    try:
        splits = load_splits(TaskDataSection(train=str(path)))
        names = label_names(splits["train"], None) if task == "classification" else None
        ids = {
            name: label_ids(split, "label", task, {n: i for i, n in enumerate(names or [])})
            for name, split in splits.items()
        }
    except (DataError, ConfigError):
        return
    assert sum(len(split.texts) for split in splits.values()) >= 2
    for name, split in splits.items():
        assert len(ids[name]) == len(split.texts) == len(split.labels)
        assert all(isinstance(t, str) for t in split.texts)
