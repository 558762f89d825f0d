"""ALBERT hyper-parameters, with the field names and defaults of `transformers.AlbertConfig`.

config.json written here is read by transformers and vice versa.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from albert_dist.errors import ConfigError

ACTIVATIONS = ("gelu_new", "gelu", "gelu_fast", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")

# Sizes from the ALBERT paper (all E=128, one shared group) and brightmart's Chinese tiny model.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(num_hidden_layers=4, hidden_size=312, num_attention_heads=12, intermediate_size=1248),
    "base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    "large": dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
    "xlarge": dict(num_hidden_layers=24, hidden_size=2048, num_attention_heads=16, intermediate_size=8192),
    "xxlarge": dict(num_hidden_layers=12, hidden_size=4096, num_attention_heads=64, intermediate_size=16384),
}


@dataclass
class AlbertConfig:
    vocab_size: int = 30000
    embedding_size: int = 128
    hidden_size: int = 4096
    num_hidden_layers: int = 12
    num_hidden_groups: int = 1
    num_attention_heads: int = 64
    intermediate_size: int = 16384
    inner_group_num: int = 1
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    classifier_dropout_prob: float = 0.1
    pad_token_id: int = 0
    bos_token_id: int = 2
    eos_token_id: int = 3
    # Sequence classification. id2label defaults to LABEL_0..LABEL_{num_labels-1}; when given it sets num_labels.
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    problem_type: str | None = None  # regression | single_label_classification | multi_label_classification
    architectures: list[str] | None = None

    model_type = "albert"

    def __post_init__(self) -> None:
        if self.id2label:
            self.id2label = {int(k): v for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)
        else:
            self.id2label = {i: f"LABEL_{i}" for i in range(self.num_labels)}
        if not self.label2id or len(self.label2id) != self.num_labels:
            self.label2id = {v: k for k, v in self.id2label.items()}
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first field that cannot work."""
        for name in (
            "vocab_size",
            "embedding_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "inner_group_num",
            "max_position_embeddings",
            "type_vocab_size",
            "num_labels",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} ({value!r}) must be a positive integer")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if not (isinstance(self.num_hidden_groups, int) and 1 <= self.num_hidden_groups <= self.num_hidden_layers):
            raise ConfigError(
                f"num_hidden_groups ({self.num_hidden_groups!r}) must be between 1 and "
                f"num_hidden_layers ({self.num_hidden_layers})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act ({self.hidden_act!r}) must be one of {', '.join(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout_prob"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ConfigError(f"{name} ({value!r}) must be in [0, 1)")
        if not (isinstance(self.initializer_range, (int, float)) and self.initializer_range > 0):
            raise ConfigError(f"initializer_range ({self.initializer_range!r}) must be positive")
        if not (isinstance(self.layer_norm_eps, (int, float)) and self.layer_norm_eps > 0):
            raise ConfigError(f"layer_norm_eps ({self.layer_norm_eps!r}) must be positive")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"pad_token_id ({self.pad_token_id}) must be in [0, vocab_size={self.vocab_size})")
        problem_types = (None, "regression", "single_label_classification", "multi_label_classification")
        if self.problem_type not in problem_types:
            raise ConfigError(f"problem_type ({self.problem_type!r}) must be one of {problem_types[1:]} or null")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> AlbertConfig:
        if name not in PRESETS:
            raise ConfigError(f"unknown ALBERT preset {name!r}; choose one of {', '.join(PRESETS)}")
        return cls(**{"embedding_size": 128, **PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> AlbertConfig:
        """Build from a dict such as transformers' config.json; keys we do not model are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in {**data, **overrides}.items() if k in known}
        if "num_labels" in overrides and len(kwargs.get("id2label") or {}) != overrides["num_labels"]:
            kwargs.pop("id2label", None)
            kwargs.pop("label2id", None)
        return cls(**kwargs)

    def to_json_file(self, path: str | os.PathLike) -> None:
        data = {"model_type": self.model_type, **self.to_dict()}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, **overrides: Any) -> AlbertConfig:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("model_type", "albert") != "albert":
            raise ConfigError(f"{path}: model_type is {data['model_type']!r}, expected 'albert'")
        return cls.from_dict(data, **overrides)
