import math

import pytest
import torch

from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist.train.optim import (
    Lamb,
    build_optimizer,
    build_scheduler,
    is_decayed,
    parameter_groups,
    warmup_poly_decay,
)


def reference_lamb_step(w, g, m, v, lr, wd, beta1=0.9, beta2=0.999, eps=1e-6, trust=True):
    """google-research/albert lamb_optimizer.py, one step, written out in plain tensor ops."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    update = m / (v.sqrt() + eps) + wd * w
    ratio = 1.0
    if trust:
        wn, un = w.norm(), update.norm()
        ratio = (wn / un).item() if wn > 0 and un > 0 else 1.0
    return w - lr * ratio * update, m, v


def test_lamb_matches_google_reference_over_steps():
    torch.manual_seed(0)
    w0 = torch.randn(5, 4)
    p = torch.nn.Parameter(w0.clone())
    opt = Lamb([{"params": [p], "weight_decay": 0.01, "use_trust_ratio": True}], lr=0.01)
    w, m, v = w0.clone(), torch.zeros_like(w0), torch.zeros_like(w0)
    for _ in range(4):
        g = torch.randn(5, 4)
        p.grad = g.clone()
        opt.step()
        w, m, v = reference_lamb_step(w, g, m, v, lr=0.01, wd=0.01)
    torch.testing.assert_close(p.detach(), w, rtol=1e-5, atol=1e-6)


def test_lamb_no_trust_ratio_for_excluded_groups_and_zero_weights():
    p = torch.nn.Parameter(torch.zeros(3))  # ‖w‖ = 0 → ratio 1
    opt = Lamb([{"params": [p], "weight_decay": 0.0, "use_trust_ratio": True}], lr=0.1)
    p.grad = torch.tensor([1.0, -2.0, 0.5])
    opt.step()
    expected, _, _ = reference_lamb_step(torch.zeros(3), torch.tensor([1.0, -2.0, 0.5]), 0, 0, 0.1, 0.0)
    torch.testing.assert_close(p.detach(), expected)


def small_albert() -> torch.nn.Module:
    torch.manual_seed(0)
    return AlbertForPreTraining(
        AlbertConfig(
            vocab_size=50,
            embedding_size=8,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=16,
        )
    )


def test_multi_tensor_lamb_matches_the_reference_on_every_albert_parameter():
    """Every parameter of a (small) ALBERT, decay and no-decay groups, a frozen-this-step parameter (no grad):
    the multi-tensor step equals google's per-parameter formula over several steps."""
    model = small_albert()
    named = dict(model.named_parameters())
    opt = build_optimizer(
        "lamb", parameter_groups(named.items(), 0.01), lr=0.02, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01
    )
    expected = {n: (p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p)) for n, p in named.items()}
    skipped = "albert.pooler.bias"
    for _ in range(3):
        grads = {n: torch.randn_like(p) for n, p in named.items()}
        for n, p in named.items():
            p.grad = None if n == skipped else grads[n].clone()
            if p.grad is not None:
                expected[n] = reference_lamb_step(
                    *expected[n][:1],
                    grads[n],
                    *expected[n][1:],
                    lr=0.02,
                    wd=0.01 if is_decayed(n) else 0.0,
                    trust=is_decayed(n),
                )
        opt.step()
    for n, p in named.items():
        torch.testing.assert_close(p.detach(), expected[n][0], rtol=1e-5, atol=1e-6, msg=n)  # skipped one unmoved
    torch.testing.assert_close(
        opt.state[named["albert.embeddings.word_embeddings.weight"]]["exp_avg_sq"],
        expected["albert.embeddings.word_embeddings.weight"][2],
    )


def test_adamw_is_torch_fused_with_the_for_loop_results():
    model, reference = small_albert(), small_albert()
    settings = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    opt = build_optimizer("adamw", parameter_groups(model.named_parameters(), 0.1), **settings)
    ref = torch.optim.AdamW(parameter_groups(reference.named_parameters(), 0.1), **settings, foreach=False)
    assert opt.defaults["fused"]
    for _ in range(3):
        for p, q in zip(model.parameters(), reference.parameters()):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_parameter_groups_exclude_layernorm_and_bias():
    model = torch.nn.ModuleDict({"dense": torch.nn.Linear(3, 3), "LayerNorm": torch.nn.LayerNorm(3)})
    groups = parameter_groups(model.named_parameters(), weight_decay=0.01)
    decayed = {g["name"]: len(g["params"]) for g in groups}
    assert decayed == {"all/decay": 1, "all/no_decay": 3}
    assert all(g["weight_decay"] == 0 and not g["use_trust_ratio"] for g in groups if g["name"].endswith("no_decay"))
    assert is_decayed("encoder.ffn.weight") and not is_decayed("encoder.ffn.bias")


def test_lr_scale_zero_freezes():
    model = torch.nn.ModuleDict({"emb": torch.nn.Linear(2, 2), "head": torch.nn.Linear(2, 2)})
    groups = parameter_groups(
        model.named_parameters(), 0.0, lr_scale={"emb": 0.0, "head": 2.0}, group_of=lambda n: n.split(".")[0]
    )
    assert {g["name"] for g in groups} == {"head/decay", "head/no_decay"}
    assert not model["emb"].weight.requires_grad and all(g["lr_scale"] == 2.0 for g in groups)


def test_warmup_then_polynomial_decay():
    f = warmup_poly_decay(warmup_steps=10, total_steps=110, power=1.0)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.5) and f(110) == 0.0 and f(500) == 0.0
    g = warmup_poly_decay(0, 100, power=2.0)
    assert g(50) == pytest.approx(0.25)
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = build_scheduler(opt, 10, 110)
    for _ in range(60):
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(0.5)
    assert math.isclose(sched.get_last_lr()[0], f(60))
