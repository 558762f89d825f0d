"""Unit tests of the ALBERT model package (no transformers needed)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F

from albert_dist.errors import CheckpointError, ConfigError
from albert_dist.model import (
    AlbertConfig,
    AlbertForMaskedLM,
    AlbertForPreTraining,
    AlbertForSequenceClassification,
    AlbertModel,
    layer_to_group,
)
from albert_dist.storage import sha256_file

SMALL = dict(
    vocab_size=97, embedding_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48
)


def small_config(**overrides) -> AlbertConfig:
    return AlbertConfig(**{**SMALL, **overrides})


def batch(config: AlbertConfig, B: int = 3, T: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, config.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    ids[mask == 0] = config.pad_token_id
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 2 :] = 1
    labels = torch.full((B, T), -100)
    labels[0, 1], labels[0, 5], labels[1, 2], labels[2, 3] = 11, 12, 13, 14
    return ids, mask, types, labels


# ---------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "overrides, field",
    [
        (
            dict(hidden_size=100, num_attention_heads=12),
            "hidden_size (100) must be divisible by num_attention_heads (12)",
        ),
        (dict(num_hidden_groups=5), "num_hidden_groups"),
        (dict(num_hidden_groups=0), "num_hidden_groups"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(intermediate_size=-1), "intermediate_size"),
        (dict(hidden_act="gelu_magic"), "hidden_act"),
        (dict(hidden_dropout_prob=1.0), "hidden_dropout_prob"),
        (dict(attention_probs_dropout_prob=-0.1), "attention_probs_dropout_prob"),
        (dict(problem_type="ranking"), "problem_type"),
    ],
)
def test_config_validation_names_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        small_config(**overrides)
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)


def test_config_json_round_trip_ignores_unknown_keys(tmp_path):
    config = small_config(num_hidden_groups=2, id2label={0: "neg", 1: "neu", 2: "pos"})
    assert config.num_labels == 3 and config.label2id == {"neg": 0, "neu": 1, "pos": 2}
    path = tmp_path / "config.json"
    config.to_json_file(path)
    data = json.loads(path.read_text())
    assert data["model_type"] == "albert" and data["id2label"]["2"] == "pos"
    data.update(transformers_version="5.0", architectures=["AlbertForSequenceClassification"], dtype="float32")
    path.write_text(json.dumps(data))
    loaded = AlbertConfig.from_json_file(path)
    assert loaded.id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert loaded.architectures == ["AlbertForSequenceClassification"]
    assert loaded.to_dict() == {**config.to_dict(), "architectures": ["AlbertForSequenceClassification"]}
    assert AlbertConfig.from_dict(data, num_labels=5).id2label == {i: f"LABEL_{i}" for i in range(5)}


def test_tiny_preset_is_brightmarts():
    c = AlbertConfig.from_preset("tiny", vocab_size=21128)
    assert (
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        c.intermediate_size,
        c.embedding_size,
        c.vocab_size,
    ) == (4, 312, 12, 1248, 128, 21128)
    with pytest.raises(ConfigError, match="preset"):
        AlbertConfig.from_preset("huge")


@pytest.mark.parametrize("preset, millions", [("base", 12), ("large", 18), ("xlarge", 60), ("xxlarge", 235)])
def test_preset_parameter_counts_match_the_paper(preset, millions):
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = AlbertModel(AlbertConfig.from_preset(preset))
    assert model.num_parameters() / 1e6 == pytest.approx(millions, rel=0.06)


# ---------------------------------------------------------------------------------------------------- model


def test_layer_to_group_mapping():
    assert [layer_to_group(i, 12, 1) for i in range(12)] == [0] * 12
    assert [layer_to_group(i, 12, 3) for i in range(12)] == [0] * 4 + [1] * 4 + [2] * 4
    assert [layer_to_group(i, 4, 4) for i in range(4)] == [0, 1, 2, 3]
    assert [layer_to_group(i, 5, 2) for i in range(5)] == [0, 0, 0, 1, 1]


def test_encoder_applies_groups_in_order_with_inner_layers():
    model = AlbertModel(small_config(num_hidden_layers=6, num_hidden_groups=3, inner_group_num=2)).eval()
    calls = []
    for g, group in enumerate(model.encoder.albert_layer_groups):
        for k, layer in enumerate(group.albert_layers):
            layer.register_forward_hook(lambda *_, g=g, k=k: calls.append((g, k)))
    ids, mask, types, _ = batch(model.config)
    out = model(ids, mask, types, output_hidden_states=True)
    assert calls == [(g, k) for g in (0, 0, 1, 1, 2, 2) for k in (0, 1)]
    assert len(out.hidden_states) == 1 + 6 * 2  # mapped embeddings + one per block, as transformers
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)


def test_hidden_states_count_without_inner_groups():
    model = AlbertForPreTraining(small_config()).eval()
    ids, mask, types, _ = batch(model.config)
    out = model(ids, mask, types, output_hidden_states=True)
    assert len(out.hidden_states) == 4 + 1
    embedded = model.albert.encoder.embedding_hidden_mapping_in(model.albert.embeddings(ids, types))
    torch.testing.assert_close(out.hidden_states[0], embedded)
    assert model(ids).hidden_states is None


def test_decoder_is_tied_to_word_embeddings():
    torch.manual_seed(0)
    model = AlbertForPreTraining(small_config()).eval()
    keys = model.state_dict().keys()
    assert not any(k.startswith("predictions.decoder") for k in keys)
    assert "predictions.bias" in keys and "albert.embeddings.word_embeddings.weight" in keys
    ids, mask, types, labels = batch(model.config)
    out = model(ids, mask, types, labels=labels)
    out.mlm_loss.backward()
    emb = model.albert.embeddings.word_embeddings.weight
    # Only masked rows go through the decoder, so every vocabulary row gets a decoder gradient.
    assert (emb.grad[50:] != 0).all()
    with torch.no_grad():
        emb[11] += torch.randn(emb.shape[1])  # 11 is a label, not an input id: only the decoder sees it
    changed = model(ids, mask, types, labels=labels).prediction_logits != out.prediction_logits
    assert changed[:, 11].all() and not changed[:, :11].any()


@pytest.mark.parametrize("cls", [AlbertForPreTraining, AlbertForMaskedLM])
def test_mlm_head_on_masked_rows_equals_full_computation(cls):
    torch.manual_seed(0)
    model = cls(small_config(num_hidden_groups=2)).eval()
    ids, mask, types, labels = batch(model.config)
    full = model(ids, mask, types)
    part = model(ids, mask, types, labels=labels)
    full_logits = full.prediction_logits if cls is AlbertForPreTraining else full.logits
    part_logits = part.prediction_logits if cls is AlbertForPreTraining else part.logits
    mlm_loss = part.mlm_loss if cls is AlbertForPreTraining else part.loss
    assert full_logits.shape == (3, 10, 97) and part_logits.shape == (4, 97)
    torch.testing.assert_close(part_logits, full_logits[labels != -100])
    assert part.mlm_labels.tolist() == [11, 12, 13, 14]
    expected = F.cross_entropy(full_logits.reshape(-1, 97), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(mlm_loss, expected)


def test_pretraining_loss_is_mlm_plus_sop():
    model = AlbertForPreTraining(small_config()).eval()
    ids, mask, types, labels = batch(model.config)
    sop = torch.tensor([0, 1, 1])
    out = model(ids, mask, types, labels=labels, sentence_order_label=sop)
    torch.testing.assert_close(out.sop_loss, F.cross_entropy(out.sop_logits, sop))
    torch.testing.assert_close(out.loss, out.mlm_loss + out.sop_loss)
    assert model(ids, mask, types).loss is None


def test_padding_does_not_leak_into_real_tokens():
    model = AlbertModel(small_config()).eval()
    ids, mask, types, _ = batch(model.config)
    out = model(ids, mask, types).last_hidden_state
    other = ids.clone()
    other[mask == 0] = 42  # whatever sits in the padding must not matter
    out2 = model(other, mask, types).last_hidden_state
    torch.testing.assert_close(out[mask.bool()], out2[mask.bool()])
    assert not torch.allclose(model(other, None, types).last_hidden_state[1, :7], out[1, :7])
    full = torch.ones_like(mask)
    torch.testing.assert_close(model(ids, full, types).last_hidden_state, model(ids, None, types).last_hidden_state)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    config = small_config(
        num_hidden_groups=2, inner_group_num=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1
    )
    model = AlbertForPreTraining(config).train()
    ids, mask, types, labels = batch(model.config)
    sop = torch.tensor([0, 1, 0])

    def grads():
        torch.manual_seed(1)  # same dropout masks; recomputation must replay them
        model.zero_grad()
        model(ids, mask, types, labels=labels, sentence_order_label=sop).loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    model.gradient_checkpointing_enable()
    assert model.gradient_checkpointing and model.albert.encoder.gradient_checkpointing
    for a, b in zip(plain, grads()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "num_labels, labels, reference",
    [
        (3, torch.tensor([0, 2, 1]), lambda logits, y: F.cross_entropy(logits, y)),
        (1, torch.tensor([0.5, -1.0, 2.0]), lambda logits, y: F.mse_loss(logits.squeeze(-1), y)),
        (2, torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]), F.binary_cross_entropy_with_logits),
    ],
)
def test_classification_losses(num_labels, labels, reference):
    model = AlbertForSequenceClassification(small_config(num_labels=num_labels)).eval()
    ids, mask, types, _ = batch(model.config)
    out = model(ids, mask, types, labels=labels)
    assert out.logits.shape == (3, num_labels)
    torch.testing.assert_close(out.loss, reference(out.logits, labels))


def test_weight_init_follows_transformers():
    torch.manual_seed(0)
    model = AlbertForPreTraining(AlbertConfig.from_preset("tiny", vocab_size=2000))
    emb = model.albert.embeddings.word_embeddings.weight
    assert emb[0].abs().sum() == 0  # padding row
    assert emb[1:].std().item() == pytest.approx(0.02, rel=0.05)
    layer = model.albert.encoder.albert_layer_groups[0].albert_layers[0]
    assert layer.ffn.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert (layer.ffn.bias == 0).all() and (model.predictions.bias == 0).all()
    assert (layer.full_layer_layer_norm.weight == 1).all()


# ---------------------------------------------------------------------------------------------------- checkpoints


def test_save_and_load_round_trip_keeps_other_files(tmp_path):
    model = AlbertForPreTraining(small_config(num_hidden_groups=2)).eval()
    (tmp_path / "spiece.model").write_bytes(b"tokenizer")
    model.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)  # overwriting is fine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors", "spiece.model"]
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["AlbertForPreTraining"]
    loaded = AlbertForPreTraining.from_pretrained(tmp_path)
    assert not loaded.training
    ids, mask, types, _ = batch(model.config)
    torch.testing.assert_close(loaded(ids, mask, types).prediction_logits, model(ids, mask, types).prediction_logits)


def test_missing_checkpoint_pieces_raise_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match=str(tmp_path / "nope")):
        AlbertForPreTraining.from_pretrained(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="config.json"):
        AlbertForPreTraining.from_pretrained(tmp_path)
    small_config().to_json_file(tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        AlbertForPreTraining.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        AlbertForPreTraining.from_pretrained(tmp_path)


def test_pickle_weights_load_with_weights_only_through_a_safetensors_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model_dir = tmp_path / "model"
    model = AlbertForSequenceClassification(small_config()).eval()
    model_dir.mkdir()
    model.config.to_json_file(model_dir / "config.json")
    torch.save(model.state_dict(), model_dir / "pytorch_model.bin")
    loaded = AlbertForSequenceClassification.from_pretrained(model_dir)
    ids, mask, types, _ = batch(model.config)
    torch.testing.assert_close(loaded(ids, mask, types).logits, model(ids, mask, types).logits)
    (copy,) = (tmp_path / "cache" / "albert-dist" / "safetensors").iterdir()
    assert copy.name == f"{sha256_file(model_dir / 'pytorch_model.bin')}.safetensors"
    # converted once: a later load reads the copy and never unpickles again
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("unpickled a second time"))
    AlbertForSequenceClassification.from_pretrained(model_dir)
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # anything beyond plain tensors is refused rather than unpickled
    torch.save({"payload": logging.getLogger("x")}, model_dir / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="cannot read the weights"):
        AlbertForSequenceClassification.from_pretrained(model_dir)
    # safetensors beside the pickle wins
    model.save_pretrained(model_dir)
    AlbertForSequenceClassification.from_pretrained(model_dir)


def test_base_checkpoint_into_classifier_warns_about_new_head(tmp_path, caplog):
    base = AlbertModel(small_config()).eval()
    base.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        clf = AlbertForSequenceClassification.from_pretrained(tmp_path, num_labels=4)
    assert "classifier.weight" in caplog.text and "albert." not in caplog.text.replace("albert_dist", "")
    assert clf.classifier.out_features == 4
    ids, mask, types, _ = batch(base.config)
    torch.testing.assert_close(clf.albert(ids, mask, types).pooler_output, base(ids, mask, types).pooler_output)
    # And back: the base model takes the backbone of a model with heads.
    clf.save_pretrained(tmp_path / "clf")
    again = AlbertModel.from_pretrained(tmp_path / "clf")
    torch.testing.assert_close(again(ids, mask, types).pooler_output, base(ids, mask, types).pooler_output)


def test_incompatible_checkpoints_raise(tmp_path):
    AlbertForSequenceClassification(small_config(num_labels=3)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"classifier\.\w+ has shape"):
        AlbertForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    config["num_hidden_groups"] = 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="backbone weights"):
        AlbertForSequenceClassification.from_pretrained(tmp_path)


def test_flops_count_a_shared_layer_once_per_use():
    """ALBERT's sharing saves parameters, not compute: 4 layers sharing one group cost what 4 unshared cost."""
    shared = AlbertForPreTraining(small_config(num_hidden_groups=1))
    unshared = AlbertForPreTraining(small_config(num_hidden_groups=4))
    assert shared.num_parameters() < unshared.num_parameters()
    assert shared.effective_parameters() == unshared.effective_parameters() == unshared.num_parameters()
    T, c = 64, shared.config
    assert shared.flops_per_token(T) == 3 * shared.flops_per_token(T, training=False)
    assert shared.flops_per_token(T) - shared.flops_per_token(0) == 12 * c.num_hidden_layers * c.hidden_size * T
    assert shared.flops_per_token(0) == 6 * unshared.num_parameters()
