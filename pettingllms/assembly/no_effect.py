"""Settings a run's other settings switch off: set away from their defaults, they would change nothing, silently.
The plan names each one (``RunPlan.notes``): the dry run prints them, a run logs them at its start. Pure functions
over the config.

Only values that differ from the schema's defaults are named, so a shipped config that leaves them alone is quiet.
"""

from __future__ import annotations

from typing import Any, Sequence

from pettingllms.config.diff import flatten
from pettingllms.config.load import to_dict
from pettingllms.config.schema import AgentConfig, AlgorithmConfig, KLConfig, LoraConfig, RolloutConfig, SelfPlayConfig


def _changed(section: Any, default: Any, keys: tuple[str, ...]) -> list[str]:
    return [key for key in keys if _plain(getattr(section, key)) != _plain(getattr(default, key))]


def _plain(value: Any) -> Any:
    value = getattr(value, "value", value)  # an enum's value
    return list(value) if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig" else value


def no_effect(cfg: Any, acting: Sequence[str] | None = None) -> list[str]:
    """One line per setting that has no effect in this run, naming what switches it off. ``acting``: the agents
    that act (None: not known, and ``agents.<role>`` of the others is not looked at)."""
    notes = [] if acting is None else idle_agent_settings(cfg, acting)
    lora = LoraConfig()
    for name, model in cfg.base_models.items():
        if model.lora.rank <= 0:
            for key in _changed(model.lora, lora, ("alpha", "dropout", "target_modules")):
                notes.append(f"base_models.{name}.lora.{key} has no effect: lora.rank is 0 (a full fine-tune)")
        elif _changed(model.lora, lora, ("dropout",)):
            notes.append(f"base_models.{name}.lora.dropout has no effect: every learner pass runs with dropout off "
                         "(its log-probs must be the ones the engine sampled with)")
    env = getattr(cfg, "env", None)
    if env is not None and env.name == "program" and env.max_turns:
        notes.append("env.max_turns has no effect: an agent program decides its own turns "
                     "(env.options.timeout bounds one run)")
    algorithm = getattr(cfg, "algorithm", None)  # evaluation has none
    if algorithm is None:
        return notes
    if _plain(algorithm.filter) in ("none", "dapo") and _changed(algorithm, AlgorithmConfig(), ("filter_ratio",)):
        notes.append(f"algorithm.filter_ratio has no effect: only algorithm.filter=std or mean drops a fraction of "
                     f"groups (filter is {_plain(algorithm.filter)})")
    kl = algorithm.kl
    if kl.init_kl_coeff == 0:
        for key in _changed(kl, KLConfig(), ("kl_type", "adaptive", "kl_target", "kl_horizon")):
            notes.append(f"algorithm.kl.{key} has no effect: algorithm.kl.init_kl_coeff is 0 (no KL term)")
    rollout = getattr(cfg, "rollout", None)
    if rollout is not None and not rollout.streaming and _changed(rollout, RolloutConfig(), ("streaming_wait_s",)):
        notes.append("rollout.streaming_wait_s has no effect: rollout.streaming is false")
    if rollout is not None and _plain(rollout.mode) != "tree":
        for key in _changed(rollout, RolloutConfig(), ("select", "playouts")):
            notes.append(f"rollout.{key} has no effect: it chooses among a tree node's branches, and rollout.mode is "
                         f"{_plain(rollout.mode)}")
    self_play = getattr(cfg, "self_play", None)
    if self_play is not None and self_play.pool_size == 0:
        for key in _changed(self_play, SelfPlayConfig(), ("snapshot_every", "live_prob")):
            notes.append(f"self_play.{key} has no effect: self_play.pool_size is 0 (no opponent pool)")
    return notes


_ABSENT = object()  # a key the other side does not have (an option only this agent sets, to null included)


def idle_agent_settings(cfg: Any, acting: Sequence[str]) -> list[str]:
    """``agents.<role>`` of a role that does not act (L0's ``env.agents=[one]`` leaves the others out): its keys that
    differ from the schema's defaults. A key whose value an acting agent shares is left out, so a shipped config that
    gives every role the same sampling stays quiet under L0."""
    acting_values = [_agent_values(cfg.agents[role]) for role in acting if role in cfg.agents]
    default = _agent_values(AgentConfig())
    notes = []
    for role in sorted(set(cfg.agents) - set(acting)):
        values = _agent_values(cfg.agents[role])
        keys = [key for key, value in values.items() if value != default.get(key, _ABSENT)
                and not any(other.get(key, _ABSENT) == value for other in acting_values)]
        notes += [f"agents.{role}.{key} has no effect: {role} does not act in this run (the acting agents: "
                  f"{list(acting)})" for key in keys]
    return notes


def _agent_values(agent: AgentConfig) -> dict[str, Any]:
    return flatten(to_dict(agent))
