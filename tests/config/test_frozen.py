"""Configs are frozen after loading: nothing writes to a loaded config; changed copies come from ``evolve``."""

import copy
import pickle

import pytest

from pettingllms.config.frozen import FrozenConfigError, evolve, is_frozen, thaw
from pettingllms.config.load import compose, from_schema, to_schema, to_yaml
from pettingllms.core import ConfigError
from pettingllms.entry.train import load_config


@pytest.fixture(scope="module")
def cfg():
    return load_config("train", ["env.name=vault", "+agents.reader.options={hint: true}"])


@pytest.mark.parametrize("write", [
    lambda c: setattr(c, "specialization", "L2"),
    lambda c: setattr(c.training, "log_dir", "elsewhere"),
    lambda c: setattr(c.base_models["policy_0"].lora, "rank", 8),
    lambda c: delattr(c.optim, "lr"),
    lambda c: c.base_models.__setitem__("policy_1", c.base_models["policy_0"]),
    lambda c: c.agents.pop("reader"),
    lambda c: c.agents["reader"].options.update(hint=False),
    lambda c: c.training.logger.append("wandb"),
    lambda c: c.base_models["policy_0"].lora.target_modules.__setitem__(0, "x"),
])
def test_every_part_of_a_loaded_config_refuses_writes(cfg, write):
    before = to_yaml(cfg)
    with pytest.raises(FrozenConfigError, match="evolve"):
        write(cfg)
    assert to_yaml(cfg) == before


def test_the_error_is_a_config_error_and_an_attribute_error(cfg):
    with pytest.raises(ConfigError):
        cfg.training.seed = 1
    with pytest.raises(AttributeError):
        cfg.training.seed = 1


def test_evolve_returns_a_frozen_changed_copy_and_leaves_the_original(cfg):
    new = evolve(cfg, {"training.log_dir": "runs/0", "base_models.policy_0.lora.rank": 8, "agents": {}})
    assert (new.training.log_dir, new.base_models["policy_0"].lora.rank, new.agents) == ("runs/0", 8, {})
    assert cfg.training.log_dir != "runs/0" and cfg.base_models["policy_0"].lora.rank != 8 and cfg.agents
    assert new.env is cfg.env  # untouched sections are shared: both are read-only
    assert is_frozen(new) and is_frozen(new.training) and is_frozen(new.base_models)
    with pytest.raises(FrozenConfigError):
        new.training.log_dir = "x"


@pytest.mark.parametrize("key, match", [("training.lg_dir", "no field 'lg_dir'"),
                                        ("base_models.policy_9.path", "no entry 'policy_9'")])
def test_evolve_refuses_keys_the_config_lacks(cfg, key, match):
    with pytest.raises(ConfigError, match=match):
        evolve(cfg, {key: 1})


@pytest.mark.parametrize("clone", [copy.deepcopy, copy.copy, lambda c: pickle.loads(pickle.dumps(c))])
def test_copies_and_pickles_stay_equal_and_frozen(cfg, clone):  # Ray pickles configs to its actors
    other = clone(cfg)
    assert other == cfg and is_frozen(other) and is_frozen(other.agents["reader"].options)
    with pytest.raises(FrozenConfigError):
        other.agents["reader"].options["hint"] = False


def test_thaw_is_a_plain_mutable_deep_copy(cfg):
    plain = thaw(cfg)
    plain.training.seed = 123
    plain.agents["reader"].options["hint"] = False
    plain.training.logger.append("wandb")
    assert type(plain.agents) is dict and type(plain.training.logger) is list
    assert cfg.training.seed != 123 and cfg.agents["reader"].options["hint"] is True
    assert "wandb" not in cfg.training.logger


def test_the_config_round_trips_through_omegaconf(cfg):
    assert to_schema(from_schema(cfg)) == cfg
    assert to_schema(compose("train", ["env.name=vault", "+agents.reader.options={hint: true}"])) == cfg
