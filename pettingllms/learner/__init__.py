"""A policy's optimiser step: PPO-clip over token-budget micro-batches, per-agent LoRA streams, rollout checks,
FSDP2 sharding, state and exports."""

from pettingllms.learner.batching import PolicyBatch, build_batch, micro_batches_by_tokens, split_mini_batches
from pettingllms.learner.config import KLPenalty, LearnerConfig
from pettingllms.learner.forward import ADAPTERS_DISABLED
from pettingllms.learner.learner import PolicyLearner

__all__ = [
    "ADAPTERS_DISABLED",
    "KLPenalty",
    "LearnerConfig",
    "PolicyBatch",
    "PolicyLearner",
    "build_batch",
    "micro_batches_by_tokens",
    "split_mini_batches",
]
