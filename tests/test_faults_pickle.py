"""A pickle-only model directory given as `model.init_from` (as the albert_chinese_* checkpoints ship): loaded with
weights_only=True and converted once to safetensors, with no opt-in; the retired opt-in key says so."""

from __future__ import annotations

import pytest
import torch

from albert_dist.config import load_config
from albert_dist.data.config import PrepareMaskingSection
from albert_dist.errors import ConfigError
from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist.pretrain.config import PretrainJobConfig
from albert_dist.pretrain.task import PretrainingSpec, PretrainingTask


def pretraining_task(init_from) -> PretrainingTask:
    """The workers' task as `pretrain` configures it, built outside Ray."""
    cfg = load_config(PretrainJobConfig, None, [f"model.init_from={init_from}"])
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
    )
    return spec.build(rank=0, world_size=1, dataset=lambda _: None)


def test_init_from_a_pickle_loads_its_tied_weights_without_an_opt_in(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
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
    state = model.state_dict()
    # as older transformers saved it: the decoder shares the word embeddings' storage in the pickle
    state["predictions.decoder.weight"] = state["albert.embeddings.word_embeddings.weight"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = pretraining_task(tmp_path).build_model()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0, msg=key)
    assert len(list((tmp_path / "cache" / "albert-dist" / "safetensors").glob("*.safetensors"))) == 1


def test_the_retired_opt_in_is_named_with_why():
    with pytest.raises(ConfigError, match=r"model\.allow_pickle.*weights_only=True.*safetensors"):
        load_config(PretrainJobConfig, None, ["model.allow_pickle=true"])
