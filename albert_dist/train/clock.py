"""Where a training loop's wall time goes: evaluation, checkpoint reports, training, and the tokens trained."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from albert_dist.console import format_duration


@dataclass
class LoopClock:
    """Where the loop's wall time went since `fit` began: evaluation (with keeping the best model) and reports with
    their checkpoints (the step's stall, not a background upload), the rest being training steps; and the tokens
    trained on every rank."""

    start: float = field(default_factory=time.perf_counter)
    evaluation_s: float = 0.0
    checkpoint_s: float = 0.0
    tokens: float = 0.0

    def metrics(self) -> dict[str, float]:
        wall = time.perf_counter() - self.start
        return {
            "loop_wall_s": wall,
            "evaluation_share": self.evaluation_s / wall,
            "checkpoint_share": self.checkpoint_s / wall,
            "tokens_seen": self.tokens,
            "loop_tokens_per_s": self.tokens / wall,
        }

    def line(self) -> str:
        m = self.metrics()
        training = 1 - m["evaluation_share"] - m["checkpoint_share"]
        return (
            f"loop time {format_duration(m['loop_wall_s'])}: training {training:.1%}, evaluation "
            f"{m['evaluation_share']:.1%}, checkpoints {m['checkpoint_share']:.1%}; "
            f"{m['tokens_seen']:.0f} tokens, {m['loop_tokens_per_s']:.0f} tok/s"
        )
