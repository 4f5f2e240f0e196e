"""Gradient health: each stream's gradient clipped by its own norm, and a NaN/inf gradient never skipped quietly.

A non-finite gradient is dropped (its optimizer step leaves those weights untouched), counted and logged; too many
steps in a row with one stop the run, since a run whose weights no longer move must not go on looking healthy.
"""

from __future__ import annotations

import logging
import math
from typing import Sequence

import torch

from pettingllms.core.errors import NonFiniteGradientError

log = logging.getLogger("pettingllms.learner")


def clip_gradient(params: Sequence[torch.nn.Parameter], max_norm: float | None) -> float:
    """Clip the gradient of ``params`` (one stream's) by its own norm; returns the norm before clipping.

    ``max_norm`` None: measure only. A NaN/inf norm drops the gradients: AdamW skips grad-less parameters, so a bad
    batch leaves the weights untouched.
    """
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else math.inf))
    if not math.isfinite(norm):
        for param in params:
            param.grad = None
    return norm


class NonfiniteGradientGuard:
    """Counts training steps in a row whose gradient was NaN/inf somewhere, and stops the run at ``limit`` (0: never).

    Every rank sees the same global norms, so every rank takes the same decision.
    """

    def __init__(self, limit: int, policy: str | None) -> None:
        self.limit = limit
        self.policy = policy
        self.streak = 0

    def after_step(self, step: int, nonfinite_streams: Sequence[str | None]) -> None:
        """``nonfinite_streams``: one entry per (optimizer step, stream) of training step ``step`` with a NaN/inf
        gradient norm. Warns, or raises ``NonFiniteGradientError`` once the streak reaches the limit."""
        if not nonfinite_streams:
            self.streak = 0
            return
        self.streak += 1
        limit = self.limit
        streams = sorted({f"adapter {s}" if s else "the model" for s in nonfinite_streams})
        message = (f"policy {self.policy or '?'} step {step}: the gradient norm was NaN/inf for "
                   f"{', '.join(streams)} in {len(nonfinite_streams)} optimizer step(s); those updates were "
                   f"dropped ({self.streak} step(s) in a row")
        if limit and self.streak >= limit:
            raise NonFiniteGradientError(
                f"{message}, optim.max_nonfinite_grad_steps={limit}). Usual causes: a learning rate too high, "
                "bf16 overflow in the loss, or an attention kernel's NaN backward (docs/distributed.md); "
                "raise optim.max_nonfinite_grad_steps (0: never stop) to keep going")
        log.warning("%s; the run stops at %s)", message, limit if limit else "never (max_nonfinite_grad_steps=0")
