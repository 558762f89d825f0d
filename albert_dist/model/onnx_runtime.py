"""An exported ALBERT (`albert-dist export`) run by onnxruntime, called as our PyTorch models are.

`OnnxModel(directory)` reads the export's `config.json` and `model.onnx`; `model(input_ids=..., attention_mask=...,
token_type_ids=...)` takes torch tensors or numpy arrays and returns the PyTorch head's output dataclass (`.logits`,
`.start_logits`/`.end_logits`, `.last_hidden_state`) holding torch tensors, so code written for the PyTorch model
reads it unchanged. The heads an export can hold, with their ONNX output names, are declared here once, for the
exporter and the runtime alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from albert_dist.errors import CheckpointError
from albert_dist.model.checkpoint import load_config
from albert_dist.model.config import AlbertConfig
from albert_dist.model.modeling import (
    AlbertForMaskedLM,
    AlbertForQuestionAnswering,
    AlbertForSequenceClassification,
    AlbertForTokenClassification,
    AlbertMaskedLMOutput,
    AlbertModel,
    AlbertModelOutput,
    AlbertQuestionAnsweringOutput,
    AlbertSequenceClassifierOutput,
)

MODEL_FILE = "model.onnx"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class OnnxHead:
    """One exportable head: the PyTorch class exported, its output dataclass, and the fields of that dataclass the
    ONNX graph outputs (under those names, in that order)."""

    model_class: type
    output_class: type
    outputs: tuple[str, ...]


ONNX_HEADS: dict[str, OnnxHead] = {
    "AlbertForSequenceClassification": OnnxHead(
        AlbertForSequenceClassification, AlbertSequenceClassifierOutput, ("logits",)
    ),
    "AlbertForTokenClassification": OnnxHead(AlbertForTokenClassification, AlbertSequenceClassifierOutput, ("logits",)),
    "AlbertForQuestionAnswering": OnnxHead(
        AlbertForQuestionAnswering, AlbertQuestionAnsweringOutput, ("start_logits", "end_logits")
    ),
    "AlbertForMaskedLM": OnnxHead(AlbertForMaskedLM, AlbertMaskedLMOutput, ("logits",)),
    "AlbertModel": OnnxHead(AlbertModel, AlbertModelOutput, ("last_hidden_state", "pooler_output")),
}
# Sentence-order prediction serves no inference task: a pretraining checkpoint is exported as its masked LM (fill-mask).
EXPORTED_AS = {"AlbertForPreTraining": "AlbertForMaskedLM"}


def exported_architecture(config: AlbertConfig, source: str | os.PathLike) -> str:
    """The head an export of a model with `config` holds (a key of ONNX_HEADS), from config.json's `architectures`."""
    architectures = config.architectures or []
    if not architectures:
        raise CheckpointError(
            f"{source}: config.json names no architectures, so the head to export is unknown; set "
            f'"architectures" to one of {", ".join([*ONNX_HEADS, *EXPORTED_AS])}'
        )
    name = EXPORTED_AS.get(architectures[0], architectures[0])
    if name not in ONNX_HEADS:
        raise CheckpointError(
            f"{source}: architecture {architectures[0]!r} cannot be exported; albert-dist exports "
            f"{', '.join([*ONNX_HEADS, *EXPORTED_AS])}"
        )
    return name


class OnnxModel:
    """An onnxruntime InferenceSession over an export directory, with the export's `config` (an AlbertConfig).

    `intra_op_num_threads` sets onnxruntime's threads per call (default: its own, one per core); `providers` its
    execution providers (default: the CPU's)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        intra_op_num_threads: int | None = None,
        providers: list[str] | None = None,
    ):
        import onnxruntime as ort

        self.directory = Path(directory)
        self.config = load_config(self.directory)
        self.architecture = exported_architecture(self.config, self.directory)
        self.head = ONNX_HEADS[self.architecture]
        path = self.directory / MODEL_FILE
        if not path.is_file():
            raise CheckpointError(f"{self.directory} holds no {MODEL_FILE}; is it an albert-dist export?")
        options = ort.SessionOptions()
        if intra_op_num_threads:
            options.intra_op_num_threads = intra_op_num_threads
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers or ["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own classes (Fail, InvalidGraph, ...) with no common base
            raise CheckpointError(f"onnxruntime cannot load {path}: {err}") from err
        self.outputs = [o.name for o in self.session.get_outputs()]
        inputs = [i.name for i in self.session.get_inputs()]
        if set(INPUT_NAMES) - set(inputs) or set(self.outputs) - set(self.head.outputs):
            raise CheckpointError(
                f"{path} does not hold {self.architecture}: its inputs are {', '.join(inputs)} and its outputs "
                f"{', '.join(self.outputs)}, where {', '.join(INPUT_NAMES)} and {', '.join(self.head.outputs)} "
                "were expected"
            )

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None):
        """The head's output dataclass for one batch; a missing mask attends everywhere, missing token types are 0."""
        ids = _int64(input_ids)
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids) if attention_mask is None else _int64(attention_mask),
            "token_type_ids": np.zeros_like(ids) if token_type_ids is None else _int64(token_type_ids),
        }
        values = self.session.run(self.outputs, feeds)
        return self.head.output_class(**{name: torch.from_numpy(v) for name, v in zip(self.outputs, values)})


def _int64(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.ascontiguousarray(values, dtype=np.int64)
