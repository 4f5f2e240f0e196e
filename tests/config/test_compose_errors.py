"""compose(): every key is checked with or without Hydra's '+', hydra.* is refused, OmegaConf's cause is shown,
and --config-dir is searched before the packaged configs."""

from __future__ import annotations

import pytest

from pettingllms.config.load import compose, schema_keys, to_schema
from pettingllms.config.schema import Config, EvalRunConfig
from pettingllms.core import ConfigError


@pytest.mark.parametrize("override, named, suggested", [
    ("+rollout.branchng=4", "rollout.branchng", "rollout.branching"),  # '+' used to add it silently
    ("++rollout.branchng=4", "rollout.branchng", "rollout.branching"),
    ("rollout.branchng=4", "rollout.branchng", "rollout.branching"),
    ("+typo=1", "typo", None),
    ("+trainng.seed=1", "trainng", "training"),
    ("training.lr=1e-5", "training.lr", "optim.lr"),  # the right name in another section
    ("+agents.alice.polcy=policy_0", "agents.alice.polcy", "agents.alice.policy"),
    ("agents.alice.train_sampling.temprature=1", "agents.alice.train_sampling.temprature",
     "agents.alice.train_sampling.temperature"),
    ("base_models.policy_0.lora.rnak=3", "base_models.policy_0.lora.rnak", "base_models.policy_0.lora.rank"),
    ("+experimnt=quick_test", "experimnt", "+experiment=..."),
])
def test_unknown_keys_fail_with_or_without_plus_and_name_the_close_match(override, named, suggested):
    with pytest.raises(ConfigError) as info:
        compose("train", [override])
    message = str(info.value)
    assert f"unknown config key '{named}'" in message
    if suggested:
        assert f"Did you mean '{suggested}'" in message
    else:
        assert "Did you mean" not in message


def test_free_form_dicts_and_config_groups_still_take_plus():
    cfg = compose("train", ["+env.options.train_pool=16", "+experiment=quick_test",
                            "+base_models.policy_0.engine_options.enforce_eager=true"])
    assert cfg.env.options.train_pool == 16 and cfg.env.name == "arith_duo"


def test_the_eval_schema_is_checked_too():
    with pytest.raises(ConfigError, match=r"unknown config key 'eval.nn'.*Did you mean 'eval.n'"):
        compose("eval", ["+eval.nn=2"])
    assert isinstance(to_schema(compose("eval", ["eval.n=2"])), EvalRunConfig)


@pytest.mark.parametrize("override", ["hydra.run.dir=/tmp/x", "+hydra.job.chdir=true", "hydra/launcher=basic",
                                      "hydra.verbose=true"])
def test_hydra_overrides_are_refused(override):
    with pytest.raises(ConfigError, match=r"hydra\.\* overrides have no effect here and are refused.*training.log_dir"):
        compose("train", [override])


@pytest.mark.parametrize("override, cause", [
    ("optim.lr=abc", "could not convert string to float: 'abc'"),
    ("rollout.branching=many", "Value 'many' of type 'str' could not be converted to Integer (key rollout.branching)"),
    ("training.val_before_train=maybe", "training.val_before_train"),
])
def test_bad_values_show_omegaconfs_cause(override, cause):
    with pytest.raises(ConfigError) as info:
        compose("train", [override])
    assert cause in str(info.value) and "Error merging override" in str(info.value)


def test_bad_syntax_and_options_are_named():
    with pytest.raises(ConfigError, match="unknown option '--hepl'"):
        compose("train", ["--hepl"])
    with pytest.raises(ConfigError, match=r"cannot parse the override 'optim.lr=\[1'"):
        compose("train", ["optim.lr=[1"])


def test_a_value_hydra_cannot_parse_unquoted_gets_the_quoted_shell_line_that_works():
    with pytest.raises(ConfigError) as info:
        compose("train", ["env.name=openspiel", "env.options.game=kuhn_poker(players=3)"])
    hint = "\"env.options.game='kuhn_poker(players=3)'\""
    assert str(info.value).endswith(hint)
    shell_word = hint.strip('"')  # what the shell hands over from that line
    cfg = compose("train", ["env.name=openspiel", shell_word])
    assert cfg.env.options.game == "kuhn_poker(players=3)"
    with pytest.raises(ConfigError) as info:
        compose("train", ["optim.lr=[1"])
    assert "in quotes" not in str(info.value)  # a bracket opens a list: no quoting hint


def test_config_names_and_group_options_suggest_the_existing_ones():
    with pytest.raises(ConfigError, match=r"no config named 'quikstart'.*Did you mean 'quickstart'"):
        compose("quikstart")
    with pytest.raises(ConfigError, match=r"specialization=L9: config group 'specialization' has no option 'L9'.*"
                                          r"Options: L0, L1, L2, L3"):
        compose("train", ["specialization=L9"])


def test_config_dir_is_searched_before_the_packaged_configs(tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - quickstart\n  - _self_\n\nrollout:\n  branching: 7\n")
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "wide.yaml").write_text("# @package _global_\nrollout:\n  branching: 9\n")
    (tmp_path / "typo.yaml").write_text("defaults:\n  - train\n  - _self_\n\nrollout:\n  branchng: 7\n")
    mine = to_schema(compose("mine", [], tmp_path))
    assert mine.rollout.branching == 7 and mine.env.name == "vault"  # quickstart's, from the packaged dir
    assert to_schema(compose("quickstart", ["+experiment=wide"], tmp_path)).rollout.branching == 9
    assert compose("train", ["+experiment=quick_test"], tmp_path).env.name == "arith_duo"  # packaged group too
    with pytest.raises(ConfigError, match="branchng"):
        compose("typo", [], tmp_path)
    (tmp_path / "bare.yaml").write_text("rollout:\n  branching: 2\n")
    with pytest.raises(ConfigError, match="not built on the pettingllms schema.*defaults: \\[train, _self_\\]"):
        compose("bare", [], tmp_path)
    with pytest.raises(ConfigError, match="is not a directory"):
        compose("train", [], tmp_path / "nope")


def test_every_schema_key_composes_by_its_documented_name():
    keys = schema_keys(Config)
    assert "rollout.branching" in keys and "base_models.<name>.lora.rank" in keys
    assert "training.max_ckpt_to_keep" in keys


def test_every_misspelt_key_of_a_command_line_is_named_at_once():
    """Hydra stops at the first unknown key; a user fixing one typo per run deserves the whole list."""
    for overrides in (["rollout.branchng=4", "optim.lrr=1"], ["+rollout.branchng=4", "+optim.lrr=1"]):
        with pytest.raises(ConfigError) as info:
            compose("train", overrides)
        text = str(info.value)
        assert text.startswith("2 unknown config keys:")
        assert "'rollout.branchng' (from " in text and "Did you mean 'rollout.branching'?" in text
        assert "'optim.lrr' (from " in text and "Did you mean 'optim.lr'?" in text
    with pytest.raises(ConfigError) as info:  # the eval schema's keys, for an eval config
        compose("eval", ["eval.nn=3", "model.checkpoint=x"])
    assert str(info.value).startswith("unknown config key 'eval.nn'") and "model" not in str(info.value).split("?")[0]
