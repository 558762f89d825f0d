"""Fine-tuning, distillation and prediction end to end: real Ray Train workers, a real SentencePiece model, a
SQLite MLflow store. One fine-tuned classifier (module fixture) is checked, reloaded in transformers, used for
prediction and distilled."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from finetune_helpers import (
    KEYWORDS,
    POSITIVE,
    count_rows,
    pair_rows,
    sentence,
    single_rows,
    tiny_model_dir,
    write_csv,
    write_jsonl,
)

from albert_dist.config import TrainSection
from albert_dist.data import batching
from albert_dist.errors import DataError
from albert_dist.finetune import data, inference
from albert_dist.finetune.config import DistillJobConfig, FinetuneJobConfig
from albert_dist.finetune.distill import DISTILL, PROJECTION_FILE
from albert_dist.finetune.job import FINETUNE, prepare_task_data
from albert_dist.finetune.predict import run_predict
from albert_dist.tokenizer.training import train_sentencepiece
from albert_dist.train.loop import Trainer, WorkerEnv

FAST_TRAIN = {
    "precision": "fp32",
    "learning_rate": 1e-3,
    "batch_size": 16,
    "eval_every": 32,
    "log_every": 16,
    "checkpoint_every": 1000,
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, stdlib_corpus):
    root = tmp_path_factory.mktemp("finetune")
    train_sentencepiece(stdlib_corpus, root / "tokenizer", 600, progress=lambda _: None)
    pretrain_run = root / "pretrain_run"  # the layout pretraining writes: <run_dir>/mlflow_run_id, <run_dir>/model
    tiny_model_dir(pretrain_run / "model", root / "tokenizer")
    (pretrain_run / "mlflow_run_id").write_text("pretrain-run-0123")
    write_csv(root / "train.csv", single_rows(512, seed=1))
    write_jsonl(root / "dev.jsonl", single_rows(128, seed=2))
    return root


def finetune_config(root, **sections) -> FinetuneJobConfig:
    raw = {
        "run": {"name": "classify", "output_dir": str(root / "runs")},
        "model": {"init_from": str(root / "pretrain_run" / "model")},
        "data": {"train": str(root / "train.csv"), "dev": str(root / "dev.jsonl"), "max_seq_length": 32},
        "finetune": {"epochs": 4, "warmup_ratio": 0.1},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "train": FAST_TRAIN,
        "tracking": {"tracking_uri": f"sqlite:///{root}/mlflow.db"},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return FinetuneJobConfig.model_validate(raw)


@pytest.fixture(scope="module")
def classifier(workspace, ray_session):
    return FINETUNE.run(finetune_config(workspace))


@pytest.mark.slow
def test_finetuning_on_ray_beats_majority_baseline(classifier):
    majority = 0.5  # the dev set is balanced
    assert classifier.metrics["dev_accuracy"] >= majority + 0.3
    assert classifier.metrics["dev_mcc"] > 0.5
    config = json.loads((classifier.model_dir / "config.json").read_text())
    assert config["id2label"] == {"0": "no", "1": "yes"} and config["label2id"] == {"no": 0, "yes": 1}
    assert (classifier.model_dir / "spiece.model").is_file()


@pytest.mark.slow
def test_mlflow_run_holds_metrics_model_and_lineage(classifier, workspace):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=classifier.tracking_uri)
    run = client.get_run(classifier.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["albert_dist.source_model"] == str(workspace / "pretrain_run" / "model")
    assert run.data.tags["albert_dist.source_run_id"] == "pretrain-run-0123"
    assert {"eval_accuracy", "eval_f1", "eval_mcc", "loss", "dev_accuracy"} <= set(run.data.metrics)
    assert run.data.metrics["model_tflops"] > 0  # FLOPs from the model, as pretraining reports them
    assert len(client.get_metric_history(classifier.run_id, "eval_accuracy")) >= 4  # every 32 steps + epoch ends
    artifacts = {a.path for a in client.list_artifacts(classifier.run_id, "model")}
    assert {"model/config.json", "model/model.safetensors", "model/spiece.model"} <= artifacts


@pytest.mark.slow
def test_checkpoint_loads_in_transformers_with_same_predictions(classifier, workspace):
    import transformers

    from albert_dist.model import AlbertForSequenceClassification

    theirs = transformers.AlbertForSequenceClassification.from_pretrained(str(classifier.model_dir)).eval()
    ours = AlbertForSequenceClassification.from_pretrained(classifier.model_dir)
    dev = prepare_task_data(
        finetune_config(workspace).data, "classification", classifier.model_dir, label_names=["no", "yes"]
    ).splits["dev"]
    batch = next(batching.batches(dev, 64, 8))
    with torch.no_grad():
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        theirs_labels = theirs(**inputs).logits.argmax(-1)
        ours_labels = ours(**inputs).logits.argmax(-1)
    assert torch.equal(theirs_labels, ours_labels)
    assert theirs.config.id2label == {0: "no", 1: "yes"}


@pytest.mark.slow
@pytest.mark.parametrize("suffix, threshold", [(".csv", 10_000), (".parquet", 0)])
def test_predict_writes_labels_and_probabilities(classifier, workspace, tmp_path, suffix, threshold):
    rows = single_rows(40, seed=3)
    source = write_jsonl(tmp_path / "input.jsonl", [{"id": i, **r} for i, r in enumerate(rows)])
    target = tmp_path / f"out{suffix}"
    assert (
        run_predict(
            classifier.model_dir,
            source,
            target,
            text_column="text",
            batch_size=16,
            actor_threshold=threshold,
            num_actors=1,
        )
        == 40
    )  # threshold 0: Ray Data actor pool
    table = data.read_table(target).to_pydict()
    assert table["id"] == list(range(40)) and table["label"] == [r["label"] for r in rows]  # order, columns kept
    probs = np.array([table["prob_no"], table["prob_yes"]]).T
    assert np.allclose(probs.sum(1), 1.0, atol=1e-5)
    assert table["predicted_label"] == [["no", "yes"][i] for i in probs.argmax(1)]
    assert np.mean([p == r["label"] for p, r in zip(table["predicted_label"], rows)]) >= 0.8
    assert inference.saved_max_seq_length(classifier.model_dir) == 32  # data.max_seq_length of the fine-tuning
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


@pytest.mark.slow
def test_predict_bad_input(classifier, tmp_path):
    source = write_csv(tmp_path / "input.csv", [{"sentence": "a socket"}])
    with pytest.raises(DataError, match=r"input\.csv.*'text'"):
        run_predict(classifier.model_dir, source, tmp_path / "out.csv")
    with pytest.raises(DataError, match=r"not found.*nope\.csv"):
        run_predict(classifier.model_dir, tmp_path / "nope.csv", tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists()


def test_unknown_dev_label_fails_before_training(workspace, tmp_path, ray_session):
    write_csv(tmp_path / "dev.csv", [{"text": "a socket", "label": "yes"}, {"text": "an archive", "label": "maybe"}])
    cfg = finetune_config(workspace, data={"dev": str(tmp_path / "dev.csv")}, run={"name": "bad"})
    with pytest.raises(DataError, match=r"dev\.csv.*unknown label 'maybe'.*'label'"):
        FINETUNE.run(cfg)


def test_a_finetune_interrupted_before_training_ends_its_mlflow_run_killed(
    workspace, tmp_path, ray_session, monkeypatch
):
    from mlflow.tracking import MlflowClient

    def interrupted(split):
        raise KeyboardInterrupt  # Ctrl-C while the driver hands the data to Ray, after the run was opened

    monkeypatch.setattr(data, "to_ray_dataset", interrupted)
    cfg = finetune_config(workspace, run={"name": "interrupted", "output_dir": str(tmp_path)})
    with pytest.raises(KeyboardInterrupt):
        FINETUNE.run(cfg)
    run_id = (cfg.run.run_dir / "mlflow_run_id").read_text()
    run = MlflowClient(tracking_uri=cfg.tracking.tracking_uri).get_run(run_id)
    assert run.info.status == "KILLED"  # stopped by the user
    assert run.data.params["labels"] == "no,yes" and run.data.tags["albert_dist.job"] == "finetune"


def distill_config(workspace: Path, classifier, name: str) -> DistillJobConfig:
    """The classifier distilled into a one-layer student on 2 workers."""
    return DistillJobConfig.model_validate(
        {
            "run": {"name": name, "output_dir": str(workspace / "runs")},
            "distill": {
                "teacher": str(classifier.model_dir),
                "temperature": 2.0,
                "alpha": 0.5,
                "hidden_weight": 0.1,
                "speed_repeats": 10,
            },
            # the teacher's hidden size kept: the student starts from the teacher's shared layer group, applied once
            "student": {"num_hidden_layers": 1},
            "data": {"train": str(workspace / "train.csv"), "dev": str(workspace / "dev.jsonl"), "max_seq_length": 32},
            "finetune": {"epochs": 4},
            "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
            "train": {**FAST_TRAIN, "batch_size": 16, "learning_rate": 2e-3},
            "tracking": {"tracking_uri": f"sqlite:///{workspace}/mlflow.db"},
        }
    )


@pytest.fixture(scope="module")
def distilled(classifier, workspace, ray_session):
    return DISTILL.run(distill_config(workspace, classifier, "distill"))


@pytest.mark.slow
def test_distilled_student_keeps_teacher_accuracy(classifier, distilled):
    outcome = distilled
    m = outcome.metrics
    assert m["student_dev_accuracy"] >= 0.95 * m["teacher_dev_accuracy"]
    assert m["student_share_of_teacher"] >= 0.95
    # ALBERT shares its layers: half the layers is the same parameter count, but less compute (the speedup itself is
    # timed, hence measured in benchmarks/bench_distill.py, not asserted here)
    assert m["student_parameters"] == m["teacher_parameters"] and 0.5 < m["student_flops_share"] < 0.9
    assert json.loads((outcome.model_dir / "config.json").read_text())["num_hidden_layers"] == 1
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=outcome.tracking_uri).get_run(outcome.run_id)
    assert {"speedup", "student_flops_share", "teacher_dev_accuracy", "student_dev_accuracy"} <= set(run.data.metrics)
    assert run.data.metrics["model_tflops"] > 0
    assert run.data.tags["albert_dist.source_model"] == str(classifier.model_dir)


@pytest.mark.slow
def test_projection_stays_out_of_the_student_checkpoint(classifier, tmp_path):
    from safetensors import safe_open

    from albert_dist.finetune.distill import DistillationModel, DistillationSpec, DistillationTask, build_student
    from albert_dist.finetune.job import classification_spec
    from albert_dist.model import AlbertForSequenceClassification

    teacher = AlbertForSequenceClassification.from_pretrained(classifier.model_dir)
    cfg = DistillJobConfig.model_validate(
        {"student": {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64}}
    )
    student = build_student(teacher, cfg)
    assert torch.equal(
        student.albert.embeddings.word_embeddings.weight, teacher.albert.embeddings.word_embeddings.weight
    )
    model = DistillationModel(student, teacher, match_hidden=True)
    job_cfg = finetune_config(classifier.model_dir.parents[2])
    task_data = prepare_task_data(job_cfg.data, "classification", classifier.model_dir, label_names=["no", "yes"])
    batch = next(batching.batches(task_data.splits["dev"], 4, 8))
    _, _, hidden = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    hidden.backward()
    assert model.projection.weight.grad is not None and teacher.classifier.weight.grad is None
    model.gradient_checkpointing = True  # train.activation_checkpointing: the student's layers are recomputed
    assert student.gradient_checkpointing and not teacher.gradient_checkpointing
    student_task = classification_spec(
        init_from=str(classifier.model_dir),
        task_data=task_data,
        task="classification",
        finetune=job_cfg.finetune,
        train=job_cfg.train,
        data_section=job_cfg.data,
        per_epoch=1,
        seed=0,
        model_overrides={},
    )
    spec = DistillationSpec(
        student_task, teacher_dir=str(classifier.model_dir), temperature=2.0, alpha=0.5, hidden_weight=1.0
    )
    task = spec.build(rank=0, world_size=1, dataset=lambda split: None)
    assert isinstance(task, DistillationTask)
    # a distillation step trains the student and runs the teacher forward: FLOPs of both, the teacher's a third
    assert task.flops_per_token(model) == student.flops_per_token(32) + teacher.flops_per_token(32) / 3
    task.save_model(model, tmp_path)  # the model as it is published
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if "projection" in k or k.startswith("teacher")]
    assert not (tmp_path / PROJECTION_FILE).exists()
    task.save_training_only(model, tmp_path)  # beside it in a checkpoint, for exact resume
    assert (tmp_path / PROJECTION_FILE).is_file()
    reloaded = DistillationModel(build_student(teacher, cfg), teacher, match_hidden=True)
    task.load_weights(reloaded, tmp_path)
    assert torch.equal(reloaded.projection.weight, model.projection.weight)


def in_process_task(workspace, rows, task, tmp_path, **data_section):
    """A fine-tuning task trained by the loop in this process (no Ray Train), on Ray datasets."""
    return in_process_trainer(workspace, rows, task, tmp_path, **data_section).fit()


def in_process_trainer(workspace, rows, task, tmp_path, **data_section) -> Trainer:
    from albert_dist.finetune.config import FinetuneSection, TaskDataSection
    from albert_dist.finetune.job import classification_spec, label_overrides, schedule

    write_csv(tmp_path / "all.csv", rows)
    section = TaskDataSection(train=str(tmp_path / "all.csv"), max_seq_length=48, dev_fraction=0.2, **data_section)
    model_dir = workspace / "pretrain_run" / "model"
    task_data = prepare_task_data(section, task, model_dir)
    ft = FinetuneSection(task=task, epochs=5)
    train, per_epoch = schedule(
        TrainSection(optimizer="adamw", **FAST_TRAIN, warmup_steps=0), ft, len(task_data.splits["train"]), 1
    )
    spec = classification_spec(
        init_from=str(model_dir),
        task_data=task_data,
        task=task,
        finetune=ft,
        train=train,
        data_section=section,
        per_epoch=per_epoch,
        seed=0,
        model_overrides=label_overrides(task, task_data.label_names),
    )
    datasets = {name: data.to_ray_dataset(task_data.splits[name]) for name in ("train", "dev")}
    task = spec.build(rank=0, world_size=1, dataset=datasets.__getitem__)
    return Trainer(task, train, WorkerEnv(print_fn=lambda _: None))


@pytest.mark.slow
def test_regression_reaches_high_correlation(workspace, tmp_path, ray_session):
    rows = [{"text": r["text"], "label": r["score"]} for r in count_rows(400, seed=4)]
    metrics = in_process_task(workspace, rows, "regression", tmp_path)
    assert metrics["eval_pearson"] > 0.8 and metrics["eval_spearman"] > 0.8


@pytest.mark.slow
def test_pair_classification_learns(workspace, tmp_path, ray_session):
    rows = pair_rows(400, seed=5)
    metrics = in_process_task(
        workspace, rows, "classification", tmp_path, text_column="sentence1", text_pair_column="sentence2"
    )
    assert metrics["eval_accuracy"] > 0.7


@pytest.mark.slow
def test_length_grouped_batches_pad_less_and_learn_as_well(workspace, tmp_path, ray_session):
    """Texts of 3 to 31 words: grouped batches are narrower than random ones, and the dev accuracy is the same
    within noise (the grouped order, drawn from the seed and the epoch only, is also what resume replays)."""
    rng = random.Random(6)
    rows = [
        {
            "text": sentence(rng, [rng.choice(POSITIVE if i % 2 else KEYWORDS[2:])], rng.randint(2, 30)),
            "label": "yes" if i % 2 else "no",
        }
        for i in range(400)
    ]
    results = {}
    for grouped in (True, False):
        trainer = in_process_trainer(workspace, rows, "classification", tmp_path, group_by_length=grouped)
        widths = [batch["input_ids"].shape[1] for batch in trainer.task.train_batches(0)]
        assert [len(b["label"]) for b in trainer.task.train_batches(0)] == [16] * len(widths)
        results[grouped] = (np.mean(widths), trainer.fit()["eval_accuracy"])
    (grouped_width, grouped_accuracy), (random_width, random_accuracy) = results[True], results[False]
    assert grouped_width < 0.75 * random_width
    assert grouped_accuracy > 0.8 and abs(grouped_accuracy - random_accuracy) <= 0.1


def dev_metrics(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if "dev_" in k}


@pytest.mark.slow
def test_same_seed_same_machine_same_dev_metrics(classifier, distilled, workspace, ray_session):
    """Fine-tuning and distilling again with the fixtures' configs (other run names): the same dev
    metrics to the last bit (the precision is fp32; `auto` could pick bf16 on other CPUs, not between two runs)."""
    again = FINETUNE.run(finetune_config(workspace, run={"name": "classify-again"}))
    assert dev_metrics(classifier.metrics) and dev_metrics(again.metrics) == dev_metrics(classifier.metrics)

    # distilling again (2 workers, as the fixture did)
    distilled_again = DISTILL.run(distill_config(workspace, classifier, "distill-again")).metrics
    assert "student_dev_accuracy" in distilled_again
    assert dev_metrics(distilled_again) == dev_metrics(distilled.metrics)


def test_the_precision_used_is_explained(monkeypatch):
    """What the demo's summary prints: `auto` depends on the CPU, hence results may differ between CPUs."""
    from albert_dist.train import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert precision.explain_precision("auto", False).startswith("bf16 (train.precision=auto: this CPU has native")
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert precision.explain_precision("auto", False).startswith("fp32 (train.precision=auto: this CPU has no native")
    assert precision.explain_precision("fp32", False) == "fp32 (set by train.precision)"


@pytest.mark.slow
def test_long_texts_read_as_windows_find_what_truncation_cuts_off(workspace, tmp_path, ray_session):
    """The label's keyword ends a text three times the model's length: cut at that length, the text tells the
    classifier nothing; read whole as windows (their logits averaged), it is learned."""
    from finetune_helpers import FILLER

    rng = random.Random(6)
    rows = []
    for i in range(300):
        positive = i % 2 == 0
        filler = " ".join(rng.choice(FILLER) for _ in range(60))
        rows.append(
            {
                "text": f"{filler} {rng.choice(POSITIVE if positive else KEYWORDS[2:])}",
                "label": "yes" if positive else "no",
            }
        )
    (tmp_path / "cut").mkdir()
    (tmp_path / "whole").mkdir()
    truncated = in_process_task(workspace, rows, "classification", tmp_path / "cut")
    windows = in_process_task(workspace, rows, "classification", tmp_path / "whole", long_text="windows")
    assert truncated["eval_accuracy"] < 0.65 and windows["eval_accuracy"] > 0.85, (truncated, windows)
