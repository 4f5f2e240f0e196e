"""The learner's per-micro-batch objective: PPO-clip (dual clip) + optional KL-to-reference + entropy bonus.

Pure maths, tensors in and tensors out. verl's functions are reached only through ``verl_adapter``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pettingllms.algo.verl_adapter import GlobalBatchInfo, agg_loss, kl_penalty, ppo_clip_loss


@dataclass(frozen=True)
class PPOLossSettings:
    """The loss hyper-parameters, separate from the learner's config so this module stays system-free."""

    loss_agg_mode: str = "token-mean"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    entropy_coeff: float = 0.0
    kl_type: str = "low_var_kl"


@dataclass(frozen=True)
class ObjectiveParts:
    """Detached pieces of one micro-batch's objective.

    ``pg_loss``, ``kl_loss`` and ``entropy_loss`` are already normalised by the whole mini-batch (``GlobalBatchInfo``),
    so summing them over a mini-batch's micro-batches gives the mini-batch value. The ``*_token_mean`` values and
    the clip fractions are means over this micro-batch's valid tokens; weight them by ``num_tokens`` to combine.
    """

    pg_loss: float
    kl_loss: float
    entropy_loss: float
    pg_clipfrac: float
    pg_clipfrac_lower: float
    ppo_kl: float
    kl_token_mean: float
    entropy_token_mean: float
    num_tokens: int


def micro_batch_objective(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    settings: PPOLossSettings,
    global_batch: GlobalBatchInfo | None = None,
    *,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    importance_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ObjectiveParts]:
    """Loss to back-propagate for one micro-batch, and its detached parts.

    Shapes: every tensor is (bs, T) over response tokens; ``response_mask`` is 1.0 on tokens that count and 0.0
    on padding and on masked-out (failed) rows. ``log_probs`` carries the gradient; ``old_log_probs`` and
    ``ref_log_probs`` must not. ``entropy`` (bs, T) enters the loss only when ``settings.entropy_coeff > 0``; with
    a zero coefficient it is only measured. ``importance_weights`` (bs, T, detached) scale each token's policy-gradient
    term (truncated importance sampling, ``truncated_importance_weights``).

        loss = pg_loss(dual-clip PPO)
               + kl_coef * agg(kl_penalty(log_probs, ref_log_probs))
               - entropy_coeff * agg(entropy)
    """
    pg_loss, pg_metrics = ppo_clip_loss(
        old_log_prob=old_log_probs,
        log_prob=log_probs,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=settings.loss_agg_mode,
        clip_ratio_low=settings.clip_ratio_low,
        clip_ratio_high=settings.clip_ratio_high,
        clip_ratio_c=settings.clip_ratio_c,
        global_batch=global_batch,
        importance_weights=importance_weights,
    )
    loss = pg_loss
    num_tokens = int(response_mask.sum().item())

    kl_loss_value = kl_token_mean = 0.0
    if ref_log_probs is not None:
        kl_matrix = kl_penalty(log_probs, ref_log_probs, settings.kl_type)
        kl_loss = agg_loss(kl_matrix, response_mask, settings.loss_agg_mode, global_batch)
        if kl_coef > 0:
            loss = loss + kl_coef * kl_loss
        kl_loss_value = float(kl_loss.detach())
        kl_token_mean = _token_mean(kl_matrix, response_mask)

    entropy_loss_value = entropy_token_mean = 0.0
    if entropy is not None:
        entropy_loss = agg_loss(entropy, response_mask, settings.loss_agg_mode, global_batch)
        if settings.entropy_coeff > 0:
            loss = loss - settings.entropy_coeff * entropy_loss  # a bonus: higher entropy lowers the loss
        entropy_loss_value = float(entropy_loss.detach())
        entropy_token_mean = _token_mean(entropy, response_mask)

    parts = ObjectiveParts(
        pg_loss=float(pg_loss.detach()),
        kl_loss=kl_loss_value,
        entropy_loss=entropy_loss_value,
        pg_clipfrac=pg_metrics["actor/pg_clipfrac"],
        pg_clipfrac_lower=pg_metrics["actor/pg_clipfrac_lower"],
        ppo_kl=pg_metrics["actor/ppo_kl"],
        kl_token_mean=kl_token_mean,
        entropy_token_mean=entropy_token_mean,
        num_tokens=num_tokens,
    )
    return loss, parts


def _token_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of ``values`` over tokens where ``mask`` is 1 (0.0 when there are none). Shapes (bs, T)."""
    count = mask.sum()
    if count.item() == 0:
        return 0.0
    return float((values.detach() * mask).sum() / count)


def truncated_importance_weights(
    learner_log_probs: torch.Tensor,
    engine_log_probs: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
    temperatures: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token-level truncated importance weights (bs, T), detached; 1.0 where ``mask`` is 0 (no engine logprob).

        w = min(exp((learner - engine) / T), cap)

    ``learner_log_probs`` (the learner's OLD policy) and ``engine_log_probs`` are both raw (temperature 1: what the
    engines report); ``temperatures`` (bs,) is each sample's sampling temperature (greedy counted as 1), None = 1.
    At T = 1 the weight is the exact ratio of the two sampling distributions, capped. At T != 1 the tempered ratio
    needs the engine's tempered normaliser, which no engine reports; dividing the raw log-ratio by T gets the
    sampled token's logit difference exactly and differs from the tempered log-ratio only through the normalisers:
    by ``(E_pT[d] - E_p1[d]) / T`` to first order, d being the learner-minus-engine logit difference over the
    vocabulary (docs/training.md, "Truncated importance sampling"). Corrects the remaining engine-learner mismatch
    (token-level TIS, as verl's ``rollout_is="token"`` and TRL's); the cap bounds the variance.
    """
    with torch.no_grad():
        log_ratio = learner_log_probs.double() - engine_log_probs.double()
        if temperatures is not None:
            log_ratio = log_ratio / temperatures.double().reshape(-1, 1)
        ratio = torch.exp(log_ratio).clamp(max=cap).to(learner_log_probs.dtype)
        return torch.where(mask > 0, ratio, torch.ones_like(ratio))
