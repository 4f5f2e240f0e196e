"""Typed config: typos fail at start-up; specialization levels resolve to explicit policy maps."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import pettingllms
from pettingllms.config.load import compose, to_schema
from pettingllms.config.specialization import plan_run
from pettingllms.core import ConfigError

ROLES = ["alice", "bob"]


def cfg(*overrides):
    return to_schema(compose("train", list(overrides)))


def test_known_user_keys_exist():
    c = cfg(
        "base_models.policy_0.path=/models/x",
        "training.experiment_name=e",
        "training.total_training_steps=7",
        "training.epoch_size=100",
        "training.train_batch_size=3",
        "training.max_prompt_length=99",
        "training.max_response_length=11",
        "training.val_freq=2",
        "env.dataset=polaris",
        "env.benchmark=[AIME24,AIME25]",
        "env.max_turns=4",
    )
    assert c.base_models["policy_0"].path == "/models/x"
    assert (c.training.total_training_steps, c.training.epoch_size, c.training.val_freq) == (7, 100, 2)
    assert c.env.benchmark == ["AIME24", "AIME25"] and c.env.max_turns == 4


@pytest.mark.parametrize(
    "override,match",
    [
        ("training.total_trainin_steps=3", "total_trainin_steps"),
        ("training.total_training_steps=abc", "total_training_steps"),
        ("rollout.brnaching=2", "brnaching"),
        ("specialization=L9", "L9"),
    ],
)
def test_bad_keys_and_values_fail_clearly(override, match):
    with pytest.raises(ConfigError, match=match):
        compose("train", [override])


def test_l1_shares_one_policy():
    policies, agents = plan_run(cfg("specialization=L1"), ROLES)
    assert list(policies) == ["policy_0"] and policies["policy_0"].agents == ("alice", "bob")
    assert all(a.adapter is None for a in agents.values())


def test_l0_needs_exactly_one_agent():
    with pytest.raises(ConfigError, match="L0 is a single agent"):
        plan_run(cfg("specialization=L0"), ROLES)
    policies, agents = plan_run(cfg("specialization=L0", "env.agents=[bob]"), ROLES)
    assert list(agents) == ["bob"]


def test_l2_gives_each_agent_its_own_adapter():
    policies, agents = plan_run(cfg("specialization=L2"), ROLES)
    assert policies["policy_0"].adapters == ("alice", "bob")
    assert agents["alice"].adapter == "alice" and agents["bob"].adapter == "bob"
    with pytest.raises(ConfigError, match="lora.rank > 0"):
        plan_run(cfg("specialization=L2", "base_models.policy_0.lora.rank=0"), ROLES)


def test_l3_gives_each_agent_its_own_model():
    policies, agents = plan_run(cfg("specialization=L3"), ROLES)
    assert sorted(policies) == ["policy_alice", "policy_bob"]
    assert agents["alice"].policy == "policy_alice"
    assert policies["policy_bob"].model.path == "smollm2-135m-instruct"
    explicit = plan_run(
        cfg("specialization=L3", "+base_models.policy_1.path=other", "+agents.bob.policy=policy_1"), ROLES
    )[0]
    assert sorted(explicit) == ["policy_0", "policy_1"]


def test_unknown_agents_and_policies_are_rejected():
    with pytest.raises(ConfigError, match="does not have"):
        plan_run(cfg("+agents.carol.trainable=false"), ROLES)
    with pytest.raises(ConfigError, match="no base_models entry"):
        plan_run(cfg("+agents.bob.policy=policy_9"), ROLES)
    with pytest.raises(ConfigError, match="one shared policy"):
        plan_run(cfg("+base_models.policy_1.path=x", "+agents.bob.policy=policy_1"), ROLES)


def test_frozen_agents():
    policies, agents = plan_run(cfg("+agents.bob.trainable=false"), ROLES)
    assert not agents["bob"].trainable and policies["policy_0"].frozen_adapters == ("bob",)


def test_bad_sampling_is_named():
    # Refused as the config is composed (config/ranges.py), before the plan reads it.
    with pytest.raises(ConfigError, match=r"agents\.alice\.train_sampling\.top_p=0\.0: must be in \(0, 1\]"):
        plan_run(cfg("+agents.alice.train_sampling.top_p=0"), ROLES)


@pytest.mark.parametrize(
    "override,match",
    [
        ("+agents.alice.polcy=policy_0", r"agents.alice.*polcy"),
        ("base_models.policy_0.lora.rnak=3", "rnak"),
        ("+agents.alice.train_sampling.temperature=hot", "temperature"),
    ],
)
def test_typos_inside_dict_sections_fail_at_start_up(override, match):
    with pytest.raises(ConfigError, match=match):
        to_schema(compose("train", [override]))


def test_missing_model_path_is_named():
    with pytest.raises(ConfigError, match=r"base_models.policy_1.*path"):
        to_schema(compose("train", ["+base_models.policy_1.dtype=bfloat16"]))


def test_no_packaged_config_sets_hydra_keys_nothing_reads():
    """Configs are composed with Hydra's compose API and no Hydra app runs, so a ``hydra:`` block or a
    ``hydra/...`` default in a packaged config would be inert (``hydra.*`` overrides are refused for that reason)."""
    configs = Path(pettingllms.__file__).parent / "configs"
    inert = []
    for path in sorted(configs.rglob("*.yaml")):
        text = yaml.safe_load(path.read_text()) or {}
        defaults = [d for d in text.get("defaults", []) if isinstance(d, dict)]
        if "hydra" in text or any("hydra/" in key for d in defaults for key in d):
            inert.append(str(path.relative_to(configs)))
    assert inert == []
    for name in ("train", "eval"):
        assert "hydra" not in compose(name)
