"""``pettingllms train --help`` and ``pettingllms eval --help``: the options, the configs and config groups, and
the keys users set most, with the values the chosen config gives them."""

from __future__ import annotations

from typing import Sequence

from pettingllms.core import PettingLLMsError

# (key, what it is): the keys users set most. Every key is in docs/training.md and docs/evaluation.md.
TRAIN_KEYS = (
    ("base_models.policy_0.path", "model: local HF dir, hub id, or alias smollm2-135m-instruct / tiny-random-smollm2"),
    ("base_models.policy_0.lora.rank", "LoRA rank; 0 = full fine-tuning (L2 needs > 0)"),
    ("env.name", "environment: registry name or module:Class"),
    ("env.dataset", "training set: name, file (.parquet/.jsonl), hub id, [list] or {name: weight} mixture"),
    ("env.benchmark", "validation sets (same forms); [] = the env's own test split"),
    ("env.max_turns", "turns per episode"),
    ("env.imports", "modules to import first (they may register envs)"),
    ("env.agents", "the acting agents, in the graph's order (L0: one); null = all"),
    ("env.graph", "stages of agents, e.g. [[a,b],c]: a and b in parallel, then c; null = the env's"),
    ("env.options", "keyword options of the env class (env.options.key=value), checked against it"),
    ("rollout.branching", "K: candidates per (turn, agent) node"),
    ("rollout.mode", "tree | independent"),
    ("optim.lr", "peak learning rate"),
    ("training.experiment_name", "run directory logs/<experiment_name>/<date>/<time>"),
    ("training.total_training_steps", "training steps (and the LR schedule's length)"),
    ("training.train_batch_size", "problems per step"),
    ("training.max_prompt_length", "longest prompt in tokens"),
    ("training.max_response_length", "caps every agent's max_tokens"),
    ("training.val_freq", "validate every N steps (0: never)"),
    ("training.save_freq", "checkpoint every N steps (0: at the end only)"),
    ("training.max_ckpt_to_keep", "keep the newest N checkpoints (0: all)"),
    ("training.resume", "auto | none | <checkpoint dir>"),
    ("training.logger", "[console] + tensorboard, wandb"),
    ("training.share_run_dir", "true: run dirs readable by others (default: owner-only)"),
    ("resources.use_ray", "false: workers in this process (debugging)"),
)
EVAL_KEYS = (
    ("base_models.policy_0.path", "model: local HF dir, hub id, or alias"),
    ("model.checkpoint", "a training run (dir or <run>/checkpoints/step_N); its settings are the defaults"),
    ("model.adapters", "a folder of exported LoRA adapters on base_models.policy_0.path"),
    ("model.server_url", "an OpenAI-compatible server, e.g. http://host:8000/v1"),
    ("env.name", "environment of the benchmarks listed without <env>/"),
    ("env.benchmark", "[<name> | <env>/<name> | file | hub id, ...]"),
    ("env.max_val_problems", "the first N problems of each benchmark (0 = all)"),
    ("eval.n", "samples per problem"),
    ("eval.k", "the k of pass@k"),
    ("eval.temperature", "0 = greedy; null = each agent's val_sampling"),
    ("eval.max_tokens", "per response"),
    ("eval.log_dir", "run directory root"),
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
    from pettingllms.config.load import compose, config_groups, config_names, from_schema, to_schema

    usage, keys = (TRAIN_USAGE, TRAIN_KEYS) if command == "train" else (EVAL_USAGE, EVAL_KEYS)
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
    width = max(len(key) for key, _ in keys)
    for key, what in keys:
        value = _value(cfg, key) if cfg is not None else ""
        lines.append(f"  {key.ljust(width)}  {value:<24} {what}".rstrip())
    if error:
        lines += ["", f"(could not compose {config_name!r} to show its values: {error})"]
    docs = "docs/training.md" if command == "train" else "docs/evaluation.md"
    lines += ["", f"Every key: {docs}. The whole resolved config: pettingllms {command}"
                  f"{' --dry-run' if command == 'train' else ''} [--config-name NAME] ... "
                  f"{'' if command == 'train' else '(eval prints it into its run directory, config.yaml)'}".rstrip()]
    return "\n".join(lines)


def _value(cfg, key: str) -> str:
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, key, throw_on_missing=False, default="-")
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    return _format(value)


def _format(value) -> str:
    """Values as they are written on the command line: true, null, [a, b], {a: 1}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_format(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_format(v)}" for k, v in value.items()) + "}"
    return str(value)
