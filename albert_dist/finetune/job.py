"""`albert-dist finetune`: the job's declaration (`FINETUNE`, run by `train.job.run_job`). Its plan reads and
tokenizes the task data, derives the schedule from the epochs and links the MLflow run to the source model; the
best dev evaluation's model is published as `<run_dir>/model` (`train.publish: best`), then its dev and test
metrics are computed. `model.init_from` and `run.output_dir` may be URIs (`s3://...`): the model is downloaded to a
local cache (`storage.fetch_dir`), the published model downloaded back for the final metrics.

The helpers here (data preparation, schedule, lineage, final metrics) are shared with distillation.
"""

from __future__ import annotations

import hashlib
import math
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from albert_dist.config import TrainBase, TrainSection
from albert_dist.data import batching
from albert_dist.errors import ConfigError
from albert_dist.finetune import data, entities, inference, qa_data, qa_task, token_data, token_task
from albert_dist.finetune.config import FinetuneJobConfig, TaskDataSection, TaskTrainingSection
from albert_dist.finetune.qa_task import QuestionAnsweringSpec
from albert_dist.finetune.task import ClassificationSpec
from albert_dist.finetune.token_task import TokenClassificationSpec
from albert_dist.model import (
    AlbertForQuestionAnswering,
    AlbertForSequenceClassification,
    AlbertForTokenClassification,
)
from albert_dist.storage import fetch_dir, is_uri, join_location, read_bytes
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tracking import run as tracking
from albert_dist.train.job import JobOutcome, TrainingJob
from albert_dist.train.plan import Plan, base_plan

QA_LABELS = ["start", "end"]  # question answering's two outputs, per position


@dataclass
class TaskData:
    """Encoded splits and the label names (None for regression); for question answering each split's gold
    answers and how answers are decoded and scored (`qa_task.score`'s settings)."""

    splits: dict[str, batching.EncodedSplit]
    label_names: list[str] | None
    gold: dict[str, qa_data.Gold] | None = None
    decoding: dict[str, Any] | None = None

    @property
    def num_labels(self) -> int:
        return len(self.label_names) if self.label_names else 1

    @property
    def eval_rows(self) -> int:
        """What the dev tables are indexed by: dev rows, the dev texts read as windows, or the dev words of token
        classification."""
        dev = self.splits["dev"].arrays
        if "word_index" in dev:
            return int((dev["word_index"] >= 0).sum())
        return int(dev["document"].max()) + 1 if "document" in dev else len(dev["length"])


def prepare_task_data(
    section: TaskDataSection, task: str, tokenizer_dir: str | Path, label_names: list[str] | None = None
) -> TaskData:
    """Read, label and tokenize train/dev(/test); `label_names` fixes the label order (a teacher's)."""
    if task == "token_classification":
        return prepare_tagged_data(section, tokenizer_dir, label_names)
    if task == "question_answering":
        return prepare_question_data(section, tokenizer_dir)
    raw = data.load_splits(section)
    names = None if task == "regression" else label_names or data.label_names(raw["train"], section.labels)
    label2id = {name: i for i, name in enumerate(names or [])}
    tokenizer = load_tokenizer(tokenizer_dir)
    overlap = section.window_overlap if section.long_text == "windows" else None
    splits = {
        name: data.encode_split(
            split,
            tokenizer,
            section.max_seq_length,
            data.label_ids(split, section.label_column, task, label2id),
            overlap,
        )
        for name, split in raw.items()
    }
    return TaskData(splits, names)


def prepare_tagged_data(
    section: TaskDataSection, tokenizer_dir: str | Path, label_names: list[str] | None = None
) -> TaskData:
    """Token classification's splits: tagged sentences read, their tags checked against train's (or the given)
    label set, and cut into windows of pieces."""
    raw = data.load_splits(section, lambda path: token_data.read_tagged(path, section))
    names = label_names or token_data.tag_names(raw["train"], section.labels)
    label2id = {name: i for i, name in enumerate(names)}
    tokenizer = load_tokenizer(tokenizer_dir)
    splits = {
        name: token_data.encode_tagged(
            split, tokenizer, section.max_seq_length, section.window_overlap, token_data.tag_ids(split, label2id)
        )
        for name, split in raw.items()
    }
    return TaskData(splits, names)


def prepare_question_data(section: TaskDataSection, tokenizer_dir: str | Path) -> TaskData:
    """Question answering's splits: questions over contexts cut into windows after their question, with each
    split's gold answers; the metric's language from data.language or the training contexts, and no-answer
    decoding when the training data holds unanswerable questions (SQuAD v2)."""
    raw = data.load_splits(section, qa_data.read_questions)
    tokenizer = load_tokenizer(tokenizer_dir)
    splits = {
        name: qa_data.encode_questions(
            split, tokenizer, section.max_seq_length, section.window_overlap, section.max_question_length
        )
        for name, split in raw.items()
    }
    decoding = {
        "language": qa_data.language_of(raw["train"].contexts) if section.language == "auto" else section.language,
        "max_answer_length": section.max_answer_length,
        "allow_no_answer": raw["train"].has_unanswerable,
    }
    return TaskData(splits, list(QA_LABELS), {name: split.gold() for name, split in raw.items()}, decoding)


def label_overrides(task: str, label_names: list[str] | None) -> dict[str, Any]:
    """config.json fields of the classifier: the label names are saved with the model."""
    if task == "regression":
        return {"num_labels": 1, "problem_type": "regression", "id2label": {0: "score"}, "label2id": {"score": 0}}
    if task == "question_answering":  # transformers' QA head: 2 outputs, no problem type
        return {
            "num_labels": 2,
            "problem_type": None,
            "id2label": dict(enumerate(QA_LABELS)),
            "label2id": {n: i for i, n in enumerate(QA_LABELS)},
        }
    return {
        "num_labels": len(label_names),
        # transformers' token classifiers record no problem type
        "problem_type": None if task == "token_classification" else "single_label_classification",
        "id2label": dict(enumerate(label_names)),
        "label2id": {n: i for i, n in enumerate(label_names)},
    }


def schedule(
    train: TrainBase, finetune: TaskTrainingSection, num_train: int, num_workers: int
) -> tuple[TrainSection, int]:
    """`train` with max_steps from the epochs and warmup_steps = warmup_ratio × max_steps; and the number of
    micro-batches per epoch (global batches of `batch_size × num_workers` rows, the last partial one dropped)."""
    global_batch = train.batch_size * num_workers
    per_epoch = num_train // global_batch
    if per_epoch == 0:
        raise ConfigError(
            f"{num_train} training rows do not fill one global batch of {global_batch} "
            f"(train.batch_size × scaling.num_workers): lower the batch size"
        )
    steps = math.ceil(finetune.epochs * per_epoch / train.grad_accum_steps) if finetune.epochs else train.max_steps
    return TrainSection.model_validate(
        {**train.model_dump(), "max_steps": steps, "warmup_steps": round(finetune.warmup_ratio * steps)}
    ), per_epoch


def source_run_id(model_dir: str | Path) -> str | None:
    """The MLflow run that produced `model_dir` (a local path or a URI): pretraining and fine-tuning record it
    beside the model (`<run_dir>/mlflow_run_id`, model in `<run_dir>/model`)."""
    if is_uri(model_dir):
        split = urllib.parse.urlsplit(str(model_dir))
        parent = urllib.parse.urlunsplit(split._replace(path=split.path.rstrip("/").rpartition("/")[0]))
    else:
        parent = Path(model_dir).parent
    candidates = [join_location(model_dir, tracking.RUN_ID_FILE), join_location(parent, tracking.RUN_ID_FILE)]
    for candidate in candidates:
        try:
            return read_bytes(candidate).decode().strip() or None
        except OSError:  # none there
            continue
    return None


def lineage_tags(source: str | Path) -> dict[str, str]:
    tags = {"albert_dist.source_model": str(source)}
    run_id = source_run_id(source)
    if run_id:
        tags["albert_dist.source_run_id"] = run_id
    return tags


def log_task_data(run: tracking.JobRun, section: TaskDataSection, task_data: TaskData) -> None:
    """The task's data files as the run's datasets (a split held out of train has no file of its own)."""
    files = {"training": (section.train, "train"), "validation": (section.dev, "dev"), "test": (section.test, "test")}
    run.log_datasets(
        [
            (
                context,
                Path(path).name,
                Path(path).resolve(),
                tracking.path_digest(path),
                {"num_rows": len(task_data.splits[split])},
            )
            for context, (path, split) in files.items()
            if path
        ]
    )


def task_data_digest(section: TaskDataSection) -> str:
    """The digest of the task's data files (what a resumed run must still train on)."""
    files = [section.train, section.dev, section.test]
    return hashlib.sha256("\n".join(tracking.path_digest(p) if p else "-" for p in files).encode()).hexdigest()


def encoded_digests(task_data: TaskData) -> dict[str, str]:
    """Each split as tokenized: its rows' token ids, labels and order (what the workers train and evaluate on)."""
    out = {}
    for name, split in task_data.splits.items():
        digest = hashlib.sha256()
        for key in sorted(split.arrays):
            digest.update(key.encode() + split.arrays[key].tobytes())
        out[name] = digest.hexdigest()
    return out


def model_class(task: str) -> type:
    """The transformers-layout head a task trains."""
    heads = {"token_classification": AlbertForTokenClassification, "question_answering": AlbertForQuestionAnswering}
    return heads.get(task, AlbertForSequenceClassification)


def classifier_model(cfg):
    """The MLflow model of a model trained by the job `cfg` (fine-tuning or distillation): it predicts through
    `albert-dist predict`'s Predictor, from `text` and, for pair tasks and readers (the question's context),
    `text_pair`."""
    from albert_dist.finetune.mlflow_model import SequenceClassifierModel

    reads_pairs = cfg.data.text_pair_column is not None or cfg.task == "question_answering"
    return SequenceClassifierModel(pair=reads_pairs)


def classification_spec(
    *,
    init_from: str,
    task_data: TaskData,
    task: str,
    finetune: TaskTrainingSection,
    train: TrainSection,
    data_section: TaskDataSection,
    per_epoch: int,
    seed: int,
    model_overrides: dict[str, Any],
    tokenizer_dir: str | None = None,
    metric: str | None = None,
) -> ClassificationSpec:
    """The workers' task: fine-tune `init_from` (its tokenizer, unless `tokenizer_dir` names another) on
    `task_data` with the job's settings (`train` as `schedule` derived it)."""
    tagged = task == "token_classification"
    extra, kind = {}, ClassificationSpec
    if tagged:
        names = task_data.label_names
        extra, kind = {"label_names": tuple(names), "scheme": entities.scheme_of(names)}, TokenClassificationSpec
    elif task == "question_answering":
        extra, kind = {"gold": task_data.gold["dev"], **task_data.decoding}, QuestionAnsweringSpec
    return kind(
        **extra,
        init_from=init_from,
        tokenizer_dir=tokenizer_dir or init_from,
        task=task,
        num_labels=task_data.num_labels,
        model_overrides=model_overrides,
        metric=metric or finetune.best_metric,
        patience=finetune.early_stopping_patience,
        layer_lr_decay=finetune.layer_lr_decay,
        lr_scales=dict(finetune.lr_scales),
        batch_size=train.batch_size,
        eval_batch_size=finetune.eval_batch_size,
        grad_accum_steps=train.grad_accum_steps,
        micro_batches_per_epoch=per_epoch,
        eval_rows=task_data.eval_rows,
        seed=seed,
        pad_to_multiple_of=data_section.pad_to_multiple_of,
        group_by_length=data_section.group_by_length,
        max_seq_length=data_section.max_seq_length,
        window_overlap=data_section.window_overlap
        if tagged or task == "question_answering" or data_section.long_text == "windows"
        else None,
    )


def task_datasets(task_data: TaskData) -> dict[str, Any]:
    """The train and dev splits as Ray datasets (made once Ray runs)."""
    return {name: data.to_ray_dataset(task_data.splits[name]) for name in ("train", "dev")}


def final_metrics(model_dir: str | Path, task_data: TaskData, task: str, cfg) -> dict[str, float]:
    """`dev_*` and `test_*` metrics of the published model, computed in the driver on the whole splits."""
    model = model_class(task).from_pretrained(model_dir)
    settings = {
        "batch_size": cfg.finetune.eval_batch_size,
        "pad_to_multiple_of": cfg.data.pad_to_multiple_of,
        "precision": cfg.train.precision,
    }
    out = {}
    for split in ("dev", "test"):
        if split in task_data.splits:
            if task == "token_classification":
                names = task_data.label_names
                values = token_task.evaluate_tokens(
                    model, task_data.splits[split], names, entities.scheme_of(names), **settings
                )
            elif task == "question_answering":
                values = qa_task.evaluate_questions(
                    model, task_data.splits[split], task_data.gold[split], task_data.decoding, **settings
                )
            else:
                values = inference.evaluate(model, task_data.splits[split], task=task, **settings)
            out.update({f"{split}_{k}": v for k, v in values.items()})
    return out


def plan(cfg: FinetuneJobConfig) -> Plan:
    """Read and tokenize the task data, derive the schedule from the epochs: the run's plan."""
    init_from = cfg.model.init_from
    if not init_from:
        raise ConfigError("model.init_from is not set: give the pretrained model directory")
    task = cfg.finetune.task
    task_data = prepare_task_data(cfg.data, task, fetch_dir(init_from))
    train, per_epoch = schedule(cfg.train, cfg.finetune, len(task_data.splits["train"]), cfg.scaling.num_workers)
    sizes = {f"data.{name}_rows": len(split) for name, split in task_data.splits.items()}
    overrides = {**label_overrides(task, task_data.label_names), **cfg.model.overrides()}
    spec = classification_spec(
        init_from=str(init_from),
        task_data=task_data,
        task=task,
        finetune=cfg.finetune,
        train=train,
        data_section=cfg.data,
        per_epoch=per_epoch,
        seed=cfg.run.seed,
        model_overrides=overrides,
    )
    rows = ", ".join(f"{len(split)} {name}" for name, split in task_data.splits.items())
    return base_plan(
        cfg,
        task=spec,
        train=train,
        data_digest=task_data_digest(cfg.data),
        datasets=lambda: task_datasets(task_data),
        tags=lineage_tags(init_from),
        label_names=task_data.label_names,
        inputs=encoded_digests(task_data),
        params={
            **sizes,
            "train.derived_max_steps": train.max_steps,
            "train.derived_warmup_steps": train.warmup_steps,
            "labels": ",".join(task_data.label_names or []),
        },
        stage=lambda run: log_task_data(run, cfg.data, task_data),
        banner=[
            f"fine-tuning {init_from} for {task} ({task_data.num_labels} output(s)) on {rows} rows"
            f"{' (windows)' if task in ('token_classification', 'question_answering') else ''}, "
            f"{train.max_steps} steps on {cfg.scaling.num_workers} worker(s)"
        ],
        evaluate=lambda model_dir: final_metrics(model_dir, task_data, task, cfg),
        driver={"eval_batch_size": cfg.finetune.eval_batch_size, "precision": cfg.train.precision},
    )


def _summary(cfg: FinetuneJobConfig, outcome: JobOutcome) -> list[str]:
    m = outcome.train_metrics
    stopped = " (stopped early)" if m.get("stopped_early") else ""
    final = {k: v for k, v in outcome.metrics.items() if k.startswith(("dev_", "test_"))}
    return [
        f"done: step {m.get('step')}{stopped}; best model by dev {cfg.finetune.best_metric}:",
        "  " + " | ".join(f"{k} {v:.4f}" for k, v in final.items()),
        f"model: {outcome.model_dir}",
    ]


FINETUNE = TrainingJob("finetune", plan, classifier_model, _summary, "finetuned")
