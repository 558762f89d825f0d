"""Job arguments shared by the cluster tests: a small corpus prepared fast, a tiny model trained a few steps."""

from __future__ import annotations


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def prepare_args(corpus) -> list[str]:
    return [
        "--config",
        "jobs/configs/prepare_data.yaml",
        *sets(
            f"data.inputs=[{corpus}]",
            "data.format=blocks",
            "data.max_seq_length=64",
            "data.dupe_factor=1",
            "data.eval_fraction=0.1",
            "data.tokenizer_actors=1",
            "tokenizer.vocab_size=1000",
        ),
    ]


def pretrain_args(name: str, steps: int) -> list[str]:
    """Hidden 64, 2 layers, fp32, 2 Train workers of half a CPU; one evaluation, at the end."""
    return [
        "--config",
        "jobs/configs/pretrain_tiny.yaml",
        *sets(
            f"run.name={name}",
            "model.hidden_size=64",
            "model.num_hidden_layers=2",
            "model.num_attention_heads=2",
            "model.intermediate_size=128",
            "train.precision=fp32",
            "scaling.num_workers=2",
            "scaling.cpus_per_worker=0.5",
            f"train.max_steps={steps}",
            "train.warmup_steps=2",
            "train.batch_size=8",
            "train.log_every=4",
            f"train.eval_every={steps}",
            f"train.checkpoint_every={steps // 2}",
            "train.eval_batches=2",
        ),
    ]
