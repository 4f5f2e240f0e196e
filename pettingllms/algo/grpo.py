"""From a policy's samples to per-sample advantages: group, filter, normalise. Pure, no systems code."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from pettingllms.algo.advantage import advantages_from_stats, group_stats
from pettingllms.algo.filters import keep_groups
from pettingllms.algo.grouping import group_index
from pettingllms.core.types import Sample


@dataclass(frozen=True)
class AdvantageConfig:
    norm_by_std: bool = True
    eps: float = 1e-6
    filter: str = "none"  # none | dapo | std | mean
    filter_ratio: float = 0.0
    # "sample": every valid sample counts in its group's mean and std (tree and independent modes); "episode": one
    # value per (group, episode), the episode's return (trajectory mode: an agent's turns share one return).
    unit: str = "sample"

    def __post_init__(self) -> None:
        if self.unit not in ("sample", "episode"):
            raise ValueError(f"unit must be 'sample' or 'episode', got {self.unit!r}")


@dataclass
class ScoredSamples:
    advantages: list[float]  # one per sample; 0 for rows outside the loss
    in_loss: list[bool]  # False: failed generation, dropped non-finite reward, singleton or filtered group
    metrics: dict[str, float]


def score_samples(samples: Sequence[Sample], config: AdvantageConfig) -> ScoredSamples:
    """Group by ``sample.group`` (problem slot, turn, agent), filter groups, and compute GRPO advantages."""
    if not samples:
        return ScoredSamples([], [], {})
    group_ids = torch.from_numpy(group_index([s.group for s in samples]))
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    valid = torch.tensor([s.has_reward for s in samples])
    if not torch.isfinite(rewards[valid]).all():  # one NaN would zero the whole group's advantages, silently
        bad = next(s for s in samples if s.has_reward and not math.isfinite(s.reward))
        raise ValueError(f"sample of agent {bad.agent!r} (problem {bad.problem_id!r}, turn {bad.turn}) has reward "
                         f"{bad.reward}; non-finite rewards must be stopped or dropped before grouping")
    counted = valid & _first_of_each_episode(samples) if config.unit == "episode" else valid
    stats = group_stats(rewards, group_ids, counted)
    kept_groups = keep_groups(stats, config.filter, config.filter_ratio)
    in_loss = valid & kept_groups[group_ids] & (stats.count[group_ids] > 1)
    stats = group_stats(rewards, group_ids, counted & in_loss)  # filtered groups leave no trace in any statistic
    advantages = advantages_from_stats(rewards, group_ids, in_loss, stats, config.norm_by_std, config.eps)
    present = stats.count > 0
    metrics = {
        "groups": float(present.sum()),
        "groups_kept": float(kept_groups.sum()),
        "groups_zero_std": float((present & (stats.std == 0)).sum()),
        "samples_in_loss": float(in_loss.sum()),
        "samples_failed": float(sum(s.failed for s in samples)),
        "advantage_mean": float(advantages[in_loss].mean()) if in_loss.any() else 0.0,
        "advantage_abs_mean": float(advantages[in_loss].abs().mean()) if in_loss.any() else 0.0,
    }
    return ScoredSamples(advantages.tolist(), in_loss.tolist(), metrics)


def _first_of_each_episode(samples: Sequence[Sample]) -> torch.Tensor:
    """(N,) bool: True on the first valid sample of each (group, episode); an episode's return counts once."""
    seen: set = set()
    first = []
    for sample in samples:
        key = (sample.group, sample.episode)
        first.append(sample.has_reward and key not in seen)
        if sample.has_reward:
            seen.add(key)
    return torch.tensor(first, dtype=torch.bool)
