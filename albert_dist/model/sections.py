"""The `model:` sections: a model to start from (fine-tuning's) and pretraining's preset plus overrides."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from albert_dist.config import Section, local_path
from albert_dist.errors import ConfigError


class PretrainedModelSection(Section):
    """A model to start from and the dropout to train it with: fine-tuning's `model:` (its shape is init_from's).
    `None` keeps the model's value."""

    init_from: str | None = Field(
        None,
        description="A model directory (ours or transformers') to start from, or a Hugging Face Hub model id "
        "(org/name, org/name@revision) read through huggingface_hub's cache.",
    )
    hidden_dropout_prob: float | None = Field(None, ge=0, lt=1)
    attention_probs_dropout_prob: float | None = Field(None, ge=0, lt=1)
    classifier_dropout_prob: float | None = Field(None, ge=0, lt=1)

    _local_init_from = field_validator("init_from")(classmethod(lambda cls, value: local_path(value)))

    def overrides(self) -> dict[str, Any]:
        fields = self.model_dump(exclude={"preset", "init_from"})
        return {k: v for k, v in fields.items() if v is not None}


class ModelSection(PretrainedModelSection):
    """Pretraining's `model:`, a preset plus field overrides (`None` keeps the preset's value), or init_from as it
    is. Field names as transformers.AlbertConfig."""

    preset: Literal["tiny", "base", "large", "xlarge", "xxlarge"] = "tiny"
    embedding_size: int | None = Field(None, gt=0)
    hidden_size: int | None = Field(None, gt=0)
    num_hidden_layers: int | None = Field(None, gt=0)
    num_hidden_groups: int | None = Field(None, gt=0)
    num_attention_heads: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)
    inner_group_num: int | None = Field(None, gt=0)
    hidden_act: str | None = None
    max_position_embeddings: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _init_from_keeps_its_config(self) -> ModelSection:
        if self.init_from and self.overrides():
            raise ValueError(
                f"{', '.join(sorted(self.overrides()))} cannot be set with init_from: pretraining "
                f"continues {self.init_from} with its own config.json"
            )
        return self

    def build(self, vocab_size: int, **extra: Any):
        """The `AlbertConfig` for this section; model validation errors are reported as config errors."""
        from albert_dist.model import AlbertConfig

        try:
            return AlbertConfig.from_preset(self.preset, vocab_size=vocab_size, **self.overrides(), **extra)
        except ConfigError as err:
            raise ConfigError(f"model: {err}") from None


PretrainedModelSection.key_hints = dict.fromkeys(
    set(ModelSection.model_fields) - set(PretrainedModelSection.model_fields),
    "the model's shape is model.init_from's; fine-tuning can change its dropout",
) | {
    "allow_pickle": "an init_from holding only pytorch_model.bin needs no opt-in: it is read once with "
    "torch.load(weights_only=True) and converted to safetensors"
}
