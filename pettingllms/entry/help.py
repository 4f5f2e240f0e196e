"""``pettingllms train --help`` and ``pettingllms eval --help``: the options, the configs and config groups, and
the keys users set most, with the values the chosen config gives them."""

from __future__ import annotations

from typing import Sequence

from pettingllms.core import PettingLLMsError

# The keys users set most, in the order --help lists them. What each one is, and the names it takes, come from its
# schema field (config/keys.py); every key is in docs/training.md and docs/evaluation.md.
TRAIN_KEYS = (
    "base_models.policy_0.path",
    "base_models.policy_0.lora.rank",
    "env.name",
    "env.dataset",
    "env.benchmark",
    "env.max_turns",
    "env.imports",
    "env.agents",
    "env.graph",
    "env.options",
    "rollout.branching",
    "rollout.mode",
    "optim.lr",
    "training.experiment_name",
    "training.total_training_steps",
    "training.train_batch_size",
    "training.max_prompt_length",
    "training.max_response_length",
    "training.val_freq",
    "training.save_freq",
    "training.max_ckpt_to_keep",
    "training.resume",
    "training.logger",
    "training.share_run_dir",
    "resources.use_ray",
)
EVAL_KEYS = (
    "base_models.policy_0.path",
    "model.checkpoint",
    "model.adapters",
    "model.server_url",
    "env.name",
    "env.benchmark",
    "env.max_val_problems",
    "eval.n",
    "eval.k",
    "eval.temperature",
    "eval.max_tokens",
    "eval.log_dir",
)

TRAIN_USAGE = """usage: pettingllms train [--config-name NAME] [--config-dir DIR] [--dry-run] [--multirun|-m] [key=value ...]

options:
  --config-name NAME  the config to start from (default: train)
  --config-dir DIR    also look for configs (and config groups) in DIR, before the packaged ones
  --dry-run           print the resolved config and the run plan, check the data, train nothing
  --multirun, -m      sweep: key=a,b / range(1,4) / choice(a,b); every job is checked before the first starts
  --help, -h          this text
  key=value           a Hydra override; +key=value adds a config group (+experiment=quick_test)"""

EVAL_USAGE = """usage: pettingllms eval [--config-name NAME] [--config-dir DIR] [key=value ...]

options:
  --config-name NAME  the config to start from (default: eval)
  --config-dir DIR    also look for configs in DIR, before the packaged ones
  --help, -h          this text
  key=value           a Hydra override"""


def help_text(command: str, config_name: str, config_dir: str | None = None, overrides: Sequence[str] = ()) -> str:
    """The help of ``command`` ("train" or "eval"), with values from ``config_name`` composed with ``overrides``."""
    from pettingllms.config.keys import key_named
    from pettingllms.config.load import compose, config_groups, config_names, from_schema, to_schema
    from pettingllms.config.schema import Config, EvalRunConfig

    usage, keys = (TRAIN_USAGE, TRAIN_KEYS) if command == "train" else (EVAL_USAGE, EVAL_KEYS)
    root = Config if command == "train" else EvalRunConfig
    names = [n for n in config_names(config_dir) if (n == "eval") == (command == "eval") or n not in ("eval", "train")]
    lines = [usage, "", f"configs (--config-name): {', '.join(names)}", "", "config groups:"]
    for group, options in config_groups(config_dir).items():
        if command == "eval" and group == "experiment":
            continue  # training presets
        prefix = "" if group == "specialization" else "+"
        lines.append(f"  {prefix}{group}={'|'.join(options)}")
    try:
        cfg = from_schema(to_schema(compose(config_name, overrides, config_dir)))  # schema defaults filled in
        values_from, error = f"config {config_name!r}", None
    except PettingLLMsError as exc:
        cfg, values_from, error = None, None, str(exc)
    lines += ["", f"keys users set most (values from {values_from}):" if cfg is not None else "keys users set most:"]
    width = max(len(key) for key in keys)
    for key in keys:
        value = _value(cfg, key) if cfg is not None else ""
        lines.append(f"  {key.ljust(width)}  {value:<24} {describe_key(key_named(key, root))}".rstrip())
    if error:
        lines += ["", f"(could not compose {config_name!r} to show its values: {error})"]
    docs = "docs/training.md" if command == "train" else "docs/evaluation.md"
    lines += ["", f"Every key: {docs}. The whole resolved config: pettingllms {command}"
                  f"{' --dry-run' if command == 'train' else ''} [--config-name NAME] ... "
                  f"{'' if command == 'train' else '(eval prints it into its run directory, config.yaml)'}".rstrip()]
    return "\n".join(lines)


def describe_key(key) -> str:
    """A key's line in --help: its help's first sentence, and the names an enum-typed key takes."""
    return key.summary + (f" ({' | '.join(key.choices)})" if key.choices else "")


def _value(cfg, key: str) -> str:
    from omegaconf import OmegaConf

    from pettingllms.config.keys import format_value

    value = OmegaConf.select(cfg, key, throw_on_missing=False, default="-")
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    return format_value(value)
