"""Mixed precision: bf16 autocast on CPU and GPU, fp16 autocast with a GradScaler on GPU, or plain fp32."""

from __future__ import annotations

import contextlib

import torch

from albert_dist.errors import ConfigError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: torch.device) -> None:
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision=fp16 needs a GPU (scaling.use_gpu=true); use bf16 on CPU")


def autocast(precision: str, device: torch.device):
    """The forward-pass context for `precision`; a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 needs loss scaling against gradient underflow; bf16 has fp32's exponent range and does not."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None
