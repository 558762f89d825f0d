"""Job configuration: YAML files validated into typed sections, with `--set a.b=value` overrides.

Every job (data preparation, pretraining, fine-tuning, distillation, sweeps) is one pydantic model built from the
sections below. Unknown keys and impossible values raise `ConfigError` with one message naming the field.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from albert_dist.errors import ConfigError
from albert_dist.redaction import redact_url, refuse_uri_credentials
from albert_dist.storage import is_uri, join_location, resolve_path, staging_dir


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
        "best evaluation's then kept in <run>/best_model too). Pretraining's default is last, "
        "fine-tuning's and distillation's best.",
    )


def warmup_fits(train: TrainBase) -> TrainBase:
    """The after-validator of a section with warmup_steps: the warmup fits in the run."""
    if train.warmup_steps > train.max_steps:
        raise ValueError(f"warmup_steps ({train.warmup_steps}) exceeds max_steps ({train.max_steps})")
    return train


class TrainSection(TrainBase):
    """What the training loop reads: pretraining's `train:` as `loop_settings` gives it, fine-tuning's with the
    warmup its `finetune.warmup_ratio` sets."""

    warmup_steps: int = Field(100, ge=0)

    _warmup_fits = model_validator(mode="after")(warmup_fits)


class TrackingSection(Section):
    tracking_uri: str | None = Field(
        None, description="Default: $MLFLOW_TRACKING_URI, else a SQLite file under run.output_dir."
    )
    experiment: str = "albert-dist"
    register_model: str | None = Field(None, description="Registered model name; empty = do not register.")
    system_metrics: bool = Field(
        True,
        description="Log MLflow's system metrics (system/: CPU, memory, disk, network, GPU) of the driver's node "
        "every $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL seconds (default 10) while the run lasts.",
    )

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
        return f"sqlite:///{resolve_path(output_dir) / 'mlflow.db'}"


class TrainingJobConfig(Section):
    """The sections of every job that trains on Ray Train, tracked in MLflow."""

    run: TrainingRunSection = Field(default_factory=TrainingRunSection)
    scaling: ScalingSection = Field(default_factory=ScalingSection)
    tracking: TrackingSection = Field(default_factory=TrackingSection)


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


def apply_overrides(raw: dict[str, Any], overrides: list[str] | dict[str, Any]) -> dict[str, Any]:
    """Apply `a.b.c=value` strings to a nested dict, their values parsed as YAML scalars (`1e-4`, `true`,
    `[1, 2]`); or a dict of `a.b.c` keys, its values taken as they are."""
    if isinstance(overrides, dict):
        for key, value in overrides.items():
            _set_dotted(raw, str(key), value, f"{key}={value!r}")
        return raw
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form section.field=value")
        try:
            parsed = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({err})") from None
        _set_dotted(raw, key, parsed, item)
    return raw


def _set_dotted(raw: dict[str, Any], key: str, value: Any, item: str) -> None:
    if not key.strip():
        raise ConfigError(f"override {item!r} is not of the form section.field=value")
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


ConfigT = TypeVar("ConfigT", bound=BaseModel)


#: The job configs shipped in the package (package data), found by name: `--config pretrain_zh`.
PACKAGED_CONFIGS = Path(__file__).resolve().parent / "configs"


def packaged_configs() -> dict[str, Path]:
    """Name (the file's stem) → path of every config shipped in the package."""
    return {path.stem: path for path in sorted(PACKAGED_CONFIGS.glob("*.yaml"))}


def config_path(name_or_path: str | Path) -> Path:
    """The YAML file `name_or_path` names: an existing file, else the packaged config of that name (with or
    without `.yaml`). A file wins over a packaged config of the same name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = packaged_configs()
    if path.parent == Path(".") and path.name.removesuffix(".yaml") in packaged:
        return packaged[path.name.removesuffix(".yaml")]
    raise ConfigError(
        f"config file not found: {name_or_path} (nor a packaged config of that name: {', '.join(packaged)}; "
        "see albert-dist config list)"
    )


ConfigSource = str | Path | dict[str, Any] | BaseModel | None
Overrides = list[str] | dict[str, Any] | None


def load_config(cls: type[ConfigT], path: ConfigSource = None, overrides: Overrides = None) -> ConfigT:
    """Validate into `cls` a config given as a YAML file or a packaged config's name (`config_path`), a dict of
    sections, a config object, or None (the embedded defaults), with `overrides` applied over it."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if isinstance(path, BaseModel):
        raw, source = path.model_dump(), type(path).__name__
    elif isinstance(path, dict):
        raw, source = copy.deepcopy(path), "dict"
    elif path is not None:
        source = str(path)
        try:
            text = config_path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"{path} is not UTF-8 text: {err}") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path} must hold a mapping of sections, not {type(raw).__name__}")
    apply_overrides(raw, overrides or [])
    return validate_config(cls, merge(default_values(cls), raw), source)


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


def default_values(cls: type[BaseModel]) -> dict[str, Any]:
    """The defaults of the config class `cls` as plain values (made once per class: making them runs every
    validator of every section)."""
    return copy.deepcopy(_defaults(cls))


@functools.cache
def _defaults(cls: type[BaseModel]) -> dict[str, Any]:
    return cls().model_dump()


def flatten(config: BaseModel | dict[str, Any]) -> dict[str, Any]:
    """`section.field -> value` of a config or of its plain values, for MLflow params."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out[prefix] = value

    walk("", config if isinstance(config, dict) else config.model_dump())
    return out


def dump_yaml(config: BaseModel) -> str:
    return yaml.safe_dump(config.model_dump(), sort_keys=False)
