"""Question answering end to end: real Ray Train workers fine-tune a tiny Chinese ALBERT to answer questions about
the people, places and organisations of passages (CMRC2018's layout for training, flat JSON lines for dev);
transformers loads the export and agrees with it; contexts several times the model's length are read through
windows."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from finetune_helpers import tiny_model_dir
from mlflow.tracking import MlflowClient
from qa_helpers import questions, write_flat, write_squad, write_vocab_corpus

from albert_dist.finetune import qa_metrics, qa_task
from albert_dist.finetune.config import FinetuneJobConfig
from albert_dist.finetune.job import FINETUNE
from albert_dist.model import AlbertForQuestionAnswering
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.training import train_wordpiece

MAX_LENGTH = 48
STRIDE = 12
FILLER = "今天天气很好，我们一起去公园散步吧。"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa")
    train_wordpiece(write_vocab_corpus(root / "corpus.txt"), root / "tokenizer", 200, progress=lambda _: None)
    tiny_model_dir(root / "pretrain_run" / "model", root / "tokenizer")
    # passages of up to 2 sentences: some run past the model's length, so training reads windows too
    write_squad(root / "train.json", questions(400, seed=1, most=2))
    write_flat(root / "dev.jsonl", questions(80, seed=2, most=2))
    return root


def qa_config(root) -> FinetuneJobConfig:
    return FinetuneJobConfig.model_validate(
        {
            "run": {"name": "qa", "output_dir": str(root / "runs")},
            "model": {"init_from": str(root / "pretrain_run" / "model")},
            "data": {
                "train": str(root / "train.json"),
                "dev": str(root / "dev.jsonl"),
                "max_seq_length": MAX_LENGTH,
                "doc_stride": STRIDE,
            },
            "finetune": {"task": "question_answering", "epochs": 14},
            "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
            "train": {
                "precision": "fp32",
                "learning_rate": 3e-3,
                "batch_size": 16,
                "log_every": 20,
                "eval_every": 1000,
            },
            "tracking": {"tracking_uri": f"sqlite:///{root}/mlflow.db"},
        }
    )


@pytest.fixture(scope="module")
def qa(workspace, ray_session):
    return FINETUNE.run(qa_config(workspace))


@pytest.mark.slow
def test_qa_learns_to_answer_and_logs_exact_match_and_f1(qa):
    m = qa.metrics
    # a randomly initialised tiny ALBERT: it finds names after an epoch, and learns which one the question asks for
    assert m["dev_f1"] > 0.75 and m["dev_exact_match"] > 0.6, m
    # the best of the workers' evaluations (their summed tables) is the published model's, scored again by the driver
    client = MlflowClient(tracking_uri=qa.tracking_uri)
    history = [point.value for point in client.get_metric_history(qa.run_id, "eval_f1")]
    assert len(history) == 14 and max(history) == pytest.approx(m["dev_f1"])
    assert client.get_run(qa.run_id).data.metrics["dev_exact_match"] == m["dev_exact_match"]
    config = json.loads((qa.model_dir / "config.json").read_text())
    assert config["architectures"] == ["AlbertForQuestionAnswering"] and config["num_labels"] == 2


@pytest.mark.slow
def test_transformers_loads_the_export_and_answers_the_same(qa):
    """transformers' model and tokenizer on dev-like questions: logits within 1e-4 of ours, and the best span over
    every start and end of theirs (a full search, their tokenizer's character offsets) is the answer our decoding
    finds, at the same offsets (transformers 5 has no question-answering pipeline left to ask)."""
    import transformers

    theirs = transformers.AutoModelForQuestionAnswering.from_pretrained(qa.model_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(qa.model_dir)
    ours = AlbertForQuestionAnswering.from_pretrained(qa.model_dir).eval()
    records = questions(30, seed=5, most=1)  # contexts that fit the model whole
    answers = qa_task.answer_questions(
        ours,
        load_tokenizer(qa.model_dir),
        [r["question"] for r in records],
        [r["context"] for r in records],
        MAX_LENGTH,
        STRIDE,
    )
    for record, answer in zip(records, answers):
        inputs = tokenizer(record["question"], record["context"], return_tensors="pt", return_offsets_mapping=True)
        offsets = inputs.pop("offset_mapping")[0].tolist()
        with torch.no_grad():
            mine = ours(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
            reference = theirs(**inputs)
        assert (reference.start_logits - mine.start_logits).abs().max() <= 1e-4
        assert (reference.end_logits - mine.end_logits).abs().max() <= 1e-4
        context = [i for i, segment in enumerate(inputs.sequence_ids(0)) if segment == 1]
        start, end = reference.start_logits[0], reference.end_logits[0]
        best = max(((start[a] + end[b]).item(), a, b) for a in context for b in context if 0 <= b - a < 30)
        _, a, b = best
        found = (offsets[a][0], offsets[b][1])
        assert (record["context"][found[0] : found[1]], *found) == (answer.text, answer.start, answer.end)
    assert np.mean([a.text == r["answers"][0][0] for a, r in zip(answers, records)]) > 0.6


@pytest.mark.slow
def test_long_contexts_are_answered_through_windows(qa):
    """Passages among sentences that name nobody, 3 times the model's length and more: answered from whichever
    window holds the answer, those past the first window included."""
    rng = random.Random(9)
    records = []
    for record in questions(40, seed=9, most=1):
        # the passage somewhere among sentences that name nobody, so the context runs to 3-5 times the length
        before, after = FILLER * rng.randint(0, 8), FILLER * rng.randint(0, 8)
        while len(before) + len(record["context"]) + len(after) < 3 * MAX_LENGTH:
            after += FILLER
        (text, start), *_ = record["answers"]
        context = before + record["context"] + after
        records.append({**record, "context": context, "answers": [(text, start + len(before))]})
    model = AlbertForQuestionAnswering.from_pretrained(qa.model_dir)
    answers = qa_task.answer_questions(
        model,
        load_tokenizer(qa.model_dir),
        [r["question"] for r in records],
        [r["context"] for r in records],
        MAX_LENGTH,
        STRIDE,
    )
    gold = [tuple(t for t, _ in r["answers"]) for r in records]
    scored = qa_metrics.score_answers([a.text for a in answers], gold, "zh")
    # answers no window from the start of the context holds are found too, if less often than in the passage alone:
    # this tiny model never trained on windows cut mid-sentence among so many sentences that name nobody
    late = [i for i, r in enumerate(records) if r["answers"][0][1] > MAX_LENGTH]
    late_scored = qa_metrics.score_answers([answers[i].text for i in late], [gold[i] for i in late], "zh")
    assert len(late) >= 10 and scored["f1"] > 0.3 and late_scored["f1"] > 0.25, (scored, late_scored)


@pytest.mark.slow
def test_a_qa_teacher_distills_per_position(qa, workspace, tmp_path):
    from albert_dist.finetune.config import DistillJobConfig
    from albert_dist.finetune.distill import DISTILL

    raw = qa_config(workspace).model_dump(mode="json", exclude={"model": True, "finetune": {"task"}})
    raw["run"] = {"name": "qa-distill", "output_dir": str(tmp_path / "runs")}
    raw["finetune"]["epochs"] = 4
    raw["distill"] = {"teacher": str(qa.model_dir), "speed_repeats": 3}
    raw["student"] = {"num_hidden_layers": 1}
    outcome = DISTILL.run(DistillJobConfig.model_validate(raw))
    m = outcome.metrics
    assert m["teacher_dev_f1"] == pytest.approx(qa.metrics["dev_f1"])
    assert m["student_dev_f1"] > 0.6 and "eval_kd_loss" in m and "student_dev_exact_match" in m, m
    config = json.loads((outcome.model_dir / "config.json").read_text())
    assert config["architectures"] == ["AlbertForQuestionAnswering"] and config["num_hidden_layers"] == 1


@pytest.mark.slow
def test_a_qa_sweep_ranks_trials_by_answer_f1(workspace, ray_session):
    from albert_dist.config import load_config, validate_config
    from albert_dist.tune.config import FinetuneTuneConfig
    from albert_dist.tune.sweep import run_sweep

    job = qa_config(workspace).model_dump(mode="json")
    job["finetune"]["epochs"] = 2
    job["scaling"] = {"num_workers": 1, "cpus_per_worker": 0.5}
    cfg = validate_config(
        FinetuneTuneConfig,
        {
            "job": job,
            "run": {"name": "qa-sweep", "output_dir": str(workspace / "sweeps")},
            "search_space": {"train.learning_rate": {"choice": [1e-5, 3e-3]}},
            "num_samples": 2,
            "max_concurrent_trials": 2,
            "resources_per_trial": {"num_workers": 1, "cpu": 0.5},
            "search_alg": "random",
            "scheduler": {"kind": "none"},
        },
    )
    assert cfg.tune_metric == "eval_f1" and cfg.tune_mode == "max"  # question answering's default
    outcome = run_sweep(cfg)
    assert len(outcome.rows) == 2 and all(row["eval_f1"] is not None for row in outcome.rows)
    assert outcome.best["eval_f1"] == max(row["eval_f1"] for row in outcome.rows)
    best = load_config(FinetuneJobConfig, outcome.best_config)
    assert (
        best.finetune.task == "question_answering" and best.train.learning_rate == outcome.best["train.learning_rate"]
    )


@pytest.mark.slow
def test_predict_answers_questions_from_pytorch_and_from_the_onnx_export(qa, tmp_path):
    """`albert-dist predict` with the question as --text-column and the context as --text-pair-column writes the
    answers `answer_questions` gives, with their offsets in the context; the ONNX export answers the same."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from albert_dist.cli import main

    records = questions(20, seed=21)
    asked = [r["question"] for r in records]
    contexts = [r["context"] for r in records]
    pq.write_table(pa.table({"q": asked, "passage": contexts}), tmp_path / "in.parquet")
    model = AlbertForQuestionAnswering.from_pretrained(qa.model_dir)
    expected = qa_task.answer_questions(model, load_tokenizer(qa.model_dir), asked, contexts, MAX_LENGTH, STRIDE)
    columns = ["--text-column", "q", "--text-pair-column", "passage", "--input", str(tmp_path / "in.parquet")]
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", str(qa.model_dir), "--output", str(out), "--precision", "fp32", *columns]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["answer"], r["answer_start"], r["answer_end"]) for r in rows] == [
        (a.text, a.start, a.end) for a in expected
    ]
    assert all(r["passage"][r["answer_start"] : r["answer_end"]] == r["answer"] for r in rows)
    assert sum(r["answer"] == rec["answers"][0][0] for r, rec in zip(rows, records)) >= 10  # it reads, too

    export = tmp_path / "onnx"
    assert main(["export", "--model", str(qa.model_dir), "--output", str(export)]) == 0
    onnx_out = tmp_path / "onnx.jsonl"
    assert main(["predict", "--model", str(export), "--backend", "onnx", "--output", str(onnx_out), *columns]) == 0
    from_onnx = [json.loads(line) for line in onnx_out.read_text(encoding="utf-8").splitlines()]
    assert [(r["answer_start"], r["answer_end"]) for r in from_onnx] == [
        (r["answer_start"], r["answer_end"]) for r in rows
    ]
