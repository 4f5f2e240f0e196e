"""The precision and rollout-check keys map into every policy's worker spec and learner config, and impossible
combinations fail at start-up with the key to change."""

from __future__ import annotations

import pytest

from pettingllms.core.errors import ConfigError
from pettingllms.entry.train import load_config
from pettingllms.assembly.plan import plan

BASE = ["base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets"]


def specs(*overrides: str):
    return plan(load_config("train", [*BASE, *overrides])).worker_specs


def test_defaults_are_fp32_with_the_check_on_and_tis_off():
    (spec,) = specs("specialization=L1")
    assert (spec.dtype, spec.master_weights, spec.learner_weights_dtype) == ("float32", "float32", "float32")
    assert spec.learner.dtype == "float32"
    assert spec.learner.max_rollout_kl == 0.05 and spec.learner.tis_cap == 0.0


def test_bf16_compute_keeps_fp32_master_weights_unless_asked_and_the_keys_reach_every_policy():
    for spec in specs("specialization=L3", "base_models.policy_0.dtype=bfloat16",
                      "algorithm.rollout_check.max_kl=0.01", "algorithm.tis_cap=2.0"):
        assert (spec.dtype, spec.learner.dtype, spec.learner_weights_dtype) == ("bfloat16", "bfloat16", "float32")
        assert spec.learner.max_rollout_kl == 0.01 and spec.learner.tis_cap == 2.0
    (spec,) = specs("specialization=L1", "base_models.policy_0.dtype=bfloat16",
                    "base_models.policy_0.master_weights=bfloat16")
    assert spec.learner_weights_dtype == "bfloat16"


@pytest.mark.parametrize("overrides, message", [
    (["base_models.policy_0.master_weights=bfloat16"], "needs base_models.policy_0.dtype=bfloat16"),
    (["base_models.policy_0.master_weights=float16"], r"expected one of \[float32, bfloat16\] \(key master_weights\)"),
    # Refused as the config is composed (config/ranges.py), before the learner's own check sees them.
    (["algorithm.tis_cap=0.5"], r"algorithm\.tis_cap=0\.5: must be 0 \(off\) or >= 1"),
    (["algorithm.rollout_check.max_kl=-1"], r"algorithm\.rollout_check\.max_kl=-1\.0: must be >= 0"),
])
def test_impossible_settings_fail_at_start_up(overrides, message):
    with pytest.raises(ConfigError, match=message):
        specs("specialization=L1", *overrides)
