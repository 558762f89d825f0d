"""`albert-dist pretrain`: MLM + SOP pretraining of ALBERT on Ray Train, tracked in MLflow.

The job's declaration (`PRETRAIN`, run by `train.job.run_job`): its plan validates the prepared data and the model
config and builds the workers' task (albert_dist/pretrain/task.py); the last step's model is published (`train.publish:
last`, the best evaluation's in `best_model/`). With a URI `run.output_dir`, checkpoints, the models and the MLflow run
id are stored there (`TrainingRunSection.locate`), the lock and a copy of the final model in the run's local staging
directory (`TrainingRunSection.run_dir`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from albert_dist.errors import ConfigError
from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist.pretrain.config import PretrainJobConfig
from albert_dist.pretrain.mlflow_model import EncoderModel
from albert_dist.pretrain.task import PhaseSpec, PretrainingSpec
from albert_dist.tracking import run as tracking
from albert_dist.train.job import JobOutcome, TrainingJob
from albert_dist.train.plan import Plan, base_plan

VERIFIED_SHARDS = "verified_shards.json"  # in the run dir: the shards checked against the manifest, and when


@dataclass
class Phase:
    """One phase of `train.phases`, with its prepared data opened."""

    prepared: Any  # PreparedData
    steps: int
    batch_size: int

    @property
    def max_seq_length(self) -> int:
        return int(self.prepared.manifest["max_seq_length"])

    def describe(self) -> str:
        return (
            f"{self.steps} steps of {self.batch_size} x {self.max_seq_length} tokens per worker "
            f"({self.prepared.location})"
        )


def open_phases(cfg: PretrainJobConfig, prepared, model_config: AlbertConfig) -> list[Phase]:
    """The prepared data of each of `train.phases` (none without phases), checked against data.output's: the same
    tokenizer (the model's vocabulary), the sequence length the phase names, within the model's positions."""
    from albert_dist.data.loading import load_prepared, prepared_location

    phases = []
    for number, phase in enumerate(cfg.train.phases, 1):
        location = prepared_location(cfg, phase.data) if phase.data else prepared.location
        data = prepared if location == prepared.location else load_prepared(location)
        opened = Phase(data, phase.steps, phase.batch_size or cfg.train.batch_size)
        where = f"train.phases[{number}] ({location})"
        if data.manifest["tokenizer"]["sha256"] != prepared.manifest["tokenizer"]["sha256"]:
            raise ConfigError(
                f"{where} was tokenized with another tokenizer than data.output ({prepared.location}):"
                f" every phase trains one model, so prepare them all with the same tokenizer.path"
            )
        if phase.max_seq_length is not None and phase.max_seq_length != opened.max_seq_length:
            raise ConfigError(
                f"{where} is prepared at max_seq_length {opened.max_seq_length}, the phase says {phase.max_seq_length}"
            )
        if opened.max_seq_length > model_config.max_position_embeddings:
            raise ConfigError(
                f"{where} is prepared at max_seq_length {opened.max_seq_length}, beyond "
                f"model.max_position_embeddings ({model_config.max_position_embeddings})"
            )
        phases.append(opened)
    return phases


def data_digest(prepared, phases: list[Phase]) -> str:
    """What identifies the data of a run: data.output's digest, and each phase's in order."""
    import hashlib

    if not phases:
        return prepared.digest()
    return hashlib.sha256(" ".join([prepared.digest(), *(p.prepared.digest() for p in phases)]).encode()).hexdigest()


def plan(cfg: PretrainJobConfig) -> Plan:
    """Open and verify the prepared data (and the phases'), size the model to it: the run's plan."""
    from albert_dist.data.loading import load_prepared, prepared_location

    data_dir = prepared_location(cfg)
    prepared = load_prepared(data_dir)
    manifest = prepared.manifest
    model_config = pretraining_model_config(cfg, manifest)
    phases = open_phases(cfg, prepared, model_config)
    every_data = list({id(p): p for p in [prepared, *(phase.prepared for phase in phases)]}.values())
    for data in every_data:
        data.verify_shards(record=cfg.run.run_dir / VERIFIED_SHARDS)
    with torch.device("meta"):  # counted without allocating the weights (0.9 GB of fp32 for xxlarge)
        n_params = AlbertForPreTraining(model_config).num_parameters()
    in_memory = all(data.fits_in_memory(cfg.data.cache) for data in every_data)

    def stage(run) -> None:
        run.log_text(json.dumps(manifest, indent=2, ensure_ascii=False), "data/manifest.json")
        run.log_datasets([tracking.prepared_data_input(data_dir, manifest)])

    return base_plan(
        cfg,
        task=pretraining_spec(cfg, prepared, data_dir, model_config, phases),
        train=cfg.train.loop_settings(),
        data_digest=data_digest(prepared, phases),
        stage=stage,
        inputs={"in_memory": in_memory},
        datasets=lambda: prepared.held_out(in_memory),
        params={
            "model.num_parameters": n_params,
            "world_size": cfg.scaling.worker_range[1],
            "data.prepared_dir": str(data_dir),
            "data.in_memory": in_memory,
        },
        banner=[
            f"pretraining {cfg.model.preset} ({n_params / 1e6:.1f}M parameters) on {workers(cfg.scaling)}, "
            f"{cfg.train.precision}",
            f"data: {prepared.rows('train')} training instances read by position from Parquet, held-out ones "
            + ("read once into Ray's object store" if in_memory else "streamed from Parquet at each evaluation")
            + f" (data.cache={cfg.data.cache})",
            *(f"phase {number}/{len(phases)}: {phase.describe()}" for number, phase in enumerate(phases, 1)),
        ],
    )


def workers(scaling) -> str:
    fewest, most = scaling.worker_range
    if fewest == most:
        return f"{most} worker(s)"
    return (
        f"{fewest} to {most} workers (elastic: each step trains {most} micro-batches per accumulation step "
        f"whatever the count, so the global batch stays the same)"
    )


def pretraining_spec(
    cfg: PretrainJobConfig,
    prepared,
    data_dir: str | Path,
    model_config: AlbertConfig | None = None,
    phases: list[Phase] = (),
) -> PretrainingSpec:
    """The task of a job on the prepared data `prepared` (read from `data_dir`), training in `phases`
    (`open_phases`) when there are any."""
    manifest = prepared.manifest
    model_config = model_config or pretraining_model_config(cfg, manifest)
    return PretrainingSpec(
        prepared_dir=str(data_dir),
        manifest=manifest,
        model_config=model_config.to_dict(),
        masking=cfg.masking,
        batch_size=cfg.train.batch_size,
        max_seq_length=manifest["max_seq_length"],
        seed=cfg.run.seed,
        eval_batches=cfg.train.eval_batches,
        has_eval=prepared.rows("eval") > 0,
        init_from=cfg.model.init_from,
        plateau_warning_after=cfg.train.plateau_warning_after,
        packing=cfg.data.packing,
        phases=tuple(PhaseSpec(p.prepared.location, p.steps, p.batch_size, p.max_seq_length) for p in phases),
        slots=cfg.scaling.worker_range[1],
    )


def pretraining_model_config(cfg: PretrainJobConfig, manifest: dict[str, Any]) -> AlbertConfig:
    """The model a job trains on data with `manifest`: `model.init_from`'s, or the preset's sized to the data."""
    if cfg.model.init_from:
        return AlbertConfig.from_json_file(Path(cfg.model.init_from) / "config.json")
    model_config = cfg.model.build(vocab_size=manifest["tokenizer"]["vocab_size"])
    if manifest["max_seq_length"] > model_config.max_position_embeddings:
        raise ConfigError(
            f"data max_seq_length ({manifest['max_seq_length']}) exceeds "
            f"model.max_position_embeddings ({model_config.max_position_embeddings})"
        )
    return model_config


def _summary(cfg: PretrainJobConfig, outcome: JobOutcome) -> list[str]:
    m = outcome.metrics
    return [
        f"done: step {m.get('step')}, mlm_accuracy {m.get('mlm_accuracy', float('nan')):.3f}, "
        f"sop_accuracy {m.get('sop_accuracy', float('nan')):.3f}",
        f"model: {outcome.model_dir}\nbest model: {outcome.best_model_dir}",
    ]


PRETRAIN = TrainingJob("pretrain", plan, lambda cfg: EncoderModel(), _summary, "pretrained")
