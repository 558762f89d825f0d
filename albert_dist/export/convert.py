"""A PyTorch ALBERT head to an ONNX file, and that file to int8 or fp16.

The exporter is torch.onnx's torch.export-based one (`dynamo=True`), this torch's default: it names the batch and
sequence axes as dynamic dimensions (the sequence bounded by `max_position_embeddings`, where the position
embeddings' length check becomes a bound instead of a constant of the trace), and our masked SDPA path comes out
exact (max abs diff ~1e-7). The TorchScript exporter (`dynamo=False`) gives the same numbers but is deprecated here,
and freezes that length check at the sample's length with a TracerWarning.

From opset 23 on, SDPA is written as ONNX's own `Attention` operator: one kernel in onnxruntime (1.23 and newer)
instead of the matmuls, softmax and two `Where`s over a [B, heads, T, T] tensor that lower opsets write.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import warnings
from pathlib import Path

import torch
from onnx_ir.passes.common import ClearMetadataAndDocStringPass
from torch import nn

from albert_dist.errors import ConfigError
from albert_dist.model.config import AlbertConfig
from albert_dist.model.modeling import AlbertLayer
from albert_dist.model.onnx_runtime import INPUT_NAMES

DEFAULT_OPSET = 23
MIN_OPSET = 18  # the torch.export-based exporter writes nothing older
ATTENTION_OPSET = 23  # ONNX's Attention operator
# int8: the weights of these operators (the encoder's and heads' matmuls; Gather: the embedding tables, most of an
# ALBERT's parameters), per output channel; activations are quantized per batch as they come (dynamic quantization).
INT8_OPERATORS = ("MatMul", "Gemm", "Gather")
INT8_PER_CHANNEL = True


class _Outputs(nn.Module):
    """The head called with the three inputs by name, its output dataclass as a tuple of the exported fields."""

    def __init__(self, model: nn.Module, outputs: tuple[str, ...]):
        super().__init__()
        self.model, self.outputs = model, outputs

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(getattr(out, name) for name in self.outputs)


class _SquareMask(nn.Module):
    """An attention block given its key mask expanded from [B, 1, 1, T] to [B, 1, T, T]: same values, but
    onnxruntime's CPU kernel of ONNX Attention refuses a mask whose query axis is broadcast."""

    def __init__(self, attention: nn.Module):
        super().__init__()
        self.attention = attention

    def forward(self, x, mask):
        if mask is not None:
            mask = mask.expand(-1, -1, x.shape[1], -1)
        return self.attention(x, mask)


def sample_inputs(config: AlbertConfig, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Random ids with [CLS]-like first tokens, two segments and right padding of varying length (row 0 unpadded)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, config.vocab_size, (batch, length), generator=generator)
    lengths = torch.randint(max(1, length // 3), length + 1, (batch,), generator=generator)
    lengths[0] = length
    attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    token_type_ids = ((torch.arange(length)[None, :] >= lengths[:, None] // 2) & attention_mask.bool()).long()
    token_type_ids = token_type_ids.clamp(max=config.type_vocab_size - 1)
    input_ids = torch.where(attention_mask.bool(), input_ids, config.pad_token_id)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def exported_outputs(model: nn.Module, names: tuple[str, ...], inputs: dict[str, torch.Tensor]) -> tuple[str, ...]:
    """Those of `names` the model returns (AlbertModel's pooler output only where it has a pooler)."""
    with torch.no_grad():
        out = model(**inputs)
    return tuple(name for name in names if getattr(out, name) is not None)


def check_opset(opset: int) -> None:
    import onnx

    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ConfigError(
            f"--opset {opset} is out of range: torch.onnx writes opsets {MIN_OPSET} to {newest} (the onnx package's "
            f"newest); {DEFAULT_OPSET} by default"
        )


def to_onnx(model: nn.Module, outputs: tuple[str, ...], path: Path, opset: int = DEFAULT_OPSET) -> None:
    """Write `model` (eval mode, fp32) to `path` with inputs INPUT_NAMES and `outputs`, batch and sequence dynamic."""
    config = model.config
    model = copy.deepcopy(model).eval()
    if opset >= ATTENTION_OPSET:
        for layer in [m for m in model.modules() if isinstance(m, AlbertLayer)]:
            layer.attention = _SquareMask(layer.attention)
    sample = sample_inputs(config, 2, min(16, config.max_position_embeddings), seed=0)
    batch = torch.export.Dim("batch")
    sequence = torch.export.Dim("sequence", max=config.max_position_embeddings)
    with _quiet_exporter():
        program = torch.onnx.export(
            _Outputs(model, outputs).eval(),
            tuple(sample[name] for name in INPUT_NAMES),
            input_names=list(INPUT_NAMES),
            output_names=list(outputs),
            dynamic_shapes={name: {0: batch, 1: sequence} for name in INPUT_NAMES},
            opset_version=opset,
            dynamo=True,
            verbose=False,
        )
    # The tracer's notes on every node (stack traces naming this machine's paths, module names) do not ship.
    ClearMetadataAndDocStringPass()(program.model)
    program.save(str(path))


def to_int8(source: Path, path: Path, config: AlbertConfig) -> None:
    """onnxruntime's transformer fusions (LayerNorm with its residual, bias with GELU), then dynamic int8
    quantization of INT8_OPERATORS' weights. Fusing first matters: quantized matmuls hide the patterns the fusions
    match."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    with _quiet_exporter():
        fused = optimizer.optimize_model(
            str(source),
            model_type="bert",
            num_heads=config.num_attention_heads,
            hidden_size=config.hidden_size,
            # onnxruntime's basic level (constant folding, redundant nodes) first: it leaves no kernel choice of one
            # machine's in the graph, and types every tensor again, which the quantizer needs after the fusions
            opt_level=1,
        )
        fused_path = source.with_name("fused.onnx")
        fused.save_model_to_file(str(fused_path))
        quantize_dynamic(
            fused_path,
            path,
            weight_type=QuantType.QInt8,
            per_channel=INT8_PER_CHANNEL,
            op_types_to_quantize=list(INT8_OPERATORS),
        )


def to_fp16(source: Path, path: Path) -> None:
    """fp16 weights and activations through onnxruntime's float16 converter; inputs and outputs stay int64/fp32."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with _quiet_exporter():
        onnx.save(convert_float_to_float16(onnx.load(str(source)), keep_io_types=True), str(path))


@contextlib.contextmanager
def _quiet_exporter():
    """The exporters' progress lines, warnings and advice ("[torch.onnx] ...", quantization pre-processing hints,
    torchvision not installed) off the console: the export prints its own summary."""
    loggers = [logging.getLogger(name) for name in ("", "torch.onnx", "onnxruntime", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with (
            open(os.devnull, "w") as devnull,
            contextlib.redirect_stdout(devnull),
            warnings.catch_warnings(action="ignore"),
        ):
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
