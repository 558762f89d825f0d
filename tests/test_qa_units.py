"""Question answering's pieces without Ray: the readers and their errors, windows that hold the answer, decoding
from hand-made logits, CMRC2018's and SQuAD's exact match and F1 on worked cases, and the loop's summed tables
giving the driver's scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from qa_helpers import questions, write_flat, write_squad, write_vocab_corpus

from albert_dist.data import batching
from albert_dist.errors import ConfigError, DataError
from albert_dist.finetune import job, qa_data, qa_metrics, qa_task
from albert_dist.finetune.config import FinetuneJobConfig
from albert_dist.model import AlbertConfig, AlbertForQuestionAnswering
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.training import train_wordpiece


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa_tok")
    train_wordpiece(write_vocab_corpus(root / "corpus.txt"), root / "tok", 200, progress=lambda _: None)
    return root / "tok"


def test_squad_and_flat_json_lines_read_the_same_questions(tmp_path):
    records = questions(30, seed=1)
    squad = qa_data.read_questions(str(write_squad(tmp_path / "a.json", records)))
    flat = qa_data.read_questions(str(write_flat(tmp_path / "a.jsonl", records)))
    for split in (squad, flat):
        assert split.ids == [r["id"] for r in records]
        assert split.questions == [r["question"] for r in records]
        assert split.contexts == [r["context"] for r in records]
        assert split.answers == [r["answers"] for r in records]
    assert not squad.has_unanswerable
    assert qa_data.language_of(squad.contexts) == "zh"


def test_squad_v2_unanswerable_questions_and_several_gold_answers(tmp_path):
    document = {
        "version": "v2.0",
        "data": [
            {
                "title": "Normans",
                "paragraphs": [
                    {
                        "context": "The Normans gave their name to Normandy, a region in France.",
                        "qas": [
                            {
                                "id": "a",
                                "question": "Where is Normandy?",
                                "answers": [
                                    {"text": "France", "answer_start": 53},
                                    {"text": "in France", "answer_start": 50},
                                ],
                                "is_impossible": False,
                            },
                            {
                                "id": "b",
                                "question": "Who named Paris?",
                                "answers": [],
                                "plausible_answers": [{"text": "Normans", "answer_start": 4}],
                                "is_impossible": True,
                            },
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "dev-v2.0.json"
    path.write_text(json.dumps(document))
    split = qa_data.read_questions(str(path))
    assert split.answers == [[("France", 53), ("in France", 50)], []]
    assert split.has_unanswerable and qa_data.language_of(split.contexts) == "en"
    gold = split.gold()
    assert gold.contexts == (document["data"][0]["paragraphs"][0]["context"],) and gold.context_of == (0, 0)
    assert gold.answers == (("France", "in France"), ())


@pytest.mark.parametrize(
    "answer, message",
    [
        (
            {"text": "上海", "answer_start": 1},
            r"bad.json: question 'q7': the context reads '北京' at 1, not the answer '上海'",
        ),
        (
            {"text": "北京", "answer_start": 9},
            r"bad.json: question 'q7': answer '北京' at 9 is outside the context \(4",
        ),
        ({"text": "北京", "answer_start": "1"}, r"question 'q7': answer '北京' at '1' is not a text and an offset"),
    ],
)
def test_an_answer_that_is_not_in_its_context_names_file_and_question(tmp_path, answer, message):
    qa = {"id": "q7", "question": "哪里？", "answers": [answer]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "去北京了", "qas": [qa]}]}]}, ensure_ascii=False))
    with pytest.raises(DataError, match=message):
        qa_data.read_questions(str(path))


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '{"id": "x", "question": "q", "context": "c", "answers": {"text": ["c"], "answer_start": []}}\n',
            "1 answer texts but 0",
        ),
        (
            '{"id": "x", "question": "q", "context": "c", "answers": {"text": [], "answer_start": []}}\nnot json\n',
            "line 2: not JSON",
        ),
        (
            '{"id": "x", "context": "c", "answers": {"text": [], "answer_start": []}}\n',
            "question 'x' has no 'question'",
        ),
    ],
)
def test_bad_flat_records_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        qa_data.read_questions(str(path))


def as_split(records: list[dict]) -> qa_data.QuestionSplit:
    columns = ([r[k] for r in records] for k in ("id", "question", "context", "answers"))
    return qa_data.QuestionSplit("x", *columns)


def test_long_contexts_are_windows_that_hold_the_answer_whole(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    records = questions(40, seed=4, most=6)
    encoded = qa_data.encode_questions(as_split(records), tokenizer, 40, 8, 64)
    a = encoded.arrays
    assert a["length"].max() == 40 and len(a["length"]) > len(records)  # some contexts need several windows
    for q, record in enumerate(records):
        own = np.flatnonzero(a["example"] == q)
        text, start = record["answers"][0]
        holding = [w for w in own if a["start_position"][w] > 0]
        assert holding, record  # some window holds the answer whole
        for w in holding:
            s, e = a["start_position"][w], a["end_position"][w]
            assert record["context"][a["piece_start"][w, s] : a["piece_end"][w, e]] == text
            assert a["token_type_ids"][w, s] == 1 and a["piece_start"][w, s] >= 0
        for w in own:
            k = a["length"][w]
            question = len(tokenizer.encode(record["question"]))
            assert a["input_ids"][w, 0] == tokenizer.cls_id and a["input_ids"][w, question + 1] == tokenizer.sep_id
            assert a["token_type_ids"][w, : question + 2].sum() == 0 and a["token_type_ids"][w, question + 2 : k].all()
            assert (a["piece_start"][w, : question + 2] == -1).all() and a["piece_start"][w, k - 1] == -1
            covered = sorted({int(c) for c in a["piece_start"][w] if c >= 0})
            assert covered == sorted(covered) and all(0 <= c < len(record["context"]) for c in covered)
        # the windows together cover every character of the context, and each piece may start an answer in one
        seen, starts = set(), []
        for w in own:
            for s, e, m in zip(a["piece_start"][w], a["piece_end"][w], a["max_context"][w]):
                seen.update(range(s, e))
                starts += [s] * m
        assert seen == set(range(len(record["context"]))) and sorted(starts) == list(range(len(record["context"])))


def test_a_piece_starts_answers_in_the_window_where_it_has_the_most_context():
    spans = batching.windows(20, 8, 4)  # [0, 8), [4, 12), [8, 16), [12, 20)
    owner = qa_data.best_windows(20, spans)
    assert (
        owner.tolist() == [0] * 6 + [1] * 4 + [2] * 4 + [3] * 6
    )  # piece 5: 2 on its shorter side in [0, 8), 1 in [4, 12)
    assert all(spans[w][0] <= p < spans[w][1] for p, w in enumerate(owner))


def test_a_latin_answer_maps_to_whole_words(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    context = "张伟在 Shanghai工作，2024年回到北京。"
    split = qa_data.QuestionSplit("x", ["a"], ["哪里？"], [context], [[("Shanghai", 4)]])
    a = qa_data.encode_questions(split, tokenizer, 64, 8, 64).arrays
    s, e = a["start_position"][0], a["end_position"][0]
    assert e > s  # the word is several pieces, the answer all of them
    assert context[a["piece_start"][0, s] : a["piece_end"][0, e]] == "Shanghai"


def test_a_question_that_leaves_no_room_for_context_is_a_config_error(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    split = qa_data.QuestionSplit("x", ["a"], ["文中提到的人是谁？" * 3], ["张伟去了北京。"], [[("张伟", 0)]])
    with pytest.raises(ConfigError, match="leaves .* context pieces after a question of .* not more than"):
        qa_data.encode_questions(split, tokenizer, 32, 8, 64)
    assert len(qa_data.encode_questions(split, tokenizer, 32, 8, 9)) >= 1  # the question cut to 9 pieces fits


def hand_made(windows: list[tuple[int, list[int]]], width: int = 12):
    """Arrays of windows given as (question, [character start of each context piece]): the context is at
    positions 3..; each piece one character."""
    n = len(windows)
    arrays = {
        "example": np.asarray([q for q, _ in windows]),
        "piece_start": np.full((n, width), -1),
        "piece_end": np.full((n, width), -1),
        "max_context": np.zeros((n, width), dtype=np.int8),
    }
    for w, (_, chars) in enumerate(windows):
        arrays["piece_start"][w, 3 : 3 + len(chars)] = chars
        arrays["piece_end"][w, 3 : 3 + len(chars)] = np.asarray(chars) + 1
        arrays["max_context"][w, 3 : 3 + len(chars)] = 1
    return batching.EncodedSplit(arrays)


def test_decoding_picks_the_best_span_inside_the_context_across_windows():
    context = "0123456789"
    encoded = hand_made([(0, [0, 1, 2, 3, 4, 5]), (0, [4, 5, 6, 7, 8, 9])])
    start, end = np.zeros((2, 12)), np.zeros((2, 12))
    start[:, 1] = end[:, 1] = 50  # the question's pieces are never an answer
    start[0, 4], end[0, 3] = 5, 6  # an end before its start is no span
    start[1, 5], end[1, 7] = 4, 4  # window 2: characters 6..8
    start[0, 8] = 9  # character 5 starts answers in window 2 only: alone here, it would score 9
    encoded.arrays["max_context"][0, 8] = encoded.arrays["max_context"][1, 3] = 0
    start[0, 0] = end[0, 0] = 3  # [CLS]: no answer scores 6, below the best span's 8
    [answer] = qa_task.best_answers(start, end, encoded, [context], max_answer_length=30)
    assert (answer.text, answer.start, answer.end, answer.score) == ("678", 6, 9, 8.0)
    # three pieces are too many at max_answer_length 2: the best of the rest
    [short] = qa_task.best_answers(start, end, encoded, [context], max_answer_length=2)
    assert short.end - short.start <= 2 and short.score < 8
    # with unanswerable questions in the data, [CLS] wins when its lowest score over the windows beats the span
    start[:, 0] = end[:, 0] = 5
    [none] = qa_task.best_answers(start, end, encoded, [context], 30, allow_no_answer=True)
    assert (none.text, none.start) == ("", -1)
    assert qa_task.best_answers(start, end, encoded, [context], 30)[0].text == "678"


def test_each_question_is_answered_from_its_own_windows():
    encoded = hand_made([(0, [0, 1, 2]), (1, [0, 1, 2, 3]), (1, [2, 3, 4, 5])])
    start, end = np.zeros((3, 12)), np.zeros((3, 12))
    start[0, 3], end[0, 4] = 9, 9
    start[2, 4], end[2, 6] = 1, 1  # window 3 (question 2): characters 3..5; window 1's span is not question 2's
    answers = qa_task.best_answers(start, end, encoded, ["abc", "abcdefg"], 30)
    assert [a.text for a in answers] == ["ab", "def"]


@pytest.mark.parametrize(
    "gold, predicted, exact, f1",
    [
        ("the Eiffel Tower", "Eiffel Tower!", 1.0, 1.0),  # articles and punctuation dropped
        ("Denver Broncos", "the Broncos", 0.0, 2 / 3),  # P 1/1, R 1/2
        ("Santa Clara, California", "Levi's Stadium in Santa Clara", 0.0, 0.5),  # P 2/5, R 2/3
        ("Denver Broncos", "", 0.0, 0.0),
    ],
)
def test_squad_exact_match_and_f1_on_worked_cases(gold, predicted, exact, f1):
    assert qa_metrics.squad_exact(gold, predicted) == exact
    assert qa_metrics.squad_f1(gold, predicted) == pytest.approx(f1)


@pytest.mark.parametrize(
    "gold, predicted, exact, f1",
    [
        ("北京大学", "北京大学。", 1.0, 1.0),  # CMRC's punctuation is removed
        ("张伟", "记者张伟", 0.0, 2 / 3),  # P 2/4, R 2/2
        ("北京大学", "北大学京", 0.0, 0.5),  # the longest common substring (大学), not the shared characters
        ("iPhone 12", "苹果iPhone 12手机", 0.0, 0.5),  # Latin words are segments: P 2/6, R 2/2
        ("《红楼梦》", "红楼梦", 1.0, 1.0),
        ("张伟", "李娜", 0.0, 0.0),
    ],
)
def test_cmrc_exact_match_and_f1_on_worked_cases(gold, predicted, exact, f1):
    assert qa_metrics.cmrc_exact(gold, predicted) == exact
    assert qa_metrics.cmrc_f1(gold, predicted) == pytest.approx(f1)


def test_scores_take_the_best_gold_answer_and_empty_predictions_for_unanswerable():
    scored = qa_metrics.score_answers(["记者张伟", "", "上海"], [("张伟", "记者张伟"), (), ("北京",)], "zh")
    assert scored == {"exact_match": pytest.approx(2 / 3), "f1": pytest.approx(2 / 3)}
    english = qa_metrics.score_answers(["in France", "Paris"], [("France", "in France"), ()], "en")
    assert english == {"exact_match": 0.5, "f1": 0.5}


class Rows:
    """A split as `ray.data.Dataset.iter_batches` hands it to the workers."""

    def __init__(self, arrays):
        self.arrays = arrays

    def iter_batches(self, batch_size, batch_format):
        n = len(self.arrays["length"])
        for start in range(0, n, batch_size):
            yield {k: v[start : start + batch_size] for k, v in self.arrays.items()}


def test_the_loops_summed_tables_score_as_the_driver_does(tokenizer_dir, tmp_path):
    """Two ranks' evaluation statistics (tables filled by index_add, nothing read back) summed and summarized equal
    the driver's scores of the same model: the same answers decoded from the same logits."""
    tokenizer = load_tokenizer(tokenizer_dir)
    records = questions(24, seed=8, most=4)
    path = write_squad(tmp_path / "dev.json", records)
    split = qa_data.read_questions(str(path))
    encoded = qa_data.encode_questions(split, tokenizer, 32, 8, 64)
    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=tokenizer.vocab_size, embedding_size=16, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, num_labels=2,
    )  # fmt: skip
    model = AlbertForQuestionAnswering(config).eval()
    decoding = {"language": "zh", "max_answer_length": 30, "allow_no_answer": False}
    spec = qa_task.QuestionAnsweringSpec(
        init_from=str(tokenizer_dir), tokenizer_dir=str(tokenizer_dir), task="question_answering", num_labels=2,
        model_overrides={}, metric="f1", patience=None, layer_lr_decay=1.0, lr_scales={}, batch_size=4,
        eval_batch_size=5, grad_accum_steps=1, micro_batches_per_epoch=1, eval_rows=len(encoded), seed=0,
        pad_to_multiple_of=8, group_by_length=True, max_seq_length=32, gold=split.gold(), **decoding,
    )  # fmt: skip
    sums = {}
    for rank in range(2):
        task = spec.build(rank, 2, lambda name: Rows(encoded.arrays))
        with torch.no_grad():
            for batch in task.eval_batches():
                assert {"row", "start_position", "end_position"} <= set(batch)
                _, stats = task.loss(model, batch)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0) + (v.numpy() if isinstance(v, torch.Tensor) else v)
    assert sums["count"] == len(encoded)
    summed = task.summarize({k: v.reshape(-1).tolist() if np.ndim(v) else float(v) for k, v in sums.items()})
    driver = qa_task.evaluate_questions(model, encoded, split.gold(), decoding, batch_size=7)
    assert summed["f1"] == pytest.approx(driver["f1"]) and summed["exact_match"] == pytest.approx(driver["exact_match"])
    # and the windows' logits put back in the table are the driver's
    start, _ = qa_task.window_logits(model, encoded, batch_size=7)
    table = np.asarray(sums["start_table"]).reshape(len(encoded), 32)
    inside = encoded.arrays["piece_start"] >= 0
    assert np.allclose(table[inside], start[inside], atol=1e-5)


def test_training_batches_carry_the_answer_positions_but_not_the_tables_keys(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    split = as_split(questions(10, seed=2))
    encoded = qa_data.encode_questions(split, tokenizer, 32, 8, 64)
    spec = qa_task.QuestionAnsweringSpec(
        init_from="x", tokenizer_dir=str(tokenizer_dir), task="question_answering", num_labels=2,
        model_overrides={}, metric="f1", patience=None, layer_lr_decay=1.0, lr_scales={}, batch_size=4,
        eval_batch_size=5, grad_accum_steps=1, micro_batches_per_epoch=1, eval_rows=len(encoded), seed=0,
        pad_to_multiple_of=8, group_by_length=True, max_seq_length=32,
    )  # fmt: skip
    task = spec.build(0, 1, lambda name: Rows(encoded.arrays))
    batch = next(iter(task.train_batches(0)))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "start_position", "end_position"}


def test_question_answering_config():
    base = {"model": {"init_from": "x"}, "data": {"train": "t.json", "max_seq_length": 64}}
    cfg = FinetuneJobConfig.model_validate({**base, "finetune": {"task": "question_answering"}})
    assert cfg.finetune.best_metric == "f1" and cfg.data.max_answer_length == 30 and cfg.data.language == "auto"
    assert (
        FinetuneJobConfig.model_validate(
            {**base, "finetune": {"task": "question_answering", "metric": "exact_match"}}
        ).finetune.best_metric
        == "exact_match"
    )
    with pytest.raises(ValueError, match="metric accuracy does not apply to question_answering"):
        FinetuneJobConfig.model_validate({**base, "finetune": {"task": "question_answering", "metric": "accuracy"}})
    overrides = job.label_overrides("question_answering", None)
    assert overrides["num_labels"] == 2 and len(overrides["id2label"]) == 2
    assert job.model_class("question_answering") is AlbertForQuestionAnswering


def test_span_distillation_compares_distributions_over_positions_leaving_padding_out():
    from albert_dist.finetune.distill import span_distillation_loss

    torch.manual_seed(0)
    student, teacher = torch.randn(3, 9, 2), torch.randn(3, 9, 2)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = mask[2, 4:] = 0
    start, end = torch.tensor([2, 0, 3]), torch.tensor([4, 0, 3])
    loss, kd, ce = span_distillation_loss(student, teacher, start, end, mask, 2.0, 0.3)
    assert loss.item() == pytest.approx(0.3 * kd.item() + 0.7 * ce.item(), rel=1e-6)
    # row by row over its own positions: KL of the tempered distributions (× T²), CE of the gold positions
    kl, nll = [], []
    for row in range(3):
        k = int(mask[row].sum())
        for i, gold in enumerate((start, end)):
            p_teacher = torch.softmax(teacher[row, :k, i] / 2, 0)
            log_student = torch.log_softmax(student[row, :k, i] / 2, 0)
            kl.append((p_teacher * (p_teacher.log() - log_student)).sum() * 4)
            nll.append(-torch.log_softmax(student[row, :k, i], 0)[gold[row]])
    assert kd.item() == pytest.approx(torch.stack(kl).mean().item(), rel=1e-5)
    assert ce.item() == pytest.approx(torch.stack(nll).mean().item(), rel=1e-5)
    noisy = student.clone()
    noisy[mask == 0] += 100  # padding's logits change nothing
    assert span_distillation_loss(noisy, teacher, start, end, mask, 2.0, 0.3)[0].item() == pytest.approx(loss.item())
    assert span_distillation_loss(teacher, teacher, start, end, mask, 2.0, 1.0)[1].item() == pytest.approx(0, abs=1e-6)
