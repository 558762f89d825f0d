"""Our ALBERT against transformers': same outputs, and checkpoints that load both ways."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
import transformers

from albert_dist.model import (
    AlbertConfig,
    AlbertForMaskedLM,
    AlbertForPreTraining,
    AlbertForSequenceClassification,
    AlbertModel,
)

CONFIGS = {
    # Two groups of two blocks over 5 layers (groups 0,0,0,1,1), E != H.
    "grouped": dict(
        vocab_size=101,
        embedding_size=12,
        hidden_size=32,
        num_hidden_layers=5,
        num_hidden_groups=2,
        inner_group_num=2,
        num_attention_heads=4,
        intermediate_size=40,
    ),
    "shared_gelu": dict(
        vocab_size=64,
        embedding_size=24,
        hidden_size=24,
        num_hidden_layers=3,
        num_attention_heads=3,
        intermediate_size=30,
        hidden_act="gelu",
    ),
}
OURS_TO_HF = {
    AlbertForPreTraining: transformers.AlbertForPreTraining,
    AlbertForMaskedLM: transformers.AlbertForMaskedLM,
    AlbertForSequenceClassification: transformers.AlbertForSequenceClassification,
    AlbertModel: transformers.AlbertModel,
}
TOL = dict(atol=1e-5, rtol=1e-5)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights far from the init (LayerNorm gains != 1, non-zero biases), so a misplaced parameter shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g) * 0.1
            p.copy_(1 + noise if "LayerNorm.weight" in name or "layer_norm.weight" in name else noise)
    return model.eval()


def inputs(config: dict, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 13
    ids = torch.randint(5, config["vocab_size"], (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = 0
    types = (torch.arange(T) >= 6).long().expand(B, T) * mask
    labels = torch.where(torch.rand(B, T, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    labels[0, 2] = ids[0, 2]  # at least one
    labels[mask == 0] = -100
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types), labels


def hf_load(hf_cls, directory, **kwargs):
    model, info = hf_cls.from_pretrained(directory, attn_implementation="eager", output_loading_info=True, **kwargs)
    return model.eval(), info


def ours_pair(ours_cls, name: str, tmp_path, **config):
    """Our randomised model, saved, and transformers' model loaded from that directory."""
    ours = randomize(ours_cls(AlbertConfig(**CONFIGS[name], **config)))
    ours.save_pretrained(tmp_path)
    hf, info = hf_load(OURS_TO_HF[ours_cls], tmp_path)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return ours, hf


def hf_pair(ours_cls, name: str, tmp_path, **config):
    """transformers' randomised model, saved with its save_pretrained, and ours loaded from that directory."""
    hf_config = transformers.AlbertConfig(**CONFIGS[name], **config)
    hf = randomize(OURS_TO_HF[ours_cls](hf_config))
    hf.save_pretrained(tmp_path)
    hf, _ = hf_load(OURS_TO_HF[ours_cls], tmp_path)  # also checks transformers reads its own directory back
    return ours_cls.from_pretrained(tmp_path), hf


def pair(direction, *args, **kwargs):
    return (ours_pair if direction == "ours->hf" else hf_pair)(*args, **kwargs)


def check_hidden_states(ours_states, hf_states, mask):
    assert len(ours_states) == len(hf_states)
    real = mask.bool()
    for a, b in zip(ours_states, hf_states):
        torch.testing.assert_close(a[real], b[real], **TOL)


@pytest.mark.parametrize("direction", ["ours->hf", "hf->ours"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_pretraining_parity(direction, name, tmp_path):
    ours, hf = pair(direction, AlbertForPreTraining, name, tmp_path)
    x, labels = inputs(CONFIGS[name])
    sop = torch.tensor([0, 1, 1])
    with torch.no_grad():
        a = ours(**x, output_hidden_states=True)
        b = hf(**x, output_hidden_states=True)
        torch.testing.assert_close(a.prediction_logits, b.prediction_logits, **TOL)
        torch.testing.assert_close(a.sop_logits, b.sop_logits, **TOL)
        check_hidden_states(a.hidden_states, b.hidden_states, x["attention_mask"])

        a = ours(**x, labels=labels, sentence_order_label=sop)
        b = hf(**x, labels=labels, sentence_order_label=sop)
    hf_mlm = F.cross_entropy(b.prediction_logits.reshape(-1, b.prediction_logits.shape[-1]), labels.reshape(-1))
    torch.testing.assert_close(a.mlm_loss, hf_mlm, **TOL)
    torch.testing.assert_close(a.sop_loss, F.cross_entropy(b.sop_logits, sop), **TOL)
    torch.testing.assert_close(a.loss, b.loss, **TOL)
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits[labels != -100], **TOL)


@pytest.mark.parametrize("direction", ["ours->hf", "hf->ours"])
def test_masked_lm_parity(direction, tmp_path):
    ours, hf = pair(direction, AlbertForMaskedLM, "grouped", tmp_path)
    x, labels = inputs(CONFIGS["grouped"])
    with torch.no_grad():
        torch.testing.assert_close(ours(**x).logits, hf(**x).logits, **TOL)
        torch.testing.assert_close(ours(**x, labels=labels).loss, hf(**x, labels=labels).loss, **TOL)


@pytest.mark.parametrize("direction", ["ours->hf", "hf->ours"])
@pytest.mark.parametrize(
    "num_labels, labels",
    [(3, torch.tensor([2, 0, 1])), (1, torch.tensor([0.3, -1.2, 2.0]))],
    ids=["multiclass", "regression"],
)
def test_classification_parity(direction, num_labels, labels, tmp_path):
    ours, hf = pair(direction, AlbertForSequenceClassification, "grouped", tmp_path, num_labels=num_labels)
    assert ours.config.num_labels == hf.config.num_labels == num_labels
    x, _ = inputs(CONFIGS["grouped"])
    with torch.no_grad():
        a, b = ours(**x, labels=labels), hf(**x, labels=labels)
    torch.testing.assert_close(a.logits, b.logits, **TOL)
    torch.testing.assert_close(a.loss, b.loss, **TOL)


def test_hf_base_model_into_our_classifier(tmp_path, caplog):
    hf = randomize(transformers.AlbertModel(transformers.AlbertConfig(**CONFIGS["grouped"])))
    hf.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        ours = AlbertForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert "classifier.weight" in caplog.text and "classifier.bias" in caplog.text
    x, _ = inputs(CONFIGS["grouped"])
    with torch.no_grad():
        torch.testing.assert_close(ours.albert(**x).pooler_output, hf(**x).pooler_output, **TOL)
        expected = ours.classifier(hf(**x).pooler_output)
        torch.testing.assert_close(ours(**x).logits, expected, **TOL)


def test_hf_pretraining_checkpoint_into_our_base_model(tmp_path):
    _, hf = hf_pair(AlbertForPreTraining, "grouped", tmp_path)
    ours = AlbertModel.from_pretrained(tmp_path)
    x, _ = inputs(CONFIGS["grouped"])
    with torch.no_grad():
        a, b = ours(**x), hf.albert(**x)
    torch.testing.assert_close(a.pooler_output, b.pooler_output, **TOL)
    torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, **TOL)


def test_hf_config_reads_as_ours(tmp_path):
    hf_config = transformers.AlbertConfig(**CONFIGS["grouped"], num_labels=3)
    hf_config.save_pretrained(tmp_path)
    ours = AlbertConfig.from_json_file(tmp_path / "config.json")
    for key, value in ours.to_dict().items():
        if key != "architectures":
            assert getattr(hf_config, key) == value, key
    for key, value in transformers.AlbertConfig().to_dict().items():  # same defaults
        if hasattr(ours, key) and key not in ("architectures", "id2label", "label2id"):
            assert getattr(AlbertConfig(), key) == value, key
