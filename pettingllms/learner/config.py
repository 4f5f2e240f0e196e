"""Learner hyper-parameters: optimiser, schedule, PPO loss, KL to the reference, micro-batching.

Every value is checked on construction, so a wrong setting fails at start-up with a message that names it. A field
that mirrors a config key has no default here: the key's one default is the schema's, and the plan
(``assembly/plan.py::learner_config``) fills every field from the run's config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pettingllms.algo.losses import PPOLossSettings
from pettingllms.core.choices import AttentionKernel, DType, KLType, LossAggMode

LOSS_AGG_MODES = LossAggMode.values()  # only modes whose micro-batch losses add up exactly (core/choices.py)
KL_TYPES = KLType.values()
DTYPES = DType.values()
ATTENTION_KERNELS = AttentionKernel.values()


@dataclass(kw_only=True)
class KLPenalty:
    """KL penalty to the reference policy, added to the loss as ``coef * agg(kl_penalty(logp, ref_logp))``.

    ``coef == 0`` turns it off, and then no reference model or reference forward pass exists at all.
    ``adaptive`` uses the adaptive controller (Ziegler et al.), updated once per training step towards ``target``.
    """

    coef: float  # algorithm.kl.init_kl_coeff
    type: str  # algorithm.kl.kl_type
    adaptive: bool  # algorithm.kl.adaptive
    target: float  # algorithm.kl.kl_target
    horizon: int  # algorithm.kl.kl_horizon

    def __post_init__(self) -> None:
        self.validate()

    @property
    def enabled(self) -> bool:
        return self.coef > 0

    def validate(self) -> None:
        if self.coef < 0:
            raise ValueError(f"kl.coef must be >= 0 (0 turns the KL loss off), got {self.coef}")
        if self.type not in KL_TYPES:
            raise ValueError(f"kl.type must be one of {KL_TYPES}, got {self.type!r}")
        if self.adaptive and self.target <= 0:
            raise ValueError(f"kl.target must be > 0 for the adaptive controller, got {self.target}")
        if self.adaptive and self.horizon <= 0:
            raise ValueError(f"kl.horizon must be > 0 for the adaptive controller, got {self.horizon}")


@dataclass(kw_only=True)
class LearnerConfig:
    """One policy's optimisation settings.

    ``total_steps`` is the number of training iterations (calls to ``PolicyLearner.update``). The LR scheduler
    steps once per iteration, never per mini-batch or per adapter, so the schedule is a single warmup + cosine
    curve from ``lr`` down to ``min_lr_ratio * lr``. It has no usable default on purpose: the reference left it
    unset and its LR alternated between lr and 0.3 lr on every step.
    """

    total_steps: int  # training.total_training_steps
    lr: float  # optim.lr
    weight_decay: float  # optim.weight_decay
    warmup_steps: int  # optim.warmup_steps, at most total_steps
    min_lr_ratio: float  # optim.min_lr_ratio
    grad_clip: float | None  # max global grad norm (per adapter under LoRA); None disables clipping
    ppo_epochs: int  # optim.ppo_epochs
    ppo_mini_batch_size: int  # sequences per optimizer step (per adapter under LoRA); 0 = whole batch
    micro_batch_max_tokens: int  # padded tokens per forward; gradients accumulate over micro-batches
    pack_shared_prompts: bool  # one forward row per shared prompt (tree branches); same logits, fewer tokens
    # Response tokens per chunk of the LM head (learner/logprob_head.py); 0 = the dense head over every kept column.
    logprob_chunk_tokens: int
    # The attention kernel over packed rows: "sdpa", "flex", or "auto" (flex on CUDA); learner/masks.py.
    attention: str
    clip_ratio_low: float  # algorithm.clip_ratio_low
    clip_ratio_high: float  # algorithm.clip_ratio_high
    clip_ratio_c: float  # dual-clip bound for negative advantages
    loss_agg_mode: str  # algorithm.loss_agg_mode
    entropy_coeff: float  # algorithm.entropy_coeff
    kl: KLPenalty  # algorithm.kl.*
    # Compute dtype of every forward and backward: "bfloat16" = bf16 autocast (FSDP2: MixedPrecisionPolicy). The
    # weights and AdamW state are whatever the model was loaded as: float32 master weights unless the policy opts
    # into bf16 weights (base_models.<p>.master_weights=bfloat16, docs/training.md "Precision").
    dtype: str
    gradient_checkpointing: bool  # optim.gradient_checkpointing
    compile: bool  # optim.compile: each decoder layer's forward compiled for the learner's passes (models/compile.py)
    # Rollout-learner agreement: stop before the first optimiser step of an update when, for any stream, the mean
    # k3 KL between the engine's logprobs and the learner's (same tokens, raw logits) exceeds this. 0 disables.
    max_rollout_kl: float
    # Truncated importance sampling: weight each token's policy-gradient term by min(exp((old - engine) / T), cap),
    # raw logprobs of the old policy and the engine, T the sample's temperature (token-level, as verl's and TRL's;
    # algo/losses.py::truncated_importance_weights); 0 = off.
    tis_cap: float
    # Training steps in a row whose gradient norm is NaN/inf before ``update`` raises NonFiniteGradientError (0 = never).
    max_nonfinite_grad_steps: int
    # AdamW's moments and epsilon: no config key sets them.
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        self.validate()

    def validate(self) -> None:
        if isinstance(self.total_steps, bool) or not isinstance(self.total_steps, int) or self.total_steps <= 0:
            raise ValueError(f"total_steps must be a positive int, got {self.total_steps!r}")
        _check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        _check(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        _check(
            len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas),
            f"betas must be two values in [0, 1), got {self.betas}",
        )
        _check(self.eps > 0, f"eps must be > 0, got {self.eps}")
        _check(
            0 <= self.warmup_steps <= self.total_steps,
            f"warmup_steps must be in [0, total_steps={self.total_steps}], got {self.warmup_steps}",
        )
        _check(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _check(
            self.grad_clip is None or self.grad_clip > 0,
            f"grad_clip must be > 0 or None (no clipping), got {self.grad_clip}",
        )
        _check(self.ppo_epochs >= 1, f"ppo_epochs must be >= 1, got {self.ppo_epochs}")
        _check(
            self.ppo_mini_batch_size >= 0,
            f"ppo_mini_batch_size must be >= 0 (0 = whole batch), got {self.ppo_mini_batch_size}",
        )
        _check(
            self.micro_batch_max_tokens > 0, f"micro_batch_max_tokens must be > 0, got {self.micro_batch_max_tokens}"
        )
        _check(self.logprob_chunk_tokens >= 0, f"logprob_chunk_tokens must be >= 0, got {self.logprob_chunk_tokens}")
        _check(self.attention in ATTENTION_KERNELS,
               f"attention (optim.attention) must be one of {ATTENTION_KERNELS}, got {self.attention!r}")
        _check(0 < self.clip_ratio_low < 1, f"clip_ratio_low must be in (0, 1), got {self.clip_ratio_low}")
        _check(self.clip_ratio_high > 0, f"clip_ratio_high must be > 0, got {self.clip_ratio_high}")
        _check(self.clip_ratio_c > 1, f"clip_ratio_c (dual clip) must be > 1, got {self.clip_ratio_c}")
        _check(
            self.loss_agg_mode in LOSS_AGG_MODES,
            f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}",
        )
        _check(self.entropy_coeff >= 0, f"entropy_coeff must be >= 0, got {self.entropy_coeff}")
        _check(self.dtype in DTYPES, f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        _check(self.max_nonfinite_grad_steps >= 0, f"max_nonfinite_grad_steps (optim.max_nonfinite_grad_steps) must "
                                                   f"be >= 0 (0: never stop), got {self.max_nonfinite_grad_steps}")
        _check(self.max_rollout_kl >= 0, f"max_rollout_kl (algorithm.rollout_check.max_kl) must be >= 0 (0 disables "
                                         f"the check), got {self.max_rollout_kl}")
        _check(self.tis_cap == 0 or self.tis_cap >= 1, f"tis_cap (algorithm.tis_cap) must be 0 (off) or >= 1 (the "
                                                       f"largest importance weight), got {self.tis_cap}")
        self.kl.validate()

    def loss_settings(self) -> PPOLossSettings:
        """The settings of the per-micro-batch objective (``algo/losses.py``)."""
        return PPOLossSettings(
            loss_agg_mode=self.loss_agg_mode,
            clip_ratio_low=self.clip_ratio_low,
            clip_ratio_high=self.clip_ratio_high,
            clip_ratio_c=self.clip_ratio_c,
            entropy_coeff=self.entropy_coeff,
            kl_type=self.kl.type,
        )


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
