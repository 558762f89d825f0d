"""A pickle-only model directory given as `model.init_from`: refused unless the job opts in with
`model.allow_pickle`, which still loads it with weights_only=True."""

from __future__ import annotations

import pytest
import torch

from albert_dist.config import load_config
from albert_dist.data.config import PrepareMaskingSection
from albert_dist.errors import CheckpointError
from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist.pretrain.config import PretrainJobConfig
from albert_dist.pretrain.task import PretrainingSpec, PretrainingTask


def pretraining_task(init_from, allow_pickle: bool) -> PretrainingTask:
    """The workers' task as `pretrain` configures it, built outside Ray."""
    cfg = load_config(PretrainJobConfig, None, [f"model.init_from={init_from}", f"model.allow_pickle={allow_pickle}"])
    assert "allow_pickle" not in cfg.model.overrides()  # not an AlbertConfig field
    manifest = {
        "tokenizer": {"vocab_size": 60, "pad_id": 0, "mask_id": 4, "special_ids": [0, 1, 2, 3, 4]},
        "config": {"masking": PrepareMaskingSection().model_dump()},
    }  # what data prepare records
    spec = PretrainingSpec(
        prepared_dir="unused",
        manifest=manifest,
        model_config={},
        masking=cfg.masking,
        batch_size=8,
        max_seq_length=16,
        seed=0,
        eval_batches=1,
        has_eval=False,
        init_from=cfg.model.init_from,
        allow_pickle=cfg.model.allow_pickle,
    )
    return spec.build(rank=0, world_size=1, dataset=lambda _: None)


def test_init_from_a_pickle_needs_the_opt_in(tmp_path):
    model = AlbertForPreTraining(
        AlbertConfig(
            vocab_size=60,
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=48,
        )
    )
    model.config.to_json_file(tmp_path / "config.json")
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"refused.*model\.allow_pickle=true"):
        pretraining_task(tmp_path, allow_pickle=False).build_model()
    loaded = pretraining_task(tmp_path, allow_pickle=True).build_model()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0, msg=key)
