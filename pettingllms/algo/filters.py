"""Group filters, off by default. Each returns which groups to keep; dropped groups leave the loss entirely.

- ``dapo``: drop groups whose rewards are all equal (zero variance: no learning signal).
- ``std``: drop the ``ratio`` fraction of groups with the lowest reward std.
- ``mean``: drop the ``ratio`` fraction of groups with the lowest mean reward (a hard-problem curriculum).
Ties are broken by group id, so the result is deterministic.
"""

from __future__ import annotations

from typing import Callable

import torch

from pettingllms.algo.advantage import GroupStats

def _none(stats: GroupStats, ratio: float, tol: float) -> torch.Tensor:
    return torch.ones_like(stats.count, dtype=torch.bool)


def _dapo(stats: GroupStats, ratio: float, tol: float) -> torch.Tensor:
    return stats.std > tol


def _std(stats: GroupStats, ratio: float, tol: float) -> torch.Tensor:
    return ~_lowest_fraction(stats.std, stats.count > 1, ratio)


def _mean(stats: GroupStats, ratio: float, tol: float) -> torch.Tensor:
    return ~_lowest_fraction(stats.mean, stats.count > 1, ratio)


# The registry, keyed by ``algorithm.filter``'s choices (core/choices.py): a new filter is a function here and its
# name there. Each says which groups it keeps, ranking only groups with a baseline (two valid rows or more: a
# singleton's std of 0 would put it first in line and use up the quota, and it is out of the loss anyway);
# ``keep_groups`` drops the others whatever it says.
FILTERS: dict[str, Callable[[GroupStats, float, float], torch.Tensor]] = {
    "none": _none, "dapo": _dapo, "std": _std, "mean": _mean}


def keep_groups(stats: GroupStats, method: str = "none", ratio: float = 0.0, tol: float = 1e-8) -> torch.Tensor:
    """Shapes: stats over G groups -> keep (G,) bool. Groups with fewer than two valid rows (no baseline: no
    advantage) are never kept."""
    if method not in FILTERS:
        raise ValueError(f"unknown group filter {method!r}; choose one of {list(FILTERS)}")
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"filter ratio must be in [0, 1), got {ratio}")
    return (stats.count > 1) & FILTERS[method](stats, ratio, tol)


def _lowest_fraction(score: torch.Tensor, present: torch.Tensor, ratio: float) -> torch.Tensor:
    """Mark the ``floor(ratio * #present)`` present groups with the lowest score (ties: lower id first)."""
    ids = torch.nonzero(present).flatten()
    n_drop = int(ratio * ids.numel())
    drop = torch.zeros_like(present)
    if n_drop == 0:
        return drop
    order = sorted(ids.tolist(), key=lambda g: (float(score[g]), g))
    drop[order[:n_drop]] = True
    return drop
