"""Sweep configs: the job to tune (inline, or the path of its YAML), the search space, and how Tune searches.

`FinetuneTuneConfig` sweeps `albert-dist finetune` jobs, `DistillTuneConfig` sweeps `albert-dist distill` jobs.
The search space is validated against the job config when the sweep config is loaded, before any trial starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from albert_dist.config import RunSection, Section, load_config
from albert_dist.finetune.config import DistillJobConfig, FinetuneJobConfig
from albert_dist.tune import space


class SchedulerSection(Section):
    """ASHA counts time in dev evaluations (Tune's training_iteration): every `train.eval_every` steps and at each
    epoch end. A trial that reaches `max_t` evaluations is stopped, so keep it above any trial's evaluations."""

    kind: Literal["asha", "none"] = "asha"
    grace_period: int = Field(1, ge=1, description="Evaluations before a trial can be stopped.")
    reduction_factor: float = Field(2.0, gt=1)
    max_t: int = Field(1000, ge=1)


class ResourcesSection(Section):
    """Per-trial overrides of the job's `scaling` (empty keeps the job's value). The Tune trial itself takes no
    CPU: its Ray Train workers do."""

    num_workers: int | None = Field(None, ge=1)
    cpu: float | None = Field(None, gt=0, description="CPUs per worker.")
    gpu: float | None = Field(None, ge=0, description="GPUs per worker; 0 trains on CPU.")

    def scaling_overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.num_workers is not None:
            out["num_workers"] = self.num_workers
        if self.cpu is not None:
            out["cpus_per_worker"] = self.cpu
        if self.gpu is not None:
            out["use_gpu"] = self.gpu > 0
            if self.gpu > 0:
                out["gpus_per_worker"] = self.gpu
        return out


class TuneJobConfig(Section):
    """What every sweep shares; subclasses name the job kind and its config class."""

    kind: ClassVar[str]  # the registered job a trial runs (albert_dist.jobs.registry)
    job: Section  # declared first (narrowed by subclasses) so that the search space is checked against it
    run: RunSection = Field(
        default_factory=lambda: RunSection(name="sweep", output_dir="runs/sweeps"),
        description="The sweep lives in <output_dir>/<name>; relaunching the name resumes it.",
    )
    search_space: dict[str, Any] = Field(
        default_factory=dict,
        description="dotted job field → {loguniform|uniform: [lo, hi]} | {randint: [lo, hi)} | {choice: [...]}",
    )
    metric: str | None = Field(
        None, description="A dev metric the loop reports (eval_*); default: eval_ and the job's best-model metric."
    )
    mode: Literal["max", "min"] | None = Field(None, description="Default: min for losses, else max.")
    num_samples: int = Field(8, ge=1)
    max_concurrent_trials: int = Field(2, ge=1)
    resources_per_trial: ResourcesSection = Field(default_factory=ResourcesSection)
    search_alg: Literal["optuna", "random"] = "optuna"
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)

    @field_validator("job", mode="before", check_fields=False)
    @classmethod
    def _load_job(cls, value: Any) -> Any:
        """A path is read as the job's own YAML config (relative paths from the working directory)."""
        if isinstance(value, (str, Path)):
            return load_config(cls.model_fields["job"].annotation, value)
        return value

    @field_validator("search_space")
    @classmethod
    def _valid_space(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "job" in info.data:  # else the job's own error is reported
            space.check(info.data["job"], value)
        return value

    @field_validator("metric")
    @classmethod
    def _eval_metric(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("eval_"):
            raise ValueError(f"{value!r} is not a dev metric: Tune sees the evaluations' eval_* metrics")
        return value

    @property
    def sweep_dir(self) -> Path:
        return self.run.run_dir

    @property
    def tune_metric(self) -> str:
        return self.metric or f"eval_{self.job.best_metric}"

    @property
    def tune_mode(self) -> str:
        return self.mode or ("min" if self.tune_metric.endswith("loss") else "max")

    @property
    def distributions(self) -> dict[str, space.Distribution]:
        return space.check(self.job, self.search_space)


class FinetuneTuneConfig(TuneJobConfig):
    """`albert-dist tune finetune`: learning rate, warmup_ratio, batch size, weight decay, layer_lr_decay,
    classifier dropout, epochs, …"""

    kind: ClassVar[str] = "finetune"
    job: FinetuneJobConfig = Field(default_factory=FinetuneJobConfig)


class DistillTuneConfig(TuneJobConfig):
    """`albert-dist tune distill`: temperature, alpha, hidden_weight (beta), student depth and width, learning
    rate, …"""

    kind: ClassVar[str] = "distill"
    job: DistillJobConfig = Field(default_factory=DistillJobConfig)
