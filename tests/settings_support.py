"""The executor's and the learner's settings for tests that build them directly, made the way a run makes them:
from the schema's defaults through the plan (``assembly/plan.py``), then the test's own values. Neither class has
defaults of its own, so a test that leaves a setting alone gets the schema's value, as a run would."""

from __future__ import annotations

import dataclasses
from typing import Any

from pettingllms.assembly.plan import executor_config_of, learner_config_of
from pettingllms.config.schema import Config
from pettingllms.learner import KLPenalty, LearnerConfig
from pettingllms.rollout.executor import ExecutorConfig


def executor_config(**overrides: Any) -> ExecutorConfig:
    return dataclasses.replace(executor_config_of(Config()), **overrides)


def learner_config(*, total_steps: int, dtype: str = "float32", **overrides: Any) -> LearnerConfig:
    """``total_steps`` is required, as for the learner itself; ``dtype`` is the policy's (``base_models.<p>.dtype``)."""
    return dataclasses.replace(learner_config_of(Config(), dtype), total_steps=total_steps, **overrides)


def kl_penalty(**overrides: Any) -> KLPenalty:
    return dataclasses.replace(learner_config_of(Config(), "float32").kl, **overrides)
