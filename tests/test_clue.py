"""CLUE's own layouts: CLUEWSC2020 read as CLUE's baselines read it (the spans marked in the text, a bad span one
error naming file and row), through clue_wsc.yaml; and `albert-dist predict --clue TASK` writing each task's
submission file, read back: its name, ids in the test file's order, labels as the model predicts them
(`albert-dist predict`'s own columns on the same texts), TNEWS/IFLYTEK codes from labels.json, CLUENER's entity dict
(ends included), CMRC2018's one object of answers; a missing or bad id is one error line. Tiny random models, no Ray.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from ner_helpers import sentences
from qa_helpers import questions, write_squad, write_vocab_corpus

from albert_dist.cli import main
from albert_dist.config import load_config
from albert_dist.errors import DataError
from albert_dist.finetune import data, inference, wsc
from albert_dist.finetune.config import FinetuneJobConfig
from albert_dist.finetune.job import prepare_task_data
from albert_dist.finetune.predict import run_predict
from albert_dist.model import (
    AlbertConfig,
    AlbertForQuestionAnswering,
    AlbertForSequenceClassification,
    AlbertForTokenClassification,
)
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.training import train_wordpiece

CONFIGS = Path(__file__).resolve().parents[1] / "albert_dist" / "configs"
# CLUEWSC2020's example in CLUE's README, and CLUE's baseline's reading of it (classifier_utils.py, WSCProcessor)
WSC_TEXT = "这时候放在床上枕头旁边的手机响了，我感到奇怪，因为欠费已被停机两个月，现在它突然响了。"
WSC_TARGET = {"span2_index": 37, "span1_index": 5, "span1_text": "床", "span2_text": "它"}
WSC_MARKED = "这时候放在_床_上枕头旁边的手机响了，我感到奇怪，因为欠费已被停机两个月，现在[它]突然响了。"
TNEWS = {"100": "news_story", "101": "news_culture", "102": "news_entertainment"}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("clue_tok")
    train_wordpiece(write_vocab_corpus(root / "corpus.txt"), root / "tok", 200, progress=lambda _: None)
    return root / "tok"


def model_dir(root: Path, tokenizer_dir: Path, head: type, labels: list[str]) -> Path:
    """A randomly initialised tiny model of `head` with `labels`, saved as fine-tuning saves one."""
    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=load_tokenizer(tokenizer_dir).vocab_size,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
        initializer_range=0.5,  # large random weights: predictions that vary from text to text
    )
    model = head(config).eval()
    tokenizer = load_tokenizer(tokenizer_dir)
    if head is AlbertForSequenceClassification:
        # a random encoder's [CLS] state is much the same for every text: centred on an empty text's, the pooler
        # hands the classifier what differs, and the labels vary from text to text
        row = tokenizer.encode_pair("", None, 8)
        with torch.no_grad():
            cls = model.albert(input_ids=torch.tensor([row["input_ids"]])).last_hidden_state[0, 0]
            model.albert.pooler.bias.copy_(-model.albert.pooler.weight @ cls)
    model.save_pretrained(root)
    tokenizer.save(root)
    inference.save_reading(root, 64)
    return root


def write_lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def predict_clue(model: Path, task: str, source: Path, out: Path, *extra: str) -> int:
    return main(
        ["predict", "--model", str(model), "--input", str(source), "--output", str(out), "--clue", task, *extra]
    )


def plain_predictions(model: Path, tmp_path: Path, texts: list[str], pairs: list[str] | None = None) -> list[dict]:
    """`albert-dist predict`'s own output on the texts (and pairs): the reference a submission must agree with."""
    rows = [{"text": t, **({"pair": p} if pairs else {})} for t, p in zip(texts, pairs or texts)]
    source = write_lines(tmp_path / "plain.jsonl", rows)
    run_predict(model, source, tmp_path / "plain_out.jsonl", text_pair_column="pair" if pairs else None)
    return read_lines(tmp_path / "plain_out.jsonl")


def wsc_rows(n: int, seed: int) -> list[dict]:
    """Rows in CLUEWSC2020's layout over the NER sentences: span1 a named entity, span2 one character after it
    (even rows) or before it (odd rows, where the entity does not open the sentence)."""
    rng = random.Random(seed)
    rows = []
    for i, (text, spans) in enumerate(s for s in sentences(3 * n, seed) if s[1]):
        _, first, last = spans[0]
        at = 0 if i % 2 and first > 0 else len(text) - 1
        target = {"span1_text": text[first : last + 1], "span1_index": first, "span2_text": text[at], "span2_index": at}
        rows.append({"target": target, "idx": i, "label": rng.choice(["true", "false"]), "text": text})
    return rows[:n]


# ------------------------------------------------------------------------------------------------------- WSC


def test_wsc_marks_the_noun_and_the_pronoun_as_clues_baseline_does():
    assert wsc.marked_text(WSC_TEXT, WSC_TARGET, "x") == WSC_MARKED
    # the pronoun before the noun, and spans that touch: a closing marker before the next opening one
    before = {"span1_text": "张三", "span1_index": 2, "span2_text": "他", "span2_index": 0}
    assert wsc.marked_text("他说张三来了", before, "x") == "[他]说_张三_来了"
    touching = {"span1_text": "张三", "span1_index": 0, "span2_text": "他", "span2_index": 2}
    assert wsc.marked_text("张三他来了", touching, "x") == "_张三_[他]来了"


def test_clue_wsc_yaml_reads_cluewsc2020_rows_as_marked_texts(tokenizer_dir, tmp_path):
    """The texts marked, the labels read, and the model fed the marked texts: the markers are pieces of the
    vocabulary (its base alphabet), not [UNK]."""
    rows = wsc_rows(12, seed=3)
    train = write_lines(tmp_path / "train.json", rows)
    cfg = load_config(FinetuneJobConfig, CONFIGS / "clue_wsc.yaml", [f"data.train={train}", "data.dev="])
    split = data.read_split(str(train), cfg.data, cfg.data.label_column)
    assert split.texts == [wsc.marked_text(r["text"], r["target"], "") for r in rows]
    assert split.labels == [r["label"] for r in rows] and cfg.data.labels == ["true", "false"]
    assert all(t.count("_") == 2 and t.count("[") == 1 for t in split.texts)
    for text, row in zip(split.texts, rows):
        assert text.replace("_", "").replace("[", "").replace("]", "") == row["text"]
    cfg = load_config(
        FinetuneJobConfig, CONFIGS / "clue_wsc.yaml", [f"data.train={train}", "data.dev=", "data.dev_fraction=0.25"]
    )
    task_data = prepare_task_data(cfg.data, "classification", tokenizer_dir)
    assert task_data.label_names == ["true", "false"]
    arrays = task_data.splits["train"].arrays
    tokenizer = load_tokenizer(tokenizer_dir)
    assert tokenizer.unk_id not in tokenizer.convert_tokens_to_ids(["_", "[", "]"])
    texts = [wsc.marked_text(r["text"], r["target"], "") for r in rows]
    encoded = {tuple(arrays["input_ids"][i, : arrays["length"][i]]) for i in range(len(arrays["length"]))}
    assert encoded <= {tuple(tokenizer.build_inputs(tokenizer.encode(t))["input_ids"]) for t in texts}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"span1_text": "枕头"}, "target.span1_text is '枕头', but the text reads '床上' at span1_index 5"),
        ({"span2_index": 60}, "target.span2_text '它' at span2_index 60 runs outside the text (43 characters)"),
        ({"span1_index": None}, "target.span1_index is None, not a character offset"),
        ({"span2_text": ""}, "target.span2_text is '', not a text"),
    ],
)
def test_a_bad_wsc_span_is_one_error_naming_the_file_and_row(tmp_path, change, message):
    rows = [{"target": WSC_TARGET, "text": WSC_TEXT, "label": "false"}] * 2
    rows = [rows[0], {**rows[1], "target": {**WSC_TARGET, **change}}]
    train = write_lines(tmp_path / "train.json", rows)
    cfg = load_config(FinetuneJobConfig, CONFIGS / "clue_wsc.yaml", [f"data.train={train}", "data.dev="])
    with pytest.raises(DataError) as err:
        data.read_split(str(train), cfg.data, cfg.data.label_column)
    assert str(err.value) == f"{train}, row 2: {message}"


# ------------------------------------------------------------------------------------------ submission files


def test_classification_submissions_carry_the_test_ids_in_order_and_the_models_labels(tokenizer_dir, tmp_path, capsys):
    """AFQMC (pairs), OCNLI (relation names) and CSL (a keyword list paired with the abstract): one line per test
    row, its id as the file has it, the label `albert-dist predict` gives the same texts."""
    texts = [text for text, _ in sentences(24, seed=5)]
    ids = random.Random(1).sample(range(1000), len(texts))  # not 0..n-1: the file's own ids are kept
    cases = {
        "afqmc": (["0", "1"], lambda i, t: {"sentence1": t, "sentence2": texts[-1 - i]}, "afqmc_predict.json"),
        "ocnli": (
            ["entailment", "neutral", "contradiction"],
            lambda i, t: {"sentence1": t, "sentence2": texts[i - 1]},
            "ocnli_50k_predict.json",
        ),
        "csl": (["0", "1"], lambda i, t: {"abst": t, "keyword": ["北京", texts[i - 1][:2]]}, "csl_predict.json"),
    }
    for task, (labels, row, name) in cases.items():
        model = model_dir(tmp_path / task, tokenizer_dir, AlbertForSequenceClassification, labels)
        source = write_lines(
            tmp_path / f"{task}.json", [{"id": k, **row(i, t)} for i, (k, t) in enumerate(zip(ids, texts))]
        )
        assert predict_clue(model, task, source, tmp_path / "submit") == 0
        written = read_lines(tmp_path / "submit" / name)
        rows = read_lines(source)
        text_key, pair_key = {
            "afqmc": ("sentence1", "sentence2"),
            "ocnli": ("sentence1", "sentence2"),
            "csl": ("keyword", "abst"),
        }[task]
        plain = plain_predictions(
            model,
            tmp_path,
            [" ".join(r[text_key]) if isinstance(r[text_key], list) else r[text_key] for r in rows],
            [r[pair_key] for r in rows],
        )
        assert [line["id"] for line in written] == ids
        assert [line["label"] for line in written] == [p["predicted_label"] for p in plain]
        assert all(set(line) == {"id", "label"} for line in written)
        assert len({line["label"] for line in written}) > 1  # a model that varies: the test would see a mix-up
    assert "(CLUE csl)" in capsys.readouterr().out


def test_wsc_submission_reads_the_marked_texts_and_keeps_idx(tokenizer_dir, tmp_path):
    rows = [{k: v for k, v in r.items() if k != "label"} for r in wsc_rows(16, seed=7)]
    source = write_lines(tmp_path / "test.json", rows)
    model = model_dir(tmp_path / "wsc", tokenizer_dir, AlbertForSequenceClassification, ["true", "false"])
    assert predict_clue(model, "wsc", source, tmp_path / "submit") == 0
    written = read_lines(tmp_path / "submit" / "cluewsc11_predict.json")
    plain = plain_predictions(model, tmp_path, [wsc.marked_text(r["text"], r["target"], "") for r in rows])
    assert [line["id"] for line in written] == [r["idx"] for r in rows]
    assert [line["label"] for line in written] == [p["predicted_label"] for p in plain]
    assert len({line["label"] for line in written}) == 2


def test_tnews_names_are_written_as_clues_codes_from_labels_json(tokenizer_dir, tmp_path, capsys):
    """A model trained on label_desc (as clue_tnews.yaml trains) writes TNEWS's codes with their names beside; without
    labels.json that is one error line; a model trained on the codes writes them as they are."""
    texts = [text for text, _ in sentences(20, seed=8)]
    source = write_lines(
        tmp_path / "test.json", [{"id": i, "sentence": t, "keywords": ""} for i, t in enumerate(texts)]
    )
    labels_json = write_lines(tmp_path / "labels.json", [{"label": c, "label_desc": n} for c, n in TNEWS.items()])
    named = model_dir(tmp_path / "named", tokenizer_dir, AlbertForSequenceClassification, list(TNEWS.values()))
    assert predict_clue(named, "tnews", source, tmp_path / "submit", "--clue-labels", str(labels_json)) == 0
    written = read_lines(tmp_path / "submit" / "tnews11_predict.json")
    plain = plain_predictions(named, tmp_path, texts)
    code = {n: c for c, n in TNEWS.items()}
    assert written == [
        {"id": i, "label": code[p["predicted_label"]], "label_desc": p["predicted_label"]} for i, p in enumerate(plain)
    ]
    capsys.readouterr()
    assert predict_clue(named, "tnews", source, tmp_path / "again") == 2
    assert capsys.readouterr().err == (
        "albert-dist: error: tnews: the model's labels are names (news_story, news_culture, news_entertainment, ...) "
        "and CLUE scores tnews's label codes: give the task's labels.json as --clue-labels\n"
    )
    assert not (tmp_path / "again" / "tnews11_predict.json").exists()
    coded = model_dir(tmp_path / "coded", tokenizer_dir, AlbertForSequenceClassification, list(TNEWS))
    assert predict_clue(coded, "tnews", source, tmp_path / "coded_submit") == 0
    plain = plain_predictions(coded, tmp_path, texts)
    assert read_lines(tmp_path / "coded_submit" / "tnews11_predict.json") == [
        {"id": i, "label": p["predicted_label"]} for i, p in enumerate(plain)
    ]


def test_cluener_submission_is_clueners_entity_dict_with_ends_included(tokenizer_dir, tmp_path):
    texts = [text for text, _ in sentences(30, seed=9)]
    ids = list(range(100, 100 + len(texts)))
    source = write_lines(tmp_path / "test.json", [{"id": k, "text": t} for k, t in zip(ids, texts)])
    tags = ["O", "B-name", "I-name", "B-address", "I-address"]
    model = model_dir(tmp_path / "ner", tokenizer_dir, AlbertForTokenClassification, tags)
    assert predict_clue(model, "cluener", source, tmp_path / "submit") == 0
    written = read_lines(tmp_path / "submit" / "cluener_predict.json")
    assert [line["id"] for line in written] == ids
    plain = plain_predictions(model, tmp_path, texts)
    mentions = 0
    for line, text, row in zip(written, texts, plain):
        expected: dict = {}
        for e in json.loads(row["entities"]):
            expected.setdefault(e["type"], {}).setdefault(e["text"], []).append([e["start"], e["end"] - 1])
        assert line["label"] == expected
        for kind, found in line["label"].items():
            assert kind in ("name", "address")
            for mention, spans in found.items():
                assert all(text[a : b + 1] == mention for a, b in spans)
                mentions += len(spans)
    assert mentions > 0


def test_cmrc2018_submission_is_one_object_of_answers_by_question_id(tokenizer_dir, tmp_path):
    records = [{**r, "answers": []} for r in questions(12, seed=10)]  # CLUE's test.json has no answers
    source = write_squad(tmp_path / "test.json", records)
    model = model_dir(tmp_path / "qa", tokenizer_dir, AlbertForQuestionAnswering, ["start", "end"])
    assert predict_clue(model, "cmrc2018", source, tmp_path / "submit") == 0
    written = json.loads((tmp_path / "submit" / "cmrc2018_predict.json").read_text(encoding="utf-8"))
    assert list(written) == [r["id"] for r in records]
    plain = plain_predictions(model, tmp_path, [r["question"] for r in records], [r["context"] for r in records])
    assert list(written.values()) == [p["answer"] for p in plain]
    assert all(answer and answer in r["context"] for answer, r in zip(written.values(), records))


@pytest.mark.parametrize(
    "rows, message",
    [
        (
            [{"sentence": "北京"}, {"sentence": "上海"}],
            "{path}: no id column ('id' or 'idx'): CLUE matches each "
            "prediction to its test row by id; the file has 'sentence'",
        ),
        ([{"id": 3, "sentence": "北京"}, {"id": 3, "sentence": "上海"}], "{path}, row 2: id 3 is also row 1's"),
        (
            [{"id": 0, "sentence": "北京"}, {"id": None, "sentence": "上海"}],
            "{path}, row 2: 'id' is None, not an id (a whole number or a text)",
        ),
    ],
)
def test_a_missing_or_bad_id_is_one_error_line(tokenizer_dir, tmp_path, capsys, rows, message):
    source = write_lines(tmp_path / "test.json", rows)
    model = model_dir(tmp_path / "m", tokenizer_dir, AlbertForSequenceClassification, ["0", "1"])
    assert predict_clue(model, "iflytek", source, tmp_path / "submit") == 2
    assert capsys.readouterr().err == f"albert-dist: error: {message.format(path=source)}\n"
    assert not (tmp_path / "submit" / "iflytek_predict.json").exists()


def test_a_cmrc2018_question_without_id_and_a_model_of_another_head_are_refused(tokenizer_dir, tmp_path, capsys):
    records = questions(3, seed=11)
    source = write_squad(tmp_path / "test.json", records)
    document = json.loads(source.read_text(encoding="utf-8"))
    del document["data"][0]["paragraphs"][1]["qas"][0]["id"]
    source.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    reader = model_dir(tmp_path / "qa", tokenizer_dir, AlbertForQuestionAnswering, ["start", "end"])
    assert predict_clue(reader, "cmrc2018", source, tmp_path / "submit") == 2
    assert capsys.readouterr().err == (
        f"albert-dist: error: {source}, question 2: 'id' is None, not an id (a whole number or a text)\n"
    )
    assert predict_clue(reader, "cluener", source, tmp_path / "submit") == 2
    assert capsys.readouterr().err == (
        "albert-dist: error: --clue cluener takes a token classifier (finetune.task: token_classification); "
        f"{reader} is not one\n"
    )
    assert predict_clue(reader, "glue", source, tmp_path / "submit") == 2
    assert "--clue glue: CLUE tasks are afqmc, tnews, iflytek" in capsys.readouterr().err
    assert predict_clue(reader, "cmrc2018", source, tmp_path / "submit", "--clue-labels", str(source)) == 2
    assert capsys.readouterr().err == (
        "albert-dist: error: --clue-labels: CLUE cmrc2018 is scored on the model's labels as they are; leave it out\n"
    )
    argv = ["predict", "--model", str(reader), "--input", str(source), "--output", str(tmp_path / "out.jsonl")]
    assert main([*argv, "--clue-labels", str(source)]) == 2
    assert capsys.readouterr().err == "albert-dist: error: --clue-labels goes with --clue tnews or --clue iflytek\n"
