"""The export's check: the ONNX model run by onnxruntime against the PyTorch model on sample batches of two shapes
(padding included), every output compared; past the tolerance of the export's precision the export fails.

fp32 must match to 1e-4 (max abs diff). int8 and fp16 change the numbers by design, so theirs is looser and scaled to
the output: max abs diff ≤ `max_abs` + `max_rel` × the output's largest |value|, and the argmax (the class, the
token, the answer's start and end) must agree on at least `min_agreement` of the rows (token positions for per-token
outputs, padding left out) where the output has a class axis. Rows where PyTorch's own top two are within the bound
of each other are ties the allowed difference may reorder: they are left out of the agreement.

The samples are random tokens, far from any text a model was trained on: int8 moves a trained classifier's logits on
them by up to ~15 % of their largest value (our tests' and benchmarks' models), where a broken graph (a mask or a
weight gone wrong) moves them by about their own size. int8's bound is 30 % of the output's range; how much int8
costs on real text is what `--dev` measures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from albert_dist.errors import AlbertDistError
from albert_dist.export.convert import sample_inputs


class ExportCheckError(AlbertDistError):
    """The exported model disagrees with the PyTorch model past the tolerance."""


@dataclass(frozen=True)
class Tolerance:
    max_abs: float
    max_rel: float = 0.0
    min_agreement: float | None = None

    def bound(self, scale: float) -> float:
        return self.max_abs + self.max_rel * scale

    def describe(self) -> str:
        parts = [f"max abs diff ≤ {self.max_abs:g}" + (f" + {self.max_rel:g} × max |output|" if self.max_rel else "")]
        if self.min_agreement is not None:
            parts.append(f"argmax agreement ≥ {self.min_agreement:.0%}")
        return ", ".join(parts)


TOLERANCES = {
    "none": Tolerance(max_abs=1e-4),
    "fp16": Tolerance(max_abs=1e-3, max_rel=0.02, min_agreement=0.95),
    "int8": Tolerance(max_abs=1e-3, max_rel=0.3, min_agreement=0.9),
}
SAMPLE_SHAPES = ((4, 16), (6, 37))  # (batch, length); neither is the shape the graph was traced at
PER_ROW_ARGMAX = ("start_logits", "end_logits")  # the answer's position: argmax over the sequence


def compare(model: torch.nn.Module, onnx_model, tolerance: Tolerance, seed: int = 1) -> dict:
    """Each output's max abs diff, its bound and its argmax agreement over SAMPLE_SHAPES batches (lengths capped at
    max_position_embeddings); raises ExportCheckError past `tolerance`. Returns what was measured, for export.json."""
    config = model.config
    pairs: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    shapes = [(batch, min(length, config.max_position_embeddings)) for batch, length in SAMPLE_SHAPES]
    for i, (batch, length) in enumerate(shapes):
        inputs = sample_inputs(config, batch, length, seed=seed + i)
        with torch.no_grad():
            expected = model(**inputs)
        got = onnx_model(**inputs)
        mask = inputs["attention_mask"].numpy().astype(bool)
        for name in onnx_model.outputs:
            pairs.setdefault(name, []).append(
                (getattr(expected, name).float().numpy(), getattr(got, name).float().numpy(), mask)
            )
    measured = {name: _measure(name, runs, tolerance) for name, runs in pairs.items()}
    report = {"shapes": [list(s) for s in shapes], "tolerance": asdict(tolerance), "outputs": measured}
    for name, m in measured.items():
        if not m["max_abs_diff"] <= m["bound"]:  # NaN fails too
            raise ExportCheckError(
                f"the ONNX model's {name} differs from PyTorch's by up to {m['max_abs_diff']:.3g} on the sample "
                f"batches, past the bound {m['bound']:.3g} ({tolerance.describe()})"
            )
        agreement = m.get("argmax_agreement")
        if agreement is not None and tolerance.min_agreement is not None and agreement < tolerance.min_agreement:
            raise ExportCheckError(
                f"the ONNX model's {name} picks PyTorch's argmax on only {agreement:.1%} of the sample rows, "
                f"below {tolerance.min_agreement:.0%} ({tolerance.describe()})"
            )
    return report


def _measure(name: str, runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], tolerance: Tolerance) -> dict:
    scale = max(float(np.abs(expected).max()) for expected, _, _ in runs)
    diff = max(float(np.abs(got - expected).max()) for expected, got, _ in runs)
    out = {"max_abs_diff": diff, "max_abs_value": scale, "bound": tolerance.bound(scale)}
    same = [_argmax_matches(name, expected, got, mask, out["bound"]) for expected, got, mask in runs]
    if all(s is not None for s in same):
        same = np.concatenate(same)
        out["argmax_rows"] = int(same.size)
        out["argmax_agreement"] = float(same.mean()) if same.size else None
    return out


def _argmax_matches(
    name: str, expected: np.ndarray, got: np.ndarray, mask: np.ndarray, tie: float
) -> np.ndarray | None:
    """Per row (or real token) where PyTorch's top two are more than `tie` apart, whether both models pick the same
    class; None where the output has no class axis (hidden states, a regression score)."""
    if name in PER_ROW_ARGMAX:
        expected, got, keep = expected, got, np.ones(expected.shape[0], bool)
        axis = 1
    elif name == "logits" and expected.shape[-1] > 1:
        keep = mask if expected.ndim == 3 else np.ones(expected.shape[0], bool)
        axis = -1
    else:
        return None
    top_two = np.sort(expected, axis=axis)
    margin = np.take(top_two, -1, axis=axis) - np.take(top_two, -2, axis=axis)
    keep = keep & (margin > tie)
    return (expected.argmax(axis) == got.argmax(axis))[keep]
