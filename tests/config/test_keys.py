"""Every schema key carries its help text on its field, and the records made from the schema are right."""

from __future__ import annotations

from omegaconf import MISSING

from pettingllms.config.keys import Key, config_keys, key_named, plain
from pettingllms.config.schema import Config, EvalRunConfig


def test_every_key_has_help_and_names_every_choice_it_takes():
    keys = config_keys(EvalRunConfig)
    assert [k.name for k in keys if not k.help.strip()] == []
    unnamed = [(k.name, c) for k in keys for c in k.choices if f"`{c}`" not in k.help]
    assert unnamed == []


def test_records_carry_the_instance_defaults_sections_and_choices():
    assert key_named("agents.solver.val_sampling.temperature").default == 0.0  # its section's default, not the class's
    path = key_named("base_models.policy_1.path")
    assert path.name == "base_models.<name>.path" and path.section == "base_models.<name>" and path.default == MISSING
    assert key_named("rollout.mode").choices == ("tree", "independent", "trajectory")
    assert key_named("training.logger").choices == ("console", "tensorboard", "wandb")
    assert key_named("optim.micro_batch_max_tokens").default == 8192
    assert key_named("specialization").section == "" and key_named("algorithm.kl.kl_type").section == "algorithm"
    assert "eval.n" not in {k.name for k in config_keys(Config)}


def test_the_summary_is_the_first_sentence_in_plain_text():
    key = Key("x", int, 0, "a first sentence, e.g. `this` [one](docs.md#a). Then more.")
    assert key.summary == "a first sentence, e.g. this one"
    assert plain("`a` and [b](c.md)") == "a and b"
