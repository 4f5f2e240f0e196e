"""A policy's optimiser step: PPO-clip over token-budget micro-batches, per-agent LoRA routing, state dicts."""

from pettingllms.learner.adapters import AdapterContext, adapter_parameters, peft_adapter_context
from pettingllms.learner.batching import PolicyBatch, build_batch, micro_batches_by_tokens, split_mini_batches
from pettingllms.learner.config import KLConfig, LearnerConfig
from pettingllms.learner.learner import ADAPTERS_DISABLED, PolicyLearner

__all__ = [
    "ADAPTERS_DISABLED",
    "AdapterContext",
    "KLConfig",
    "LearnerConfig",
    "PolicyBatch",
    "PolicyLearner",
    "adapter_parameters",
    "build_batch",
    "micro_batches_by_tokens",
    "peft_adapter_context",
    "split_mini_batches",
]
