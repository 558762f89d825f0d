"""Mixed precision: bf16 autocast on CPU and GPU, fp16 autocast with a GradScaler on GPU, or plain fp32; and the
deterministic algorithms that a run resuming bit for bit on a GPU needs."""

from __future__ import annotations

import contextlib
import os

import torch

from albert_dist.errors import ConfigError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_has_native_bf16() -> bool:
    """True on CPUs with bf16 matrix instructions (AMX or AVX512-BF16). Elsewhere bf16 matmuls are emulated and
    much slower than fp32 (measured 17x slower on an AVX2-only AMD EPYC)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` → bf16 where the hardware computes it natively (GPUs with bf16, AMX CPUs), else fp32."""
    if precision != "auto":
        if precision == "fp16" and device.type != "cuda":
            raise ConfigError("precision fp16 needs a GPU (training: scaling.use_gpu=true); use bf16 or fp32 on CPU")
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_has_native_bf16() else "fp32"


def explain_precision(precision: str, use_gpu: bool) -> str:
    """What `precision` resolves to on this machine and why, in a few words (for summaries)."""
    device = torch.device("cuda" if use_gpu else "cpu")
    resolved = resolve_precision(precision, device)
    if precision != "auto":
        return f"{resolved} (set by train.precision)"
    if device.type == "cuda":
        return f"{resolved} (train.precision=auto: the best half precision this GPU supports)"
    why = "has native bf16" if resolved == "bf16" else "has no native bf16, which it would emulate many times slower"
    return f"{resolved} (train.precision=auto: this CPU {why}; on other CPUs the results may differ)"


def autocast(precision: str, device: torch.device):
    """The forward-pass context for `precision`; a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 needs loss scaling against gradient underflow; bf16 has fp32's exponent range and does not."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


#: cuBLAS reuses workspaces nondeterministically unless given fixed ones (CUDA's reproducibility notes); cuBLAS reads
#: the variable when it first creates a handle, so it must be set before the process's first matmul on a GPU
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def request_determinism() -> None:
    """Make every kernel deterministic (an op without a deterministic implementation raises instead of running):
    dropout draws and sums then repeat bit for bit, so a resumed run ends with the uninterrupted run's weights."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    torch.use_deterministic_algorithms(True)
