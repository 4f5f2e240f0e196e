"""Every numeric config key has a valid range (config/ranges.py), checked as the config is composed, naming the key."""

from __future__ import annotations

import pytest

from pettingllms.cli import main
from pettingllms.config.load import compose, schema_keys, to_schema
from pettingllms.config.ranges import EVAL_RANGES, RANGES, numeric_schema_keys
from pettingllms.config.schema import Config, EvalRunConfig
from pettingllms.core import ConfigError


def test_every_numeric_schema_key_has_a_range_and_every_range_a_key():
    numeric = set(numeric_schema_keys(Config)) | set(numeric_schema_keys(EvalRunConfig))
    assert "training.train_batch_size" in numeric and "base_models.<name>.lora.rank" in numeric
    assert "eval.k" in numeric and "base_models.<name>.num_gpus" in numeric  # a list and an Optional
    assert sorted(numeric - set(RANGES)) == [], "numeric schema keys without a range in config/ranges.py"
    known = set(schema_keys(Config)) | set(schema_keys(EvalRunConfig))
    assert sorted((set(RANGES) | set(EVAL_RANGES)) - known) == [], "ranges for keys the schema lacks"


def _outside(key: str) -> str:
    """An override one step outside ``key``'s range."""
    rule = RANGES[key]
    if rule.off:
        value = rule.low / 2
    elif rule.low is not None:
        value = rule.low if rule.low_open else rule.low - 1
    else:
        value = rule.high if rule.high_open else rule.high + 1
    name = key.replace("base_models.<name>", "base_models.policy_0").replace("agents.<name>", "agents.solver")
    return f"{name}=[{value:g}]" if key == "eval.k" else f"{name}={value:g}"


@pytest.mark.parametrize("key", sorted(RANGES))
def test_a_value_outside_the_range_is_refused_at_composition_naming_the_key(key):
    override = _outside(key)
    config = "eval" if key.startswith(("eval.", "model.")) else "train"
    name = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{name.replace('.', r'[.]')}=.*: must be "):
        to_schema(compose(config, [override]))


def test_the_bounds_themselves_are_accepted():
    lows = [f"{k}={RANGES[k].low:g}" for k in ("training.train_batch_size", "rollout.branching",
                                               "training.max_response_length", "training.val_freq",
                                               "optim.min_lr_ratio")]
    cfg = to_schema(compose("train", [*lows, "optim.min_lr_ratio=1", "algorithm.tis_cap=0", "algorithm.tis_cap=1"]))
    assert (cfg.training.train_batch_size, cfg.rollout.branching, cfg.training.val_freq) == (1, 2, 0)


def test_evaluation_reads_max_turns_0_as_the_envs_default_and_ignores_branching():
    cfg = to_schema(compose("eval", ["env.max_turns=0", "rollout.branching=1"]))
    assert cfg.env.max_turns == 0
    with pytest.raises(ConfigError, match=r"^env\.max_turns=-1: must be >= 0"):
        to_schema(compose("eval", ["env.max_turns=-1"]))
    with pytest.raises(ConfigError, match=r"^eval\.k=\[1, 4\]: pass@k needs 1 <= k <= eval\.n=2; \[4\] are out of range"):
        to_schema(compose("eval", ["eval.n=2", "eval.temperature=1", "eval.k=[1,4]"]))


@pytest.mark.parametrize("override, needle", [
    ("training.train_batch_size=-1", "training.train_batch_size=-1: must be >= 1 (problems per step)"),
    ("training.train_batch_size=0", "training.train_batch_size=0: must be >= 1 (problems per step)"),
    ("rollout.branching=1", "rollout.branching=1: must be in [2, 1024] (K candidates form one GRPO group"),
    ("training.max_response_length=0", "training.max_response_length=0: must be >= 1"),
])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_the_dry_run_and_the_run_refuse_a_no_op_config(override, needle, dry_run, tmp_path, capsys):
    flags = ["--dry-run"] if dry_run else []
    assert main(["train", *flags, "+experiment=quick_test", override, f"training.log_dir={tmp_path}"]) == 2
    assert f"error: {needle}" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing started, no checkpoint written


@pytest.mark.parametrize("mode", ["tree", "independent", "trajectory"])
def test_every_rollout_mode_needs_two_candidates_per_group(mode):
    with pytest.raises(ConfigError, match=r"^rollout\.branching=1: must be in \[2, 1024\]"):
        to_schema(compose("train", [f"rollout.mode={mode}", "rollout.branching=1"]))


def test_docs_list_every_range_as_the_table_has_it():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    section = doc.split("## Valid ranges", 1)[1].split("\n## ", 1)[0]
    listed = [line for line in section.splitlines() if line.startswith("- `")]
    assert listed == [f"- `{key}`: {rule.describe().removeprefix('must be ')}" for key, rule in RANGES.items()]
