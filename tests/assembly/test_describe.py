"""The plan's description names the env as ``env.name`` names it (its registry name), then its class."""

from __future__ import annotations

from pettingllms.assembly.describe import describe_plan
from pettingllms.assembly.plan import plan
from pettingllms.config.load import compose, to_schema
from pettingllms.core.registry import ENVS, Registry


def test_the_env_line_gives_the_registry_name_and_the_class():
    cfg = to_schema(compose("train", ["env.name=arith_duo", "resources.use_ray=false"]))
    first = describe_plan(plan(cfg)).splitlines()[0]
    assert first.startswith("env:      arith_duo (pettingllms.envs.arith.env.ArithDuoEnv), max_turns 2")


def test_name_of_finds_a_class_registered_lazily_or_directly_and_none_otherwise():
    class Mine:
        pass

    registry = Registry("env")
    registry.register("mine", Mine)
    assert registry.name_of(Mine) == "mine"
    assert ENVS.name_of(ENVS.get("vault")) == "vault"  # registered as a "module:Class" string
    assert registry.name_of(Registry) is None
