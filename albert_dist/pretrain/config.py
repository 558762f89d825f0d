"""`albert-dist pretrain`'s config: the model, the prepared data it reads, elastic scaling, the loop with its phases;
`albert-dist lr-range`'s: the same plus the learning-rate range test's sweep."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    PositiveInt,
    field_validator,
    model_validator,
)

from albert_dist.config import (
    ScalingSection,
    Section,
    TrainBase,
    TrainingJobConfig,
    TrainSection,
    changed_from_default,
    warmup_fits,
    without_credentials,
)
from albert_dist.data.config import DataSection, MaskingSection
from albert_dist.model.sections import ModelSection


class PretrainDataSection(Section):
    """Pretraining's `data:`: which prepared dataset, and how to read it."""

    output: str = Field(
        "data/prepared",
        description="The prepared dataset (data prepare's data.output; relative to run.output_dir, or a URI).",
    )
    cache: Literal["auto", "memory", "stream"] = Field(
        "auto",
        description="How pretraining reads the held-out split, evaluated over and over. memory: once, into Ray's "
        "object store (an evaluation starts in under a second); stream: its Parquet shards again at every "
        "evaluation (seconds each; holds no memory); auto: memory when it takes at most a fifth of the object "
        "store. The training splits are read by row number from their shards on each worker either way.",
    )
    packing: bool | Literal["auto"] = Field(
        "auto",
        description="Pack several instances into each row up to max_seq_length (attention, positions and "
        "SOP kept per instance; same losses as unpacked): fewer rows of padding to compute. auto: pack a batch "
        "when its packed rows hold at most 80 % of its padded token slots (short documents), keep it padded "
        "otherwise (nearly full rows). benchmarks/bench_packing.py measures the gain.",
    )


PretrainDataSection.key_hints = dict.fromkeys(
    set(DataSection.model_fields) - set(PretrainDataSection.model_fields),
    "a key of data prepare: pretraining reads the prepared data data.output names",
)


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
        return self.num_workers if isinstance(self.num_workers, tuple) else (self.num_workers, self.num_workers)


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
        "lr_range_test": "the learning-rate range test is a command of its own: albert-dist lr-range",
        **{
            f"lr_range_{key}": f"the learning-rate range test is albert-dist lr-range, in its section: lr_range.{key}"
            for key in ("steps", "min", "max")
        },
    }

    # TrainSection's field, declared here too: a section sits at most two levels below Section (test_config)
    warmup_steps: int = Field(100, ge=0)
    eval_batches: int = Field(
        20,
        gt=0,
        description="Evaluation reads this many batches of batch_size held-out sequences (in all, not per worker).",
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

    _warmup_fits = model_validator(mode="after")(warmup_fits)

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
    """`albert-dist lr-range`'s sweep: `steps` steps of train.optimizer, the rate growing exponentially from `min`
    to `max`."""

    steps: int = Field(100, ge=5)
    min: float = Field(1e-5, gt=0)
    max: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _range_ordered(self) -> LrRangeSection:
        if self.min >= self.max:
            raise ValueError(f"min ({self.min}) must be below max ({self.max})")
        return self


class PretrainJobConfig(TrainingJobConfig):
    """`albert-dist pretrain`: `data.output` names the prepared dataset to train on."""

    scaling: PretrainScalingSection = Field(default_factory=PretrainScalingSection)
    model: ModelSection = Field(default_factory=ModelSection)
    data: PretrainDataSection = Field(default_factory=PretrainDataSection)
    masking: MaskingSection = Field(default_factory=MaskingSection)
    # the last step's model: a pretrained encoder is judged downstream, not by its held-out MLM at one step
    train: PretrainTrainSection = Field(default_factory=lambda: PretrainTrainSection(publish="last"))

    key_hints = {"lr_range": "the learning-rate range test is a command of its own: albert-dist lr-range"}


class LrRangeJobConfig(TrainingJobConfig):
    """`albert-dist lr-range`: a pretraining job's sections, so that the test runs on that job's data, model and
    optimizer (its YAML serves both commands), plus the sweep of learning rates. The sections are listed again
    rather than inherited from `PretrainJobConfig`: a reader finds each section in the config class they opened or
    its one parent."""

    scaling: PretrainScalingSection = Field(default_factory=PretrainScalingSection)
    model: ModelSection = Field(default_factory=ModelSection)
    data: PretrainDataSection = Field(default_factory=PretrainDataSection)
    masking: MaskingSection = Field(default_factory=MaskingSection)
    train: PretrainTrainSection = Field(default_factory=lambda: PretrainTrainSection(publish="last"))
    lr_range: LrRangeSection = Field(default_factory=LrRangeSection)


def _phase_steps(phase: Any) -> int:
    return int(phase.steps if isinstance(phase, PhaseSection) else phase["steps"])
