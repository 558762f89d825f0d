"""ALBERT-aware learning rates: one scale per embeddings, shared layer group and head.

What "layer-wise" means for ALBERT: every layer mapped to a group applies the *same* weights, so learning rates
(and freezing) can only differ between groups, never between layers of a group. With the usual single shared
group (`num_hidden_groups=1`), layer-wise decay collapses to three rates: embeddings, encoder, head; and
"freeze the first 10 layers" is meaningless, since they are the last layers too. With `layer_lr_decay` d and G
groups the scales are

    head (classifier + pooler) ×1, group G-1 ×d, group G-2 ×d², …, group 0 ×d^G, embeddings ×d^(G+1)

where "embeddings" holds the word/position/type embeddings, their LayerNorm and the E→H mapping into the
encoder. `overrides` replace single scales; a scale of 0 freezes the group (`optim.parameter_groups`).
"""

from __future__ import annotations

import re

import torch

from albert_dist.errors import ConfigError
from albert_dist.train import optim

_GROUP = re.compile(r"(?:^|\.)albert_layer_groups\.(\d+)\.")
_EMBEDDINGS = re.compile(r"(?:^|\.)(embeddings\.|encoder\.embedding_hidden_mapping_in\.)")


def group_of(name: str) -> str:
    """The lr group of a parameter name: "embeddings", "group<k>" or "head" (everything after the encoder:
    pooler, classifier, a distillation projection)."""
    match = _GROUP.search(name)
    if match:
        return f"group{match[1]}"
    if _EMBEDDINGS.search(name):
        return "embeddings"
    return "head"


def lr_scales(num_hidden_groups: int, decay: float, overrides: dict[str, float] | None = None) -> dict[str, float]:
    """Scale of every lr group; `overrides` must name groups the model has."""
    G = num_hidden_groups
    scales = {"head": 1.0, "embeddings": decay ** (G + 1)}
    scales.update({f"group{g}": decay ** (G - g) for g in range(G)})
    unknown = sorted(set(overrides or {}) - set(scales))
    if unknown:
        raise ConfigError(
            f"finetune.lr_scales names {', '.join(unknown)}, but the model has the groups {', '.join(sorted(scales))}"
        )
    return {**scales, **(overrides or {})}


def albert_parameter_groups(
    model: torch.nn.Module,
    num_hidden_groups: int,
    weight_decay: float,
    decay: float,
    overrides: dict[str, float] | None = None,
) -> list[dict]:
    """Optimizer groups of `model` (decay/no-decay × lr group) with their `lr_scale`; scale-0 groups frozen."""
    return optim.parameter_groups(
        model.named_parameters(),
        weight_decay,
        lr_scale=lr_scales(num_hidden_groups, decay, overrides),
        group_of=group_of,
    )
