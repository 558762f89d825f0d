"""Token classification end to end: real Ray Train workers fine-tune a tiny Chinese ALBERT for NER from CoNLL
training data and a CLUENER dev file; transformers loads the export, agrees with it, and scores it the same with
seqeval; long sentences are read whole through windows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from finetune_helpers import tiny_model_dir
from mlflow.tracking import MlflowClient
from ner_helpers import passages, sentences, write_cluener, write_conll, write_vocab_corpus

from albert_dist.finetune import entities, token_data, token_task
from albert_dist.finetune.config import FinetuneJobConfig
from albert_dist.finetune.job import FINETUNE
from albert_dist.model import AlbertForTokenClassification
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.training import train_wordpiece

MAX_LENGTH = 32


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("ner")
    train_wordpiece(write_vocab_corpus(root / "corpus.txt"), root / "tokenizer", 200, progress=lambda _: None)
    tiny_model_dir(root / "pretrain_run" / "model", root / "tokenizer")
    # some training texts run past the model's length, so training reads windows too
    write_conll(root / "train.conll", sentences(300, seed=1) + passages(100, seed=3))
    write_cluener(root / "dev.json", sentences(100, seed=2))
    return root


def ner_config(root, **data) -> FinetuneJobConfig:
    return FinetuneJobConfig.model_validate(
        {
            "run": {"name": "ner", "output_dir": str(root / "runs")},
            "model": {"init_from": str(root / "pretrain_run" / "model")},
            "data": {
                "train": str(root / "train.conll"),
                "dev": str(root / "dev.json"),
                "max_seq_length": MAX_LENGTH,
                **data,
            },
            "finetune": {"task": "token_classification", "epochs": 6},
            "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
            "train": {"precision": "fp32", "learning_rate": 2e-3, "batch_size": 16, "log_every": 20},
            "tracking": {"tracking_uri": f"sqlite:///{root}/mlflow.db"},
        }
    )


@pytest.fixture(scope="module")
def ner(workspace, ray_session):
    return FINETUNE.run(ner_config(workspace))


@pytest.mark.slow
def test_ner_learns_entities_and_logs_them(ner):
    m = ner.metrics
    assert m["dev_f1"] > 0.9, m
    assert {"dev_PER_f1", "dev_LOC_f1", "dev_ORG_f1", "dev_precision", "dev_recall"} <= set(m)
    # the best of the workers' evaluations (their summed tables) is the published model's, scored again by the driver
    client = MlflowClient(tracking_uri=ner.tracking_uri)
    history = [point.value for point in client.get_metric_history(ner.run_id, "eval_f1")]
    assert len(history) == 6 and max(history) == pytest.approx(m["dev_f1"])
    assert client.get_run(ner.run_id).data.metrics["dev_LOC_f1"] == m["dev_LOC_f1"]
    config = json.loads((ner.model_dir / "config.json").read_text())
    assert config["architectures"] == ["AlbertForTokenClassification"]
    assert set(config["id2label"].values()) == {"O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"}


@pytest.mark.slow
def test_transformers_loads_the_export_and_scores_it_the_same(ner, workspace):
    """An independent meter: transformers' model and tokenizer on the dev file's characters, seqeval's strict F1
    on its word predictions, equal the job's dev F1; logits agree within 1e-4."""
    import transformers
    from seqeval.metrics import f1_score
    from seqeval.scheme import IOB2

    theirs = transformers.AutoModelForTokenClassification.from_pretrained(ner.model_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(ner.model_dir)
    ours = AlbertForTokenClassification.from_pretrained(ner.model_dir)
    dev = token_data.read_tagged(str(workspace / "dev.json"), ner_config(workspace).data)
    predicted = []
    for words in dev.words:
        inputs = tokenizer(words, is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            logits = theirs(**inputs).logits
            mine = ours(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]).logits
        assert (logits - mine).abs().max() <= 1e-4
        word_ids = inputs.word_ids()
        firsts = [i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)]
        predicted.append([theirs.config.id2label[int(logits[0, i].argmax())] for i in firsts])
    assert f1_score(dev.tags, predicted, mode="strict", scheme=IOB2) == pytest.approx(ner.metrics["dev_f1"])


@pytest.mark.slow
def test_long_sentences_are_read_whole_through_windows(ner):
    """Sentences joined into texts 3-5 times the model's length: scored word by word through windows, as well
    as the short ones; cut at the model's length instead, the entities past the cut are lost."""
    long_texts = [(text, spans) for text, spans in passages(80, seed=9, most=8) if len(text) > 3 * MAX_LENGTH]
    assert len(long_texts) >= 15
    split = token_data.TaggedSplit(
        "long",
        [list(t) for t, _ in long_texts],
        [entities.tags_from_spans(len(t), s) for t, s in long_texts],
        list(range(1, len(long_texts) + 1)),
    )
    model = AlbertForTokenClassification.from_pretrained(ner.model_dir)
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    tokenizer = load_tokenizer(ner.model_dir)
    encoded = token_data.encode_tagged(
        split, tokenizer, MAX_LENGTH, 8, token_data.tag_ids(split, {n: i for i, n in enumerate(names)})
    )
    whole = token_task.evaluate_tokens(model, encoded, names, "BIO")
    assert whole["f1"] > 0.85, whole
    # the same texts cut at the model's length keep only the entities of their first window
    cut = token_data.TaggedSplit(
        "cut", [w[: MAX_LENGTH - 2] for w in split.words], [t[: MAX_LENGTH - 2] for t in split.tags], []
    )
    kept = sum(len(entities.entities(t, "BIO")) for t in cut.tags)
    assert kept < 0.4 * sum(len(s) for _, s in long_texts)


@pytest.mark.slow
def test_text_entities_match_the_transformers_pipeline(ner):
    """Entities with character offsets from raw text (what predict writes) equal transformers'
    token-classification pipeline's on the same model (aggregation "first")."""
    import transformers

    texts = [text for text, _ in sentences(20, seed=11)] + ["", "记者张伟从Shanghai发回报道，2024年。"]
    model = AlbertForTokenClassification.from_pretrained(ner.model_dir)
    ours = token_task.text_entities(model, load_tokenizer(ner.model_dir), texts, MAX_LENGTH, 8)
    pipe = transformers.pipeline("token-classification", model=str(ner.model_dir), aggregation_strategy="first")
    for text, found in zip(texts, ours):
        theirs = pipe(text) if text else []
        assert [(e["type"], e["start"], e["end"]) for e in found] == [
            (e["entity_group"], e["start"], e["end"]) for e in theirs
        ], text
        assert np.allclose([e["score"] for e in found], [e["score"] for e in theirs], atol=1e-4)


@pytest.mark.slow
def test_a_ner_teacher_distills_per_token(ner, workspace, tmp_path):
    from albert_dist.finetune.config import DistillJobConfig
    from albert_dist.finetune.distill import DISTILL

    raw = ner_config(workspace).model_dump(mode="json", exclude={"model": True, "finetune": {"task"}})
    raw["run"] = {"name": "ner-distill", "output_dir": str(tmp_path / "runs")}
    raw["distill"] = {"teacher": str(ner.model_dir), "speed_repeats": 3}
    raw["student"] = {"num_hidden_layers": 1}
    outcome = DISTILL.run(DistillJobConfig.model_validate(raw))
    m = outcome.metrics
    assert m["teacher_dev_f1"] == pytest.approx(ner.metrics["dev_f1"])
    assert m["student_dev_f1"] > 0.8 and "eval_kd_loss" in m, m
    config = json.loads((outcome.model_dir / "config.json").read_text())
    assert config["architectures"] == ["AlbertForTokenClassification"] and config["num_hidden_layers"] == 1


@pytest.mark.slow
def test_a_ner_sweep_ranks_trials_by_entity_f1(workspace, ray_session):
    from albert_dist.config import load_config, validate_config
    from albert_dist.tune.config import FinetuneTuneConfig
    from albert_dist.tune.sweep import run_sweep

    job = ner_config(workspace).model_dump(mode="json")
    job["finetune"]["epochs"] = 2
    job["scaling"] = {"num_workers": 1, "cpus_per_worker": 0.5}
    cfg = validate_config(
        FinetuneTuneConfig,
        {
            "job": job,
            "run": {"name": "ner-sweep", "output_dir": str(workspace / "sweeps")},
            "search_space": {"train.learning_rate": {"choice": [1e-5, 3e-3]}},
            "num_samples": 2,
            "max_concurrent_trials": 2,
            "resources_per_trial": {"num_workers": 1, "cpu": 0.5},
            "search_alg": "random",
            "scheduler": {"kind": "none"},
        },
    )
    assert cfg.tune_metric == "eval_f1" and cfg.tune_mode == "max"  # token classification's default
    outcome = run_sweep(cfg)
    assert len(outcome.rows) == 2 and all(row["eval_f1"] is not None for row in outcome.rows)
    assert outcome.best["eval_f1"] == max(row["eval_f1"] for row in outcome.rows)
    best = load_config(FinetuneJobConfig, outcome.best_config)
    assert (
        best.finetune.task == "token_classification" and best.train.learning_rate == outcome.best["train.learning_rate"]
    )


@pytest.mark.slow
def test_predict_writes_entities_with_offsets_from_pytorch_and_from_the_onnx_export(ner, tmp_path):
    """`albert-dist predict` on raw texts writes each text's entities (JSON, character offsets) as the pipeline-
    equivalent `text_entities` finds them; the int8-free ONNX export (`albert-dist export`) predicted with
    `--backend onnx` gives the same entities."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from albert_dist.cli import main

    texts = [text for text, _ in sentences(30, seed=12)] + ["没有实体的句子。", ""]
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), tmp_path / "in.parquet")
    model = AlbertForTokenClassification.from_pretrained(ner.model_dir)
    expected = token_task.text_entities(model, load_tokenizer(ner.model_dir), texts, MAX_LENGTH, 8, precision="fp32")
    assert sum(map(len, expected)) > 40  # the sentences hold entities, and the model finds them

    out = tmp_path / "out.jsonl"
    assert (
        main(
            [
                "predict",
                "--model",
                str(ner.model_dir),
                "--input",
                str(tmp_path / "in.parquet"),
                "--output",
                str(out),
                "--precision",
                "fp32",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [row["id"] for row in rows] == list(range(len(texts)))
    written = [json.loads(row["entities"]) for row in rows]
    assert [[(e["type"], e["start"], e["end"], e["text"]) for e in found] for found in written] == [
        [(e["type"], e["start"], e["end"], e["text"]) for e in found] for found in expected
    ]
    assert all(texts[i][e["start"] : e["end"]] == e["text"] for i, found in enumerate(written) for e in found)

    export = tmp_path / "onnx"
    assert main(["export", "--model", str(ner.model_dir), "--output", str(export)]) == 0
    onnx_out = tmp_path / "onnx.jsonl"
    assert (
        main(
            [
                "predict",
                "--model",
                str(export),
                "--backend",
                "onnx",
                "--input",
                str(tmp_path / "in.parquet"),
                "--output",
                str(onnx_out),
            ]
        )
        == 0
    )
    from_onnx = [json.loads(json.loads(line)["entities"]) for line in onnx_out.read_text(encoding="utf-8").splitlines()]
    assert [[(e["type"], e["start"], e["end"]) for e in found] for found in from_onnx] == [
        [(e["type"], e["start"], e["end"]) for e in found] for found in written
    ]


@pytest.mark.slow
def test_the_runs_mlflow_model_predicts_the_entities(ner, monkeypatch):
    import mlflow.pyfunc
    import pandas as pd

    monkeypatch.setenv("MLFLOW_TRACKING_URI", ner.tracking_uri)  # where `models:/` URIs resolve
    client = MlflowClient(tracking_uri=ner.tracking_uri)
    experiment = client.get_run(ner.run_id).info.experiment_id
    [logged] = client.search_logged_models([experiment], filter_string=f"source_run_id = '{ner.run_id}'")
    texts = [text for text, _ in sentences(8, seed=13)]
    predicted = mlflow.pyfunc.load_model(f"models:/{logged.model_id}").predict(pd.DataFrame({"text": texts}))
    model = AlbertForTokenClassification.from_pretrained(ner.model_dir)
    expected = token_task.text_entities(model, load_tokenizer(ner.model_dir), texts, MAX_LENGTH, 8)
    assert [[(e["type"], e["start"], e["end"]) for e in json.loads(found)] for found in predicted["entities"]] == [
        [(e["type"], e["start"], e["end"]) for e in found] for found in expected
    ]
