"""ALBERT in plain PyTorch, checkpoint-compatible with transformers."""

from albert_dist.model.checkpoint import from_pretrained, load_state_dict, save_pretrained
from albert_dist.model.config import PRESETS, AlbertConfig
from albert_dist.model.modeling import (
    IGNORE_INDEX,
    AlbertForMaskedLM,
    AlbertForPreTraining,
    AlbertForQuestionAnswering,
    AlbertForSequenceClassification,
    AlbertForTokenClassification,
    AlbertMaskedLMOutput,
    AlbertModel,
    AlbertModelOutput,
    AlbertPreTrainedModel,
    AlbertPreTrainingOutput,
    AlbertQuestionAnsweringOutput,
    AlbertSequenceClassifierOutput,
    head_task,
    layer_to_group,
)

__all__ = [
    "PRESETS",
    "AlbertConfig",
    "AlbertForMaskedLM",
    "AlbertForPreTraining",
    "AlbertForQuestionAnswering",
    "AlbertForSequenceClassification",
    "AlbertForTokenClassification",
    "AlbertMaskedLMOutput",
    "AlbertModel",
    "AlbertModelOutput",
    "AlbertPreTrainedModel",
    "AlbertPreTrainingOutput",
    "AlbertQuestionAnsweringOutput",
    "AlbertSequenceClassifierOutput",
    "IGNORE_INDEX",
    "from_pretrained",
    "head_task",
    "layer_to_group",
    "load_state_dict",
    "save_pretrained",
]
