"""Where a training step's wall time goes: ``timing/<part>_s`` for every part, ``timing/step_s`` and
``timing/other_s``, the step less its parts, so the parts add up to the step exactly. Pure functions.

The parts are measured where the work happens, each with a ``PartClock`` (``pettingllms/core/part_clock.py``):
generation and env calls in the executor, update and weight sync in each policy's worker, validation and the
checkpoint in the trainer. docs/training.md (metrics) says what each part covers.
"""

from __future__ import annotations

from typing import Mapping

# (part, its label on the console's step line), in the order a step runs them
PARTS = (("generate", "gen"), ("env", "env"), ("update", "update"), ("sync", "sync"), ("checkpoint", "ckpt"),
         ("validation", "val"))
STEP = "timing/step_s"
OTHER = "timing/other_s"


def part_key(part: str) -> str:
    return f"timing/{part}_s"


BREAKDOWN_KEYS = tuple(part_key(p) for p, _ in PARTS) + (OTHER,)  # what adds up to STEP


def breakdown(parts: Mapping[str, float], total: float) -> dict[str, float]:
    """``timing/<part>_s`` for every part of ``PARTS`` (0 for one not in ``parts``), ``timing/step_s`` = ``total``
    and ``timing/other_s`` = ``total`` less the parts: the driver's own work (prompts, grouping, advantages,
    metrics, logs) and what moves between processes. Negative only if two parts overlapped in time."""
    unknown = sorted(set(parts) - {p for p, _ in PARTS})
    if unknown:
        raise ValueError(f"unknown step parts {unknown}; the parts are {[p for p, _ in PARTS]}")
    out = {part_key(p): float(parts.get(p, 0.0)) for p, _ in PARTS}
    out[OTHER] = total - sum(out.values())
    out[STEP] = float(total)
    return out


def measured_parts(metrics: Mapping[str, float]) -> dict[str, float]:
    """The parts already in a step's metrics (to extend its breakdown with validation and the checkpoint)."""
    return {p: metrics[part_key(p)] for p, _ in PARTS if part_key(p) in metrics}


def slowest_update(updates: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """``update`` and ``sync`` of the policy the step waited for: the one whose update and sync took longest.
    Policies update in parallel, so that policy's two parts fit inside the step's wait, which the slowest update
    and the slowest sync of two different policies may not."""
    if not updates:
        return {"update": 0.0, "sync": 0.0}
    slowest = max(updates.values(), key=lambda u: u.get(part_key("update"), 0.0) + u.get(part_key("sync"), 0.0))
    return {"update": slowest.get(part_key("update"), 0.0), "sync": slowest.get(part_key("sync"), 0.0)}


def step_line(metrics: Mapping[str, float]) -> str | None:
    """``23.7 s (gen 8.8, env 0.1, update 15.2, sync 0.0, ckpt 0.0, val 0.0)``; None without ``timing/step_s``."""
    if STEP not in metrics:
        return None
    parts = ", ".join(f"{label} {metrics.get(part_key(p), 0.0):.1f}" for p, label in PARTS)
    return f"{metrics[STEP]:.1f} s ({parts})"
