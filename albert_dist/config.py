"""Job configuration: YAML files validated into typed sections, with `--set a.b=value` overrides.

Every job (data preparation, pretraining, fine-tuning, distillation, sweeps) is one pydantic model built from the
sections below. Unknown keys and impossible values raise `ConfigError` with one message naming the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from albert_dist.errors import ConfigError
from albert_dist.redaction import redact_url, refuse_uri_credentials
from albert_dist.storage import is_uri, join_location, resolve_path, staging_dir, uri_path


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # key of another job's section of the same name -> where its meaning lives here (said with "unknown key")
    key_hints: ClassVar[dict[str, str]] = {}


def _output_dir(uri_allowed: bool):
    """run.output_dir's check: a local or mounted path, or (for the jobs whose run directory may live in object
    storage) a URI without credentials in it."""

    def check(output_dir: str) -> str:
        if is_uri(output_dir):
            if uri_allowed:
                refuse_uri_credentials(output_dir)
                return output_dir
            raise ValueError(
                "a URI, but the run directory (its lock file, checkpoints, models, the default MLflow "
                "SQLite store) is written with local file operations: give a local path or a mount "
                "every node shares (NFS, EFS, Filestore); data.output may be an s3:// or gs:// URI, "
                "and pretrain and finetune take one as run.output_dir"
            )
        return output_dir

    return Annotated[
        str,
        Field(
            description="Root of checkpoints, prepared data and the default MLflow store: a local or mounted "
            "path (data.output may be a URI; pretrain and finetune also take an s3:// or gs:// URI here)."
        ),
        AfterValidator(check),
    ]


LocalOutputDir = _output_dir(uri_allowed=False)
StoredOutputDir = _output_dir(uri_allowed=True)


class OutputSection(Section):
    """Data preparation's `run:`: where its outputs go (`data.output` under it; data.seed seeds it)."""

    key_hints = {
        "name": "data preparation writes to data.output, under run.output_dir",
        "seed": "data preparation is seeded by data.seed",
    }

    output_dir: LocalOutputDir = "runs"


class RunSection(Section):
    """A named run (its directory under output_dir) and its seed: a sweep's, the demo's."""

    key_hints = {
        "resume_changes": "a training job's key: a sweep resumes its trials as they were launched, and the "
        "demo starts afresh"
    }

    output_dir: LocalOutputDir = "runs"
    name: str = Field("albert", min_length=1, description="Stable run name: relaunching the same name resumes it.")
    seed: int = 0

    @field_validator("name")
    @classmethod
    def _one_directory_name(cls, name: str) -> str:
        """The run's directory sits right under output_dir: a name with a path in it could write anywhere."""
        if name in (".", "..") or any(sep in name for sep in ("/", "\\", "\0")):
            raise ValueError(
                "not a plain directory name (no '/', '\\', '.' or '..'): the run directory is run.output_dir/run.name"
            )
        return name

    @property
    def run_dir(self) -> Path:
        """The run's local directory: its home for a local output_dir; for a URI one, its local staging directory
        (`staging_dir`: the driver's lock, scratch files and a copy of the published model)."""
        if is_uri(self.output_dir):
            return staging_dir(self.locate())
        return resolve_path(self.output_dir) / self.name

    def locate(self, *parts: str) -> Path | str:
        """Where `parts` live in the run's durable home `output_dir/name`: a local Path, or a URI string."""
        if is_uri(self.output_dir):
            return join_location(self.output_dir, self.name, *parts)
        return self.run_dir.joinpath(*parts)


class TrainingRunSection(RunSection):
    """The `run:` of a training job, whose relaunch resumes its checkpoints. Its run directory may be a URI
    (`s3://bucket/prefix`): Ray Train stores the checkpoints there, the workers their metrics state, the jobs their
    models and MLflow run id (distillation refuses one: `DistillJobConfig`)."""

    output_dir: StoredOutputDir = "runs"
    resume_changes: Literal["refuse", "allow"] = Field(
        "refuse",
        description="When checkpoints of run.name were trained with other settings or data: refuse (stop, "
        "naming the changes) or allow (resume them under the new settings and record the "
        "changes in MLflow). Output, logging, checkpoint and placement settings may always "
        "change.",
    )


class PretrainedModelSection(Section):
    """A model to start from and the dropout to train it with: fine-tuning's `model:` (its shape is init_from's).
    `None` keeps the model's value."""

    init_from: str | None = Field(None, description="A model directory (ours or transformers') to start from.")
    allow_pickle: bool = Field(
        False,
        description="Accept an init_from holding only pytorch_model.bin (pickle), "
        "still loaded with torch.load(weights_only=True).",
    )
    hidden_dropout_prob: float | None = Field(None, ge=0, lt=1)
    attention_probs_dropout_prob: float | None = Field(None, ge=0, lt=1)
    classifier_dropout_prob: float | None = Field(None, ge=0, lt=1)

    _local_init_from = field_validator("init_from")(classmethod(lambda cls, value: local_path(value)))

    def overrides(self) -> dict[str, Any]:
        fields = self.model_dump(exclude={"preset", "init_from", "allow_pickle"})
        return {k: v for k, v in fields.items() if v is not None}


class ModelSection(PretrainedModelSection):
    """Pretraining's `model:`, a preset plus field overrides (`None` keeps the preset's value), or init_from as it
    is. Field names as transformers.AlbertConfig."""

    preset: Literal["tiny", "base", "large", "xlarge", "xxlarge"] = "tiny"
    embedding_size: int | None = Field(None, gt=0)
    hidden_size: int | None = Field(None, gt=0)
    num_hidden_layers: int | None = Field(None, gt=0)
    num_hidden_groups: int | None = Field(None, gt=0)
    num_attention_heads: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)
    inner_group_num: int | None = Field(None, gt=0)
    hidden_act: str | None = None
    max_position_embeddings: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _init_from_keeps_its_config(self) -> ModelSection:
        if self.init_from and self.overrides():
            raise ValueError(
                f"{', '.join(sorted(self.overrides()))} cannot be set with init_from: pretraining "
                f"continues {self.init_from} with its own config.json"
            )
        return self

    def build(self, vocab_size: int, **extra: Any):
        """The `AlbertConfig` for this section; model validation errors are reported as config errors."""
        from albert_dist.model import AlbertConfig

        try:
            return AlbertConfig.from_preset(self.preset, vocab_size=vocab_size, **self.overrides(), **extra)
        except ConfigError as err:
            raise ConfigError(f"model: {err}") from None


PretrainedModelSection.key_hints = dict.fromkeys(
    set(ModelSection.model_fields) - set(PretrainedModelSection.model_fields),
    "the model's shape is model.init_from's; fine-tuning can change its dropout",
)


class TokenizerSection(Section):
    kind: Literal["sentencepiece", "wordpiece"] = Field(
        "sentencepiece",
        description="sentencepiece: spiece.model (English ALBERT); wordpiece: a BERT-Chinese "
        "vocab.txt (one token per CJK character, WordPiece for Latin words).",
    )
    path: str | None = Field(
        None,
        description="An existing tokenizer (dir with spiece.model or vocab.txt, or the "
        "file); when empty one is trained on the corpus.",
    )
    vocab_size: int = Field(8000, ge=16)
    character_coverage: float = Field(0.99995, ge=0.98, le=1, description="SentencePiece only (it takes 0.98-1).")
    input_sentence_size: int = Field(1_000_000, gt=0, description="Lines sampled from the corpus for training.")
    model_type: Literal["unigram", "bpe"] = Field("unigram", description="SentencePiece only.")

    _local_path = field_validator("path")(classmethod(lambda cls, value: local_path(value)))

    @model_validator(mode="after")
    def _options_fit_kind(self) -> TokenizerSection:
        if self.kind == "wordpiece":
            misplaced = changed_from_default(self, ("character_coverage", "model_type"))
            if misplaced:
                raise ValueError(f"{', '.join(misplaced)} apply to kind=sentencepiece only")
        return self


class MaskingSection(Section):
    """Masked-LM masking, drawn at training time (pretraining's `masking:`). Pretraining's held-out evaluation
    draws its fixed masks as the data was prepared (data prepare's `masking:`), so runs compare on the same ones,
    and shows [MASK] at every one of them (no random or kept token a model could copy)."""

    key_hints = {"static": "static masks are chosen when preparing the data: data prepare's masking.static"}

    mlm_probability: float = Field(0.15, gt=0, lt=1)
    max_predictions_per_seq: int = Field(20, gt=0)
    max_ngram: int = Field(3, ge=1, le=10)
    whole_word: bool = True
    pad_to_multiple_of: int = Field(8, ge=1)


class PrepareMaskingSection(MaskingSection):
    """Data preparation's `masking:`: the settings recorded with the data, or with `static` the masks written."""

    static: bool = Field(
        False, description="Write masks with the data (google-research's setup) instead of drawing new ones each epoch."
    )


class PreparationSection(Section):
    """How a corpus becomes SOP instances: `data:` of data preparation but the inputs (the demo's are its own)."""

    format: Literal["auto", "sentences", "lines", "blocks", "jsonl", "parquet"] = Field(
        "auto",
        description="sentences: one sentence per line, blank line between documents (google-research); "
        "lines: one document per line; blocks: blank-line separated documents; "
        "jsonl/parquet: one document per record.",
    )
    text_field: str = "text"
    language: Literal["auto", "en", "zh"] = "auto"
    output: str = Field(
        "data/prepared",
        description="Prepared dataset directory (relative to run.output_dir), or a "
        "URI (s3://bucket/prefix, gs://...; credentials from the "
        "environment).",
    )
    max_seq_length: int = Field(128, ge=8, le=8192)
    short_seq_prob: float = Field(0.1, ge=0, le=1)
    dupe_factor: int = Field(1, ge=1)
    eval_fraction: float = Field(0.02, ge=0, lt=1, description="Share of documents held out for evaluation.")
    max_sentence_chars: int = Field(
        2000, ge=16, description="Longer sentences (runaway lines) are cut into pieces of at most this many characters."
    )
    rows_per_shard: int = Field(50_000, gt=0)
    tokenizer_actors: int | None = Field(
        None,
        ge=1,
        description="Actors that segment, tokenize and build "
        "instances; default one per CPU of the cluster "
        "left after reading.",
    )
    range_bytes: int | None = Field(
        None,
        ge=1,
        description="Files are read in ranges of about this many bytes, cut where a document ends, so "
        "one big file is many tasks (a gzip file is one: it cannot be entered in the "
        "middle); default: about four ranges per CPU of the cluster, 256 KiB to 64 MiB.",
    )
    word_segmenter: Literal["jieba"] | None = Field(
        None, description="jieba: whole-word masking of Chinese words (else each CJK character is a word)."
    )
    user_dict: str | None = Field(None, description="A jieba user dictionary (one 'word [freq] [tag]' a line).")
    seed: int = 12345

    @field_validator("output")
    @classmethod
    def _output_uri_names_a_prefix(cls, output: str) -> str:
        refuse_uri_credentials(output)
        if is_uri(output) and not output.startswith("file://") and "/" not in uri_path(output).strip("/"):
            raise ValueError(
                "name a prefix inside the bucket (s3://bucket/prefix): publishing replaces everything under it"
            )
        return output

    @model_validator(mode="after")
    def _user_dict_needs_segmenter(self) -> PreparationSection:
        if self.user_dict and self.word_segmenter is None:
            raise ValueError("user_dict needs word_segmenter: jieba")
        return self


class DataSection(PreparationSection):
    """`albert-dist data prepare`'s `data:`."""

    inputs: list[str] = Field(default_factory=list, description="Files, directories or globs (.gz allowed).")

    @field_validator("inputs")
    @classmethod
    def _inputs_without_secrets(cls, inputs: list[str]) -> list[str]:
        for item in inputs:
            refuse_uri_credentials(item)
        return inputs


class PretrainDataSection(Section):
    """Pretraining's `data:`: which prepared dataset, and how to read it."""

    output: str = Field(
        "data/prepared",
        description="The prepared dataset (data prepare's data.output; relative to run.output_dir, or a URI).",
    )
    cache: Literal["auto", "memory", "stream"] = Field(
        "auto",
        description="How pretraining reads the prepared data. memory: once, into Ray's object store (an "
        "epoch starts in under a second); stream: the Parquet shards again every epoch and "
        "evaluation (seconds each; holds no memory); auto: memory when the data takes at most "
        "a fifth of the object store.",
    )
    packing: bool = Field(
        False,
        description="Pack several instances into each row up to max_seq_length (attention, positions and "
        "SOP kept per instance; same losses as unpacked): fewer rows of padding to compute. "
        "benchmarks/bench_packing.py measures the gain.",
    )


PretrainDataSection.key_hints = dict.fromkeys(
    set(DataSection.model_fields) - set(PretrainDataSection.model_fields),
    "a key of data prepare: pretraining reads the prepared data data.output names",
)


class ScalingSection(Section):
    num_workers: int = Field(2, ge=1)
    use_gpu: bool = False
    cpus_per_worker: float = Field(0.5, gt=0)
    gpus_per_worker: float = Field(1.0, gt=0)
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"

    @property
    def worker_range(self) -> tuple[int, int]:
        """(fewest, most) workers the run trains on."""
        return self.num_workers, self.num_workers


class PretrainScalingSection(ScalingSection):
    """Pretraining's `scaling:`, whose workers may come and go (spot instances) without changing the run."""

    num_workers: PositiveInt | tuple[PositiveInt, PositiveInt] = Field(
        2,
        description="Workers, or [min, max]: an elastic run that trains on as many as the cluster has room for "
        "and grows back when nodes return. Its global batch stays train.batch_size × max × "
        "train.grad_accum_steps whatever the count (a worker trains max/count of the micro-batches).",
    )
    resize_check_s: float = Field(
        60.0,
        gt=0,
        description="How often an elastic run looks for room to grow back into (a restart from its latest checkpoint).",
    )

    @field_validator("num_workers")
    @classmethod
    def _range_in_order(cls, value):
        if isinstance(value, tuple) and not value[0] <= value[1]:
            raise ValueError(f"[min, max] workers with min > max: {list(value)}")
        return value

    @model_validator(mode="after")
    def _resize_check_needs_a_range(self) -> PretrainScalingSection:
        fewest, most = self.worker_range
        if fewest == most and changed_from_default(self, ["resize_check_s"]):
            raise ValueError(
                "resize_check_s is how often an elastic run looks for room to grow: set num_workers to [min, max]"
            )
        return self

    @property
    def worker_range(self) -> tuple[int, int]:
        return self.num_workers if isinstance(self.num_workers, tuple) else super().worker_range


class TrainBase(Section):
    """The training loop's settings that every job's `train:` has (fine-tuning derives the warmup from its own
    section)."""

    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="auto: bf16 where the hardware has it natively (GPU, AMX CPU), else fp32 (fp16 on "
        "GPUs without bf16).",
    )
    optimizer: Literal["lamb", "adamw"] = Field(
        "adamw",
        description="lamb for large batches (google: 1.76e-3 at 4096 sequences, pretrain_base.yaml). At "
        "small batches and few steps LAMB at that rate barely moves: it scales each layer's "
        "step to lr × the layer's weight RMS (0.02 at init), 25× less than AdamW's at 1e-3 "
        "(benchmarks/README.md, bench_recipes).",
    )
    learning_rate: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    adam_epsilon: float = Field(1e-6, gt=0)
    max_steps: int = Field(1000, gt=0)
    lr_decay_power: float = Field(1.0, ge=0)
    batch_size: int = Field(32, gt=0, description="Per worker, per micro-batch.")
    grad_accum_steps: int = Field(1, ge=1)
    max_grad_norm: float = Field(1.0, ge=0, description="0 disables clipping.")
    log_every: int = Field(10, gt=0)
    eval_every: int = Field(200, gt=0)
    checkpoint_every: int = Field(200, gt=0)
    keep_checkpoints: int = Field(3, ge=1)
    max_failures: int = Field(2, ge=-1, description="Worker restarts from the latest checkpoint; -1 = unlimited.")
    resource_wait_attempts: int = Field(
        30,
        ge=-1,
        description="Attempts (about a minute each) to get the "
        "workers' resources back after a node is lost "
        "before the run fails; -1 = wait forever.",
    )
    max_nonfinite_steps: int = Field(20, ge=1, description="Consecutive non-finite losses before the run stops.")
    drain_check_every: int = Field(
        10,
        gt=0,
        description="Steps between checks for a drain notice on a worker's "
        "node (spot reclaim, scale-down): on one, the workers "
        "write a checkpoint at the step reached. Each check is a "
        "collective across the workers.",
    )
    activation_checkpointing: bool = False
    compile: bool = False
    deterministic: bool = Field(
        False,
        description="Deterministic kernels only (and cuBLAS's fixed workspace), "
        "for runs that must resume bit for bit on a GPU; some kernels "
        "are slower.",
    )
    peak_tflops: float | None = Field(
        None, gt=0, description="The device's dense peak for this precision, to report model FLOPs utilisation (mfu)."
    )
    publish: Literal["best", "last"] = Field(
        "best",
        description="The model published as <run>/model: the best evaluation's, or the last step's (the "
        "best evaluation's then kept in <run>/best_model too).",
    )


def _warmup_fits(train: TrainBase) -> TrainBase:
    if train.warmup_steps > train.max_steps:
        raise ValueError(f"warmup_steps ({train.warmup_steps}) exceeds max_steps ({train.max_steps})")
    return train


class TrainSection(TrainBase):
    """What the training loop reads."""

    warmup_steps: int = Field(100, ge=0)

    _warmup_fits = model_validator(mode="after")(_warmup_fits)


class PhaseSection(Section):
    """One phase of a sequence-length schedule (`train.phases`): its data, steps and batch size."""

    data: str | None = Field(
        None,
        description="The prepared dataset this phase trains on (as data.output: "
        "relative to run.output_dir, or a URI); default data.output.",
    )
    steps: int = Field(gt=0)
    batch_size: int | None = Field(None, gt=0, description="Per worker, per micro-batch; default train.batch_size.")
    max_seq_length: int | None = Field(
        None,
        gt=0,
        description="The sequence length the phase's data must have been prepared at (checked before training).",
    )

    _data_without_secrets = field_validator("data")(classmethod(lambda cls, value: without_credentials(value)))


class PretrainTrainSection(TrainBase):
    """Pretraining's `train:` (albert-dist pretrain's, the demo's): the loop's settings (`loop_settings`) plus what
    the pretraining task reads, the held-out batches, the plateau warning and the sequence-length phases."""

    key_hints = {
        f"lr_range_{key}": f"the learning-rate range test is albert-dist pretrain's own section: lr_range.{key}"
        for key in ("test", "steps", "min", "max")
    }

    warmup_steps: int = Field(100, ge=0)
    eval_batches: int = Field(
        20,
        gt=0,
        description="Evaluation reads this many batches of batch_size held-out sequences (in all, not per worker).",
    )
    publish: Literal["best", "last"] = Field(
        "last",
        description="The model published as <run>/model: the last step's (the best evaluation's kept in "
        "<run>/best_model too), or the best evaluation's.",
    )
    plateau_warning_after: float | None = Field(
        0.25,
        ge=0,
        le=1,
        description="Share of max_steps after which an evaluation whose held-out MLM accuracy is "
        "still within a point of the unigram baseline prints a warning, once; null "
        "disables it.",
    )

    phases: list[PhaseSection] = Field(
        default_factory=list,
        description="Train in phases, each on its own prepared data (google-research and "
        "NVIDIA: most steps at 128 tokens, the rest at 512), one after the "
        "other; max_steps is their sum. Evaluation reads data.output's held-out "
        "split throughout. Empty: every step on data.output.",
    )

    @model_validator(mode="before")
    @classmethod
    def _max_steps_from_phases(cls, values: Any) -> Any:
        """max_steps left at its default becomes the phases' sum (a config's defaults are filled in before it is
        validated, so "left at its default" is all that can be told)."""
        default = cls.model_fields["max_steps"].default
        if isinstance(values, dict) and values.get("phases") and values.get("max_steps", default) == default:
            try:
                values = {**values, "max_steps": sum(_phase_steps(phase) for phase in values["phases"])}
            except (TypeError, KeyError, AttributeError):
                pass  # field validation names what is wrong with the phases
        return values

    _warmup_fits = model_validator(mode="after")(_warmup_fits)

    @model_validator(mode="after")
    def _phases_fill_the_run(self) -> PretrainTrainSection:
        total = sum(phase.steps for phase in self.phases)
        if self.phases and total != self.max_steps:
            raise ValueError(
                f"the phases' steps add up to {total}, max_steps is {self.max_steps}: leave max_steps "
                f"at its default (it becomes the phases' sum) or make them agree"
            )
        return self

    def loop_settings(self) -> TrainSection:
        """The fields the training loop reads (the rest are the task's and the driver's)."""
        return TrainSection.model_validate(self.model_dump(include=set(TrainSection.model_fields)))


class LrRangeSection(Section):
    """`albert-dist pretrain`'s learning-rate range test, run instead of training when `test` is true: `steps`
    steps of train.optimizer, the rate growing exponentially from `min` to `max`."""

    test: bool = Field(
        False,
        description="Instead of training, run the test, print loss against rate and a suggested "
        "train.learning_rate, log the plot to MLflow.",
    )
    steps: int = Field(100, ge=5)
    min: float = Field(1e-5, gt=0)
    max: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _range_ordered(self) -> LrRangeSection:
        if self.min >= self.max:
            raise ValueError(f"min ({self.min}) must be below max ({self.max})")
        return self


class TrackingSection(Section):
    tracking_uri: str | None = Field(
        None, description="Default: $MLFLOW_TRACKING_URI, else a SQLite file under run.output_dir."
    )
    experiment: str = "albert-dist"
    register_model: str | None = Field(None, description="Registered model name; empty = do not register.")

    def resolved_uri(self, output_dir: str) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        if is_uri(output_dir):
            raise ConfigError(
                f"run.output_dir is a URI ({output_dir}) and no MLflow store is set: the default "
                f"SQLite file cannot live in object storage. Set tracking.tracking_uri (or "
                f"$MLFLOW_TRACKING_URI) to a server or database every launch of the run reaches"
            )
        db = resolve_path(output_dir) / "mlflow.db"
        db.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{db}"


class DataJobConfig(Section):
    """`albert-dist data prepare`."""

    run: OutputSection = Field(default_factory=OutputSection)
    data: DataSection = Field(default_factory=DataSection)
    tokenizer: TokenizerSection = Field(default_factory=TokenizerSection)
    masking: PrepareMaskingSection = Field(default_factory=PrepareMaskingSection)

    @model_validator(mode="after")
    def _no_option_without_effect(self) -> DataJobConfig:
        """Training options with a given tokenizer, masking options without static masks, would be ignored."""
        trained = changed_from_default(
            self.tokenizer, ("vocab_size", "character_coverage", "input_sentence_size", "model_type")
        )
        if self.tokenizer.path and trained:
            raise ValueError(
                f"tokenizer.{', tokenizer.'.join(trained)}: options of training a tokenizer, and "
                f"tokenizer.path gives one"
            )
        masking = changed_from_default(self.masking, MaskingSection.model_fields)
        if masking and not self.masking.static:
            raise ValueError(
                f"masking.{', masking.'.join(masking)}: options of static masks (masking.static: "
                "true); pretraining's masking: section sets the masks it draws"
            )
        return self


class TrainingJobConfig(Section):
    """The sections of every job that trains on Ray Train, tracked in MLflow."""

    run: TrainingRunSection = Field(default_factory=TrainingRunSection)
    scaling: ScalingSection = Field(default_factory=ScalingSection)
    tracking: TrackingSection = Field(default_factory=TrackingSection)


class PretrainJobConfig(TrainingJobConfig):
    """`albert-dist pretrain`: `data.output` names the prepared dataset to train on."""

    scaling: PretrainScalingSection = Field(default_factory=PretrainScalingSection)
    model: ModelSection = Field(default_factory=ModelSection)
    data: PretrainDataSection = Field(default_factory=PretrainDataSection)
    masking: MaskingSection = Field(default_factory=MaskingSection)
    train: PretrainTrainSection = Field(default_factory=PretrainTrainSection)
    lr_range: LrRangeSection = Field(default_factory=LrRangeSection)


def _phase_steps(phase: Any) -> int:
    return int(phase.steps if isinstance(phase, PhaseSection) else phase["steps"])


def changed_from_default(section: BaseModel, names) -> list[str]:
    """Which of the fields `names` of `section` differ from their defaults."""
    return [name for name in names if getattr(section, name) != type(section).model_fields[name].default]


def local_path(value: str | None) -> str | None:
    """A field validator's check for paths read with local file operations (model and tokenizer directories)."""
    if value is not None and is_uri(value):
        raise ValueError(
            "a URI, but this is read from a local or mounted path (data.output, data.inputs, "
            "fine-tuning's data files and model.init_from, pretrain's and finetune's run.output_dir "
            "take URIs)"
        )
    return value


def without_credentials(value: str | None) -> str | None:
    """A field validator's check for locations that may be URIs: credentials in one are refused."""
    if value is not None:
        refuse_uri_credentials(value)
    return value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` strings to a nested dict; values are parsed as YAML scalars (`1e-4`, `true`, `[1, 2]`)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form section.field=value")
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        try:
            node[parts[-1]] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({err})") from None
    return raw


ConfigT = TypeVar("ConfigT", bound=BaseModel)


def load_config(cls: type[ConfigT], path: str | Path | None = None, overrides: list[str] | None = None) -> ConfigT:
    """Read YAML (or embedded defaults when `path` is None), apply overrides and validate into `cls`."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except UnicodeDecodeError as err:
            raise ConfigError(f"{path} is not UTF-8 text: {err}") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path} must hold a mapping of sections, not {type(raw).__name__}")
    apply_overrides(raw, overrides or [])
    return validate_config(cls, merge(cls().model_dump(), raw), source)


def merge(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` laid over `defaults`, section by section, so a job's own section defaults survive an override
    of one of their fields."""
    out = dict(defaults)
    for key, value in given.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def validate_config(cls: type[ConfigT], raw: dict[str, Any], source: str = "config") -> ConfigT:
    try:
        return cls.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"invalid config ({source}): {format_validation_error(err, cls)}") from None


def format_validation_error(err: ValidationError, cls: type[BaseModel] | None = None) -> str:

    problems = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            hint = _key_hint(cls, e["loc"])
            msg = "unknown key" + (f" ({hint})" if hint else "")
        problems.append(
            f"{where}: {msg}"
            + (
                f" (got {redact_url(repr(e['input']))})"
                if e["type"] != "extra_forbidden" and not isinstance(e.get("input"), dict)
                else ""
            )
        )
    return "; ".join(problems)


def _key_hint(cls: type[BaseModel] | None, loc: tuple) -> str | None:
    """The `key_hints` entry of the section holding the unknown key at `loc`, if any."""
    for part in loc[:-1]:
        field = cls.model_fields.get(str(part)) if isinstance(cls, type) and issubclass(cls, BaseModel) else None
        if field is None:
            return None
        cls = field.annotation
    return cls.key_hints.get(str(loc[-1])) if isinstance(cls, type) and issubclass(cls, Section) else None


def flatten(config: BaseModel) -> dict[str, Any]:
    """`section.field -> value`, for MLflow params."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out[prefix] = value

    walk("", config.model_dump())
    return out


def dump_yaml(config: BaseModel) -> str:
    return yaml.safe_dump(config.model_dump(), sort_keys=False)
