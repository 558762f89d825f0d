"""Job configs of `albert-dist finetune` and `albert-dist distill`, composed of the shared sections."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from albert_dist.config import (
    Section,
    TrainBase,
    TrainingJobConfig,
    TrainingRunSection,
    local_path,
    without_credentials,
)
from albert_dist.errors import ConfigError
from albert_dist.model.checkpoint import load_config
from albert_dist.model.modeling import head_task
from albert_dist.model.sections import PretrainedModelSection
from albert_dist.storage import is_uri

LR_GROUP = re.compile(r"^(embeddings|head|group\d+)$")
# the dev metrics each task kind reports, its default for picking the best model first
TASK_METRICS = {
    "classification": ("accuracy", "f1", "mcc", "loss"),
    "regression": ("pearson", "spearman", "loss"),
    "token_classification": ("f1", "precision", "recall", "accuracy", "loss"),
    "question_answering": ("f1", "exact_match", "loss"),
}


class FinetuneTrainSection(TrainBase):
    """The loop's settings with google's GLUE recipe as defaults (AdamW, lr in 1e-5..5e-5), so that a partial
    `train:` section in YAML keeps them. The warmup is finetune.warmup_ratio of the steps, which are
    finetune.epochs or, with epochs empty, max_steps; the dev set is evaluated whole."""

    key_hints = {
        "warmup_steps": "fine-tuning warms up for finetune.warmup_ratio of the steps",
        "eval_batches": "fine-tuning evaluates the whole dev set, in batches of finetune.eval_batch_size",
    }

    max_steps: int | None = Field(None, gt=0, description="The number of steps when finetune.epochs is empty.")
    optimizer: Literal["lamb", "adamw"] = "adamw"
    learning_rate: float = Field(3e-5, gt=0)
    batch_size: int = Field(32, gt=0, description="Per worker, per micro-batch.")
    log_every: int = Field(20, gt=0)
    eval_every: int = Field(100, gt=0)
    checkpoint_every: int = Field(500, gt=0)


class TaskDataSection(Section):
    """Labelled text in CSV, TSV, JSONL or Parquet. Without a dev (test) file, a seeded share of train is held out."""

    train: str | None = Field(
        None,
        description="Training file: a path or a URI (s3://bucket/train.csv, gs://...; "
        "credentials from the environment).",
    )
    dev: str | None = Field(None, description="Dev file; when empty, dev_fraction of train is held out.")
    test: str | None = Field(None, description="Test file; when empty and test_fraction > 0, held out of train.")
    format: Literal["auto", "csv", "tsv", "jsonl", "parquet", "conll", "cluener", "cluewsc"] = Field(
        "auto",
        description="auto: from the extension. cluewsc: CLUEWSC2020's JSON lines, each text classified with its "
        "target's noun between underscores and pronoun between brackets, as CLUE's baselines. Token "
        "classification reads conll (token<TAB>tag lines), cluener "
        "(CLUENER2020 JSON lines) and jsonl/parquet rows of data.tokens_column and data.tags_column. Question "
        "answering reads SQuAD's JSON layout (SQuAD v1/v2, CMRC2018) or JSON lines of flat records, whatever this "
        "says.",
    )
    text_column: str = "text"
    text_pair_column: str | None = Field(None, description="Second text of pair tasks (LCQMC, MRPC).")
    label_column: str = "label"
    labels: list[str] | None = Field(None, description="Label names in id order; default: sorted train labels.")
    drop_labels: list[str] = Field(
        default_factory=list,
        description="Rows with one of these labels are left out of every split (OCNLI and CMNLI mark the pairs "
        "their annotators disagreed on with '-').",
    )
    dev_fraction: float = Field(0.1, gt=0, lt=1)
    test_fraction: float = Field(0.0, ge=0, lt=1)
    split_seed: int = 12345
    tokens_column: str = Field("tokens", description="Token classification: the column of word lists.")
    tags_column: str = Field("tags", description="Token classification: the column of tag lists (BIO, BIOES, BMES).")
    max_seq_length: int = Field(128, ge=8, le=8192)
    long_text: Literal["truncate", "windows"] = Field(
        "truncate",
        description="Classification and regression of texts longer than max_seq_length: truncate them, or read "
        "them whole as overlapping windows (each trains with the text's label; a text's prediction is the mean of "
        "its windows' logits). Single texts only. Token classification always reads windows.",
    )
    doc_stride: int | None = Field(
        None,
        ge=0,
        description="Pieces that consecutive windows of a long text share (empty: a quarter of max_seq_length); "
        "in token classification each word is scored by the window where it has the most context; in question "
        "answering each context is read in windows after its question, an answer decoded from any of them.",
    )
    max_question_length: int = Field(
        64, ge=1, description="Question answering: a question's pieces beyond this many are cut (run_qa's cap)."
    )
    max_answer_length: int = Field(
        30, ge=1, description="Question answering: the longest answer decoded, in pieces (run_qa's default)."
    )
    language: Literal["auto", "zh", "en"] = Field(
        "auto",
        description="Question answering: which exact match and F1 score the answers: zh (CMRC2018's: characters, "
        "punctuation removed, F1 from the longest common substring) or en (SQuAD's: normalized whitespace words); "
        "auto: zh when most of the training contexts' characters are CJK.",
    )
    pad_to_multiple_of: int = Field(8, ge=1)
    group_by_length: bool = Field(
        True,
        description="Training batches of rows of similar length (seeded mega-batches "
        "sorted by length, as transformers' group_by_length): less "
        "padding; false: plain random batches.",
    )

    _files_without_secrets = field_validator("train", "dev", "test")(
        classmethod(lambda cls, value: without_credentials(value))
    )

    @property
    def window_overlap(self) -> int:
        return self.max_seq_length // 4 if self.doc_stride is None else self.doc_stride

    @model_validator(mode="after")
    def _windows_read_single_texts(self) -> TaskDataSection:
        if self.long_text == "windows" and self.text_pair_column:
            raise ValueError("long_text: windows reads single texts; a pair task (text_pair_column) is truncated")
        return self

    @model_validator(mode="after")
    def _stride_fits_window(self) -> TaskDataSection:
        if self.doc_stride is not None and self.doc_stride >= self.max_seq_length - 2:
            raise ValueError(
                f"doc_stride {self.doc_stride} must be below max_seq_length - 2 ({self.max_seq_length - 2}): "
                "windows would not advance"
            )
        return self


class TaskTrainingSection(Section):
    """What fine-tuning and distillation add to the training loop: epochs, ALBERT-aware learning rates, early
    stopping; distillation's `finetune:` (its task is its teacher's).

    Learning-rate scales multiply `train.learning_rate` per parameter group: `head` (classifier + pooler),
    `group0..group{G-1}` (ALBERT's shared layer groups) and `embeddings` (incl. the E→H mapping). With
    `layer_lr_decay` d: head ×1, last group ×d, …, group0 ×d^G, embeddings ×d^(G+1). `lr_scales` overrides
    single groups; 0 freezes one.
    """

    key_hints = {"task": "distillation's task is its teacher's"}

    epochs: float | None = Field(3.0, gt=0, description="Sets the number of steps; empty: train.max_steps does.")
    warmup_ratio: float = Field(0.1, ge=0, le=1, description="Share of the steps warming up (sets warmup_steps).")
    layer_lr_decay: float = Field(1.0, gt=0, le=1)
    lr_scales: dict[str, float] = Field(default_factory=dict)
    metric: (
        Literal["accuracy", "f1", "mcc", "pearson", "spearman", "precision", "recall", "exact_match", "loss"] | None
    ) = Field(
        None,
        description="Dev metric for the best model and early stopping (by default accuracy for classification, "
        "pearson for regression, entity-level f1 for token classification, answer f1 for question answering).",
    )
    early_stopping_patience: int | None = Field(None, ge=1, description="Evaluations without improvement.")
    eval_batch_size: int = Field(64, gt=0)

    @field_validator("lr_scales")
    @classmethod
    def _known_groups(cls, scales: dict[str, float]) -> dict[str, float]:
        for name, scale in scales.items():
            if not LR_GROUP.match(name):
                raise ValueError(f"unknown parameter group {name!r}: use embeddings, group<k> or head")
            if scale < 0:
                raise ValueError(f"lr scale of {name} must be >= 0, got {scale}")
        return scales


def metric_for(task: str, metric: str | None) -> str:
    """The dev metric that picks the best model of a `task`: `metric`, else the task's default."""
    if (metric or "loss") not in TASK_METRICS[task]:
        raise ConfigError(f"metric {metric} does not apply to {task}; use one of {', '.join(TASK_METRICS[task])}")
    return metric or TASK_METRICS[task][0]


class FinetuneSection(TaskTrainingSection):
    """Fine-tuning's `finetune:`: the task kind too."""

    task: Literal["classification", "regression", "token_classification", "question_answering"] = Field(
        "classification",
        description="classification (sentences or pairs), regression, token_classification (NER: a tag per "
        "word, scored by entity-level precision, recall and F1 as seqeval's strict mode) or question_answering "
        "(extractive reading comprehension: an answer span of the context, scored by exact match and F1).",
    )

    @model_validator(mode="after")
    def _metric_fits_task(self) -> FinetuneSection:
        metric_for(self.task, self.metric)
        return self

    @property
    def best_metric(self) -> str:
        return metric_for(self.task, self.metric)


def _one_training_length(config: TrainingJobConfig) -> TrainingJobConfig:
    """Fine-tuning's and distillation's training length is finetune.epochs or train.max_steps."""
    if (config.finetune.epochs is None) == (config.train.max_steps is None):
        raise ValueError(
            "give the training length once: finetune.epochs, or train.max_steps with finetune.epochs empty (null)"
        )
    return config


class FinetuneModelSection(PretrainedModelSection):
    """Fine-tuning's `model:`: init_from may be a URI (a model pretrain published to s3://, gs://), downloaded to
    a local cache before it is loaded."""

    init_from: str | None = Field(
        None,
        description="A model directory (ours or transformers') to start from, the URI of one pretrain "
        "published (s3://bucket/runs/name/model), or a Hugging Face Hub id (org/name[@revision]).",
    )

    _local_init_from = field_validator("init_from")(classmethod(lambda cls, value: without_credentials(value)))


class FinetuneJobConfig(TrainingJobConfig):
    """`albert-dist finetune`: `model.init_from` is the pretrained model directory (ours or transformers')."""

    run: TrainingRunSection = Field(default_factory=lambda: TrainingRunSection(name="finetune"))
    model: FinetuneModelSection = Field(default_factory=FinetuneModelSection)
    data: TaskDataSection = Field(default_factory=TaskDataSection)
    finetune: FinetuneSection = Field(default_factory=FinetuneSection)
    train: FinetuneTrainSection = Field(default_factory=FinetuneTrainSection)

    _one_training_length = model_validator(mode="after")(_one_training_length)

    @property
    def task(self) -> str:
        return self.finetune.task

    @property
    def best_metric(self) -> str:
        return self.finetune.best_metric


class StudentSection(Section):
    """The student: the teacher's config with these fields changed (empty ones keep the teacher's value, except
    num_hidden_layers: 4), or, with `init_from`, a separately pretrained smaller ALBERT as it is."""

    init_from: str | None = Field(
        None,
        description="A pretrained ALBERT directory or Hugging Face Hub id with the teacher's vocabulary "
        "(e.g. voidful/albert_chinese_tiny for an albert_chinese_base "
        "teacher): the student starts from it, in its own shape.",
    )
    num_hidden_layers: int | None = Field(None, gt=0, description="Empty: 4.")
    hidden_size: int | None = Field(None, gt=0)
    num_attention_heads: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)
    init_from_teacher: bool | None = Field(
        None,
        description="Copy every teacher weight whose name and shape fit: "
        "with the hidden size kept that is all of them (same "
        "shared groups, fewer layers); otherwise the "
        "embeddings. Empty: yes, unless init_from is set.",
    )

    _local_init_from = field_validator("init_from")(classmethod(lambda cls, value: local_path(value)))

    @model_validator(mode="after")
    def _one_source(self) -> StudentSection:
        if self.init_from:
            clashing = sorted(self.overrides()) + (["init_from_teacher"] if self.init_from_teacher else [])
            if clashing:
                raise ValueError(
                    f"{', '.join(clashing)} cannot be set with init_from: the student is {self.init_from} as it is"
                )
        return self

    def overrides(self) -> dict[str, int]:
        shape = self.model_dump(exclude={"init_from", "init_from_teacher"})
        return {k: v for k, v in shape.items() if v is not None}


class DistillSection(Section):
    """loss = alpha·T²·KL(student/T ‖ teacher/T) + (1−alpha)·CE(labels) + hidden_weight·MSE(hidden states)."""

    teacher: str | None = Field(
        None, description="The fine-tuned teacher's model directory, or its Hugging Face Hub id (org/name[@revision])."
    )
    temperature: float = Field(2.0, gt=0)
    alpha: float = Field(0.5, ge=0, le=1)
    hidden_weight: float = Field(0.0, ge=0, description="beta: weight of the hidden-state MSE; 0 disables it.")
    speed_batch_size: int = Field(32, gt=0, description="Batch of the teacher/student speed measurement.")
    speed_repeats: int = Field(20, gt=0)

    _local_teacher = field_validator("teacher")(classmethod(lambda cls, value: local_path(value)))


class DistillJobConfig(TrainingJobConfig):
    """`albert-dist distill`: the teacher's dir carries the tokenizer and the label names."""

    run: TrainingRunSection = Field(default_factory=lambda: TrainingRunSection(name="distill"))
    data: TaskDataSection = Field(default_factory=TaskDataSection)
    finetune: TaskTrainingSection = Field(default_factory=TaskTrainingSection)
    distill: DistillSection = Field(default_factory=DistillSection)
    student: StudentSection = Field(default_factory=StudentSection)
    # a student trained mostly on soft targets takes a larger learning rate than fine-tuning
    train: FinetuneTrainSection = Field(default_factory=lambda: FinetuneTrainSection(learning_rate=1e-4))

    _one_training_length = model_validator(mode="after")(_one_training_length)

    @property
    def task(self) -> str:
        """The teacher's: what it was fine-tuned for, from its config.json's architectures."""
        if not self.distill.teacher:
            raise ConfigError("distill.teacher is not set: give the fine-tuned teacher's model directory")
        return head_task(load_config(self.distill.teacher))

    @property
    def best_metric(self) -> str:
        """finetune.metric, else the default of the teacher's task (entity F1 for NER, answer F1 for a reader,
        accuracy for a classifier)."""
        return metric_for(self.task, self.finetune.metric)

    @field_validator("data")
    @classmethod
    def _teachers_labels(cls, data: TaskDataSection) -> TaskDataSection:
        if data.labels is not None:
            raise ValueError("labels: distillation learns the teacher's labels, in the teacher's order")
        return data

    @field_validator("run")
    @classmethod
    def _local_run_dir(cls, run: TrainingRunSection) -> TrainingRunSection:
        """The student's initial weights are staged in the run directory, read by every worker from there."""
        if is_uri(run.output_dir):
            raise ValueError(
                "output_dir is a URI, but distillation stages the student's initial weights in the run "
                "directory with local file operations: give a local path or a mount every node shares "
                "(NFS, EFS, Filestore); pretrain and finetune take a URI"
            )
        return run
