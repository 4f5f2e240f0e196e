"""A checkpoint's training run as the evaluation's defaults.

``pettingllms eval model.checkpoint=<run>`` evaluates what the run trained the way its validation did. Per key:
a command-line override > the run's value (its ``config.yaml``) > ``pettingllms/configs/eval.yaml``'s default.
The run gives
- the model side (``MODEL_KEYS``): which agent is which policy and adapter, with what chat template options; where a
  model runs (``RUNTIME_KEYS`` of a ``base_models`` entry) stays the evaluation's;
- its env and held-out set (``ENV_KEYS``), unless the command line names another env (then they would describe
  the wrong one); ``reward.alpha`` and ``training.max_response_length``;
- the sampling: every ``eval.<key>`` of ``SAMPLING_KEYS`` not on the command line becomes None, "each agent's
  ``val_sampling``" (``tasks.agent_sampling``), so the run's config.yaml of the evaluation says so too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence

from pettingllms.config.frozen import evolve
from pettingllms.config.load import parse_overrides
from pettingllms.config.schema import Config, EvalRunConfig
from pettingllms.eval.run_code import code_settings, refuse_run_code
from pettingllms.eval.tasks import SAMPLING_KEYS

MODEL_KEYS = ("specialization", "base_models", "agents", "env.agents", "env.graph")
# The acting agents and their stages are one setting: a command line that sets either takes neither from the run
# (env.graph must name exactly the agents env.agents lets act).
ACTING_KEYS = ("env.agents", "env.graph")
ENV_KEYS = ("env.name", "env.imports", "env.options", "env.benchmark", "env.max_val_problems", "env.max_turns",
            "env.data_root")
RUN_KEYS = (*MODEL_KEYS, *ENV_KEYS, "reward.alpha", "training.max_response_length")
RUNTIME_KEYS = ("engine", "engine_options", "num_gpus", "tensor_parallel", "num_threads")


@dataclass(frozen=True)
class RunSettings:
    config: EvalRunConfig  # the evaluation config with the run's settings
    taken: dict[str, str]  # key -> the run's value, for every key whose value the run changed (sampling: one entry)


def override_keys(overrides: Sequence[str]) -> frozenset[str]:
    """The dotted keys that command-line overrides set (``+``, ``++`` and ``~`` included)."""
    return frozenset(o.key_or_group for o in parse_overrides(overrides))


def with_settings_of_run(cfg: EvalRunConfig, run: Config, user_keys: Collection[str], run_dir: Any = "") -> RunSettings:
    """``cfg`` with every ``RUN_KEYS`` value of ``run`` that ``user_keys`` leave open, and the eval sampling keys
    they leave open set to None (each agent's ``val_sampling``). A setting taken from the run that imports code is
    refused unless ``model.trust_run_code`` (``eval/run_code.py``)."""
    other_env = _covered("env.name", user_keys) and cfg.env.name != run.env.name
    acting_set = any(_covered(k, user_keys) for k in ACTING_KEYS)
    keys = [k for k in RUN_KEYS if not (other_env and k in (*ENV_KEYS, *ACTING_KEYS))
            and not (acting_set and k in ACTING_KEYS) and not _covered(k, user_keys)]
    changes: dict[str, Any] = {key: _get(run, key) for key in keys}
    if "base_models" in changes:  # where a model runs is the evaluation's choice
        changes["base_models"] = {
            name: dataclasses.replace(model, **{k: getattr(cfg.base_models[name], k) for k in RUNTIME_KEYS})
            if name in cfg.base_models else model for name, model in run.base_models.items()}
    changes.update({f"eval.{key}": None for key in SAMPLING_KEYS if not _covered(f"eval.{key}", user_keys)})
    merged = evolve(cfg, changes)
    for user_key in sorted(user_keys):  # the command line's keys inside what the run replaced win again
        if any(user_key.startswith(key + ".") for key in keys):
            merged = _put_back(merged, cfg, user_key.split("."))
    if not cfg.model.trust_run_code:
        ours = code_settings(cfg)
        refuse_run_code({k: v for k, v in code_settings(merged).items() if ours.get(k) != v}, run_dir,
                        "model.trust_run_code=true")
    taken = {key: _describe(_get(merged, key)) for key in changes if _get(merged, key) != _get(cfg, key)}
    from_agents = [key for key in SAMPLING_KEYS if taken.pop(f"eval.{key}", None) is not None]
    if from_agents:  # one entry: "eval.temperature/top_p/top_k/max_tokens"
        taken["eval." + "/".join(from_agents)] = "each agent's val_sampling"
    return RunSettings(merged, taken)


def _covered(key: str, user_keys: Collection[str]) -> bool:
    """Whether the command line set ``key`` itself or a section holding it."""
    return any(key == u or key.startswith(u + ".") for u in user_keys)


def _get(node: Any, key: str | Sequence[str]) -> Any:
    for part in key.split(".") if isinstance(key, str) else key:
        node = node[part] if isinstance(node, Mapping) else getattr(node, part)
    return node


def _has(node: Any, part: str) -> bool:
    return part in node if isinstance(node, Mapping) else hasattr(node, part)


def _put_back(merged: EvalRunConfig, cfg: EvalRunConfig, path: list[str]) -> EvalRunConfig:
    """``merged`` with the value of ``cfg`` at ``path``; an entry the run lacks (``agents.<role>``) comes whole."""
    node = merged
    for depth, part in enumerate(path, start=1):
        if depth == len(path) or not _has(node, part):
            try:
                return evolve(merged, {".".join(path[:depth]): _get(cfg, path[:depth])})
            except (KeyError, AttributeError):  # a deletion (~key): nothing to put back
                return merged
        node = _get(node, [part])
    return merged


def _describe(value: Any) -> str:
    """A short form of a taken value for the console: a base model's path, a role list, a scalar."""
    if isinstance(value, Mapping):
        parts = [f"{name}={getattr(entry, 'path', None)}" if hasattr(entry, "path") else
                 f"{name}={entry}" if isinstance(entry, (str, int, float, bool, list, tuple)) or entry is None else
                 str(name) for name, entry in value.items()]  # an option's value; an agent's entry by its role
        return "{" + ", ".join(parts) + "}"
    return str(getattr(value, "value", value))
