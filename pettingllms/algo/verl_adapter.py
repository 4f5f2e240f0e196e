"""The one module that imports verl. Everything else reaches verl's algorithms through here.

verl 0.9.1 is pinned. Its functions are called exactly as it defines them; this module only supplies the
config objects they require and keeps verl's import cost (seconds) out of modules that do not need it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch


@dataclass(frozen=True)
class GlobalBatchInfo:
    """Sizes of the whole mini-batch a micro-batch belongs to (None: the micro-batch is the whole batch)."""

    batch_num_tokens: int | None = None  # valid response tokens in the mini-batch (token-mean)
    global_batch_size: int | None = None  # sequences in the mini-batch (seq-mean modes)
    dp_size: int = 1

    def as_kwargs(self) -> dict[str, Any]:
        return {
            "dp_size": self.dp_size,
            "batch_num_tokens": self.batch_num_tokens,
            "global_batch_size": self.global_batch_size,
        }


@lru_cache(maxsize=32)
def _actor_config(clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float, loss_agg_mode: str) -> Any:
    from verl.workers.config import ActorConfig

    # verl's validation requires these fields; ppo_micro_batch_size_per_gpu and rollout_n are unused by the loss.
    return ActorConfig(
        rollout_n=1,
        strategy="fsdp",
        clip_ratio=clip_ratio_low,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        ppo_micro_batch_size_per_gpu=1,
        use_dynamic_bsz=False,
    )


def ppo_clip_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    global_batch: GlobalBatchInfo | None = None,
    importance_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's PPO-clip surrogate with dual clip. All tensors (bs, T). Returns (loss, metrics).

    ``global_batch`` makes micro-batch losses add up to the mini-batch loss under gradient accumulation.
    ``importance_weights`` (bs, T), detached: each token's policy-gradient term is multiplied by it (verl's
    ``rollout_is_weights``: truncated importance sampling between the rollout engine and the learner).
    """
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    config = copy.copy(_actor_config(clip_ratio_low, clip_ratio_high, clip_ratio_c, loss_agg_mode))
    object.__setattr__(config, "global_batch_info", (global_batch or GlobalBatchInfo()).as_kwargs())
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=importance_weights,
    )
    return loss, {k: _to_float(v) for k, v in metrics.items()}


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate (bs, T). ``kind``: k1, k2, k3, low_var_kl, abs, mse."""
    from verl.trainer.ppo.core_algos import kl_penalty as verl_kl_penalty

    return verl_kl_penalty(log_prob, ref_log_prob, kind)


def agg_loss(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, global_batch: GlobalBatchInfo | None = None
) -> torch.Tensor:
    """Aggregate a (bs, T) loss matrix: token-mean, seq-mean-token-sum, seq-mean-token-mean, ..."""
    from verl.trainer.ppo.core_algos import agg_loss as verl_agg_loss

    kwargs = (global_batch or GlobalBatchInfo()).as_kwargs()
    return verl_agg_loss(loss_mat=loss_mat, loss_mask=loss_mask, loss_agg_mode=loss_agg_mode, **kwargs)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(bs, T, V), (bs, T) -> (bs, T) log-probabilities of ``labels``."""
    from verl.utils.torch_functional import logprobs_from_logits as verl_logprobs

    return verl_logprobs(logits, labels, inplace_backward=False)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """(bs, T, V) -> (bs, T) entropy."""
    from verl.utils.torch_functional import entropy_from_logits as verl_entropy

    return verl_entropy(logits)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from verl.utils.torch_functional import masked_mean as verl_masked_mean

    return verl_masked_mean(values, mask)


def cosine_schedule_with_warmup(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """verl's warmup + cosine schedule. ``total_steps`` must be the real number of optimizer steps."""
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive for a cosine schedule, got {total_steps}")
    # zero_indexed_step=False: the first optimizer step already gets lr/warmup instead of a wasted lr=0 step.
    return get_cosine_schedule_with_warmup(
        optimizer,
        num_warmup_steps=warmup_steps,
        num_training_steps=total_steps,
        min_lr_ratio=min_lr_ratio,
        zero_indexed_step=False,
    )


def adaptive_kl_controller(init_kl_coef: float, target_kl: float, horizon: int) -> Any:
    from verl.trainer.ppo.core_algos import AdaptiveKLController

    return AdaptiveKLController(init_kl_coef=init_kl_coef, target_kl=target_kl, horizon=horizon)


def fixed_kl_controller(kl_coef: float) -> Any:
    from verl.trainer.ppo.core_algos import FixedKLController

    return FixedKLController(kl_coef=kl_coef)


def _to_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean())
    return float(value)
