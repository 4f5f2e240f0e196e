"""GRPO advantages over explicit groups. Tensors in, tensors out.

Invalid rows (padding, failed generations, filtered groups) neither receive an advantage nor enter any group's
statistics. A group with fewer than two valid rows has no baseline, so it is left out of the loss (advantage 0);
verl 0.9.1 instead trains a singleton with mean 0 and std 1, A = r / (1 + eps), a reward with no baseline.
Zero-variance groups get 0 as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupStats:
    """Per-group statistics over valid rows. All tensors have shape (G,)."""

    count: torch.Tensor  # valid rows in the group
    mean: torch.Tensor
    std: torch.Tensor  # unbiased (N-1), as verl; 0 for groups of size < 2


def group_stats(rewards: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor) -> GroupStats:
    """Shapes: rewards (N,) float, group_ids (N,) long in [0, G), valid (N,) bool -> GroupStats over G groups."""
    num_groups = int(group_ids.max()) + 1 if group_ids.numel() else 0
    weights = valid.to(rewards.dtype)
    values = torch.where(valid, rewards, torch.zeros_like(rewards))
    count = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_ids, weights)
    total = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_ids, values)
    mean = total / count.clamp(min=1)
    deviation = torch.where(valid, rewards - mean[group_ids], torch.zeros_like(rewards))
    sq_sum = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_ids, deviation**2)
    std = torch.where(count > 1, (sq_sum / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(count))
    return GroupStats(count=count, mean=mean, std=std)


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    valid: torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-sample GRPO advantage.

    A_i = (r_i - mean_g) / (std_g + eps) when ``norm_by_std`` else r_i - mean_g, with g the group of row i and
    the statistics taken over the valid rows of g only.

    Shapes: rewards (N,), group_ids (N,) long, valid (N,) bool -> advantages (N,); 0 where invalid or where the
    group has fewer than two valid rows.
    """
    if not (rewards.shape == group_ids.shape == valid.shape) or rewards.dim() != 1:
        raise ValueError(f"expected three (N,) tensors, got {rewards.shape}, {group_ids.shape}, {valid.shape}")
    if rewards.numel() == 0:
        return rewards.clone()
    return advantages_from_stats(rewards, group_ids, valid, group_stats(rewards, group_ids, valid), norm_by_std, eps)


def advantages_from_stats(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    valid: torch.Tensor,
    stats: GroupStats,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``grpo_advantages`` with the groups' statistics given (e.g. taken over one row per episode).

    Shapes: rewards, group_ids, valid (N,); stats over G groups -> advantages (N,), 0 where invalid or where the group
    has fewer than two counted rows or zero variance.
    """
    centred = rewards - stats.mean[group_ids]
    std = stats.std[group_ids]
    # A zero-variance group is set to 0 explicitly rather than relying on eps (eps=0 would give 0/0).
    advantages = centred / (std + eps).clamp(min=torch.finfo(rewards.dtype).tiny) if norm_by_std else centred
    has_signal = (stats.count[group_ids] > 1) & (std > 0)
    return torch.where(valid & has_signal, advantages, torch.zeros_like(advantages))
