"""Optimizers and learning-rate schedules: LAMB as google-research/albert's, AdamW, warmup + polynomial decay.

torch has no LAMB and the packaged ones differ from google's (bias correction, trust ratio on every parameter),
so it is written here, following `lamb_optimizer.py` of google-research/albert, with multi-tensor
(`torch._foreach_*`) kernels; AdamW is torch's fused one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

NO_DECAY_MARKERS = ("LayerNorm", "layer_norm", "bias")


def is_decayed(name: str) -> bool:
    """LayerNorm weights and biases get no weight decay (and, in LAMB, no trust ratio)."""
    return not any(marker in name for marker in NO_DECAY_MARKERS)


def parameter_groups(
    named_params: Iterable[tuple[str, torch.nn.Parameter]],
    weight_decay: float,
    lr_scale: dict[str, float] | None = None,
    group_of=None,
) -> list[dict]:
    """Split parameters into decay/no-decay groups, optionally per named group with its own `lr_scale`.

    `group_of(name)` names the group of a parameter (e.g. "embeddings", "group0", "head"); `lr_scale[group]`
    multiplies the base learning rate, and a scale of 0 freezes that group.
    """
    groups: dict[tuple[str, bool], dict] = {}
    for name, param in named_params:
        if not param.requires_grad:
            continue
        label = group_of(name) if group_of else "all"
        scale = (lr_scale or {}).get(label, 1.0)
        if scale == 0:
            param.requires_grad_(False)
            continue
        decayed = is_decayed(name)
        group = groups.setdefault(
            (label, decayed),
            {
                "params": [],
                "weight_decay": weight_decay if decayed else 0.0,
                "lr_scale": scale,
                "use_trust_ratio": decayed,
                "name": f"{label}/{'decay' if decayed else 'no_decay'}",
            },
        )
        group["params"].append(param)
    return list(groups.values())


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019) as google-research/albert: Adam moments without bias correction, decoupled weight
    decay added to the update, and the update scaled by the trust ratio ‖w‖/‖update‖ (1 when either is 0).
    Groups with `use_trust_ratio=False` (LayerNorm, bias) take the plain Adam-style step.

    Like torch's fused optimizers it takes `grad_scale` and `found_inf` (tensors set as attributes by GradScaler
    or `step_unless`) and skips a step on the device, leaving weights and moments as they were, without reading
    `found_inf` back on the host."""

    _step_supports_amp_scaling = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01):
        if lr <= 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB hyperparameters lr={lr} betas={betas} eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, use_trust_ratio=True))

    @torch.no_grad()
    def step(self, closure=None):
        """One step for each group in a handful of multi-tensor (`torch._foreach_*`) kernels instead of a Python
        loop of ~10 small ops per parameter: the per-parameter trust ratios come from one `_foreach_norm` each for
        the weights and the updates."""
        loss = closure() if closure is not None else None
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._group_step(group, params, grad_scale, found_inf)
        return loss

    def _group_step(
        self, group: dict, params: list[torch.Tensor], grad_scale: torch.Tensor | None, found_inf: torch.Tensor | None
    ) -> None:
        beta1, beta2 = group["betas"]
        for p in params:
            if not self.state[p]:
                self.state[p]["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                self.state[p]["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        m = [self.state[p]["exp_avg"] for p in params]
        v = [self.state[p]["exp_avg_sq"] for p in params]
        grads = [p.grad.float() for p in params]
        weights = [p.float() for p in params]  # the parameters themselves when they are float32
        if grad_scale is not None:
            grads = torch._foreach_div(grads, grad_scale)
        decay1, decay2 = beta1, beta2
        if found_inf is not None:
            # a skipped step: zero gradients and moments that decay by 1, i.e. nothing changes
            taken = 1 - found_inf.float()
            grads = [torch.where(taken.bool(), g, 0.0) for g in grads]
            decay1, decay2 = 1 - (1 - beta1) * taken, 1 - (1 - beta2) * taken
        torch._foreach_mul_(m, decay1)
        torch._foreach_add_(m, grads, alpha=1 - beta1)
        torch._foreach_mul_(v, decay2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
        denominators = torch._foreach_sqrt(v)
        torch._foreach_add_(denominators, group["eps"])
        updates = torch._foreach_div(m, denominators)
        if group["weight_decay"]:
            torch._foreach_add_(updates, weights, alpha=group["weight_decay"])
        if group["use_trust_ratio"]:
            w_norm = torch.stack(torch._foreach_norm(weights))
            u_norm = torch.stack(torch._foreach_norm(updates))
            ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
            torch._foreach_mul_(updates, list(ratio.unbind()))
        if found_inf is not None:
            torch._foreach_mul_(updates, taken)
        torch._foreach_add_(weights, updates, alpha=-group["lr"])
        for p, w in zip(params, weights):
            if w is not p:  # a half-precision parameter: its float32 copy took the step
                p.copy_(w)


def step_unless(optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> None:
    """`optimizer.step()`, skipped on the device where the 0-dim `found_inf` is true: the host never waits for
    the device to tell. Both optimizers `build_optimizer` makes take `found_inf` (torch's fused AdamW and `Lamb`)."""
    optimizer.found_inf = found_inf.float()
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf


def build_optimizer(
    kind: str, groups: list[dict], lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> torch.optim.Optimizer:
    for g in groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    if kind == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if kind == "adamw":
        # torch's fused kernel: one pass over each tensor per step, on CPU as on CUDA
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
    raise ValueError(f"unknown optimizer {kind!r}")


def warmup_poly_decay(warmup_steps: int, total_steps: int, power: float = 1.0, end_factor: float = 0.0):
    """Multiplier of the base lr: linear warmup from 0, then polynomial decay to `end_factor` at `total_steps`."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if step >= total_steps:
            return end_factor
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return end_factor + (1 - end_factor) * math.pow(1 - progress, power)

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, power: float = 1.0):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_poly_decay(warmup_steps, total_steps, power))
