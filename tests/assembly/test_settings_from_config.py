"""A setting has one default, the schema's: the executor's and the learner's settings have none of their own, and
the plan fills every field from the run's config."""

from __future__ import annotations

import dataclasses

from pettingllms.assembly.plan import executor_config_of, learner_config_of
from pettingllms.config.load import compose, to_schema
from pettingllms.learner import KLPenalty, LearnerConfig
from pettingllms.rollout.executor import ExecutorConfig

NOT_CONFIG_KEYS = {LearnerConfig: {"betas", "eps"}}  # AdamW constants no key sets


def test_the_executors_and_learners_settings_have_no_defaults_of_their_own():
    with_defaults = [f"{cls.__name__}.{f.name}" for cls in (ExecutorConfig, LearnerConfig, KLPenalty)
                     for f in dataclasses.fields(cls)
                     if f.name not in NOT_CONFIG_KEYS.get(cls, set())
                     and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)]
    assert with_defaults == []


def test_the_plan_fills_them_with_the_configs_values():
    cfg = to_schema(compose("train", ["rollout.mode=trajectory"]))
    executor, learner = executor_config_of(cfg), learner_config_of(cfg, "float32")
    assert (executor.mode, executor.branching, executor.max_prompt_length, executor.max_response_length) == (
        "trajectory", cfg.rollout.branching, cfg.training.max_prompt_length, cfg.training.max_response_length)
    assert learner.micro_batch_max_tokens == cfg.optim.micro_batch_max_tokens == 8192
    assert (learner.kl.coef, learner.kl.horizon) == (cfg.algorithm.kl.init_kl_coeff, cfg.algorithm.kl.kl_horizon)
