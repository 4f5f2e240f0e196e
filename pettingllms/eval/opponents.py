"""``model.opponent``: each agent in turn plays with the evaluated weights while every other agent plays the opponent.

A game's evaluation against a fixed opponent, from both seats: for each agent of an env, one pass over every
benchmark in which that agent uses the evaluated weights (``model.checkpoint``, ``model.adapters``,
``model.server_url`` or the base models) and every other agent uses the opponent's:
- ``base``: the base models of ``base_models``, untrained (fresh LoRA adapters leave a base model unchanged);
- a trainer run directory (its latest checkpoint) or a ``checkpoints/step_N`` directory: that checkpoint's trained
  weights on the same base models (another run of the same setup, or an earlier step of this one);
- ``http://…/v1`` or ``https://…/v1``: an OpenAI-compatible server (``model.served_name`` names its model).

The opponent's policies are served beside the evaluated ones under the names ``opponent:<policy>``, so the
executor routes each agent's requests by its policy name alone. A pass's records go to
``records/<env>/<benchmark>@<agent>.jsonl`` and its summary to ``benchmarks["<env>/<benchmark>@<agent>"]``, with
``"seat": <agent>`` (the agent that played with the evaluated weights).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping, Sequence

from pettingllms.assembly.plan import is_served
from pettingllms.config.frozen import evolve
from pettingllms.config.schema import EvalModelConfig, ModelConfig
from pettingllms.core import ConfigError
from pettingllms.eval.checkpoints import read_run_config, resolve_checkpoint
from pettingllms.eval.policies import LoadedPolicies, load_policies
from pettingllms.rollout.executor import AgentSpec
from pettingllms.runtime.spec import WorkerSpec

BASE = "base"
PREFIX = "opponent:"


def opponent_kind(value: str) -> str:
    """``base``, ``server`` or ``checkpoint``: what ``model.opponent=value`` names."""
    if value == BASE:
        return "base"
    if value.startswith(("http://", "https://")):
        return "server"
    return "checkpoint"


def is_opponent(policy: str) -> bool:
    return policy.startswith(PREFIX)


def check_opponent(value: str, base_models: Mapping[str, ModelConfig]) -> None:
    """Before any model loads: a checkpoint opponent exists, is complete, and was trained on these base models."""
    if opponent_kind(value) != "checkpoint":
        return
    _, run = resolve_checkpoint(value, "model.opponent")
    theirs = read_run_config(run).base_models
    differ = {name: (model.path, theirs[name].path) for name, model in base_models.items()
              if name in theirs and theirs[name].path != model.path}
    if differ:
        raise ConfigError(f"model.opponent={value} was trained on other base models: " + ", ".join(
            f"{name}: {theirs_} (this evaluation: {ours})" for name, (ours, theirs_) in sorted(differ.items())))


def load_opponent(m: EvalModelConfig, specs: dict[str, WorkerSpec], roles: Sequence[str], seed: int
                  ) -> LoadedPolicies:
    """The opponent's policies, loaded as the evaluated ones are (``load_policies``), named ``opponent:<policy>``."""
    value = m.opponent
    kind = opponent_kind(value)
    plain = evolve(m, {"checkpoint": None, "adapters": None, "server_url": value if kind == "server" else None})
    checkpoint = resolve_checkpoint(value, "model.opponent")[0] if kind == "checkpoint" else None
    loaded = load_policies(plain, specs, roles, seed, checkpoint)
    rename = {policy: PREFIX + policy for policy in loaded.clients}
    return LoadedPolicies({rename[p]: c for p, c in loaded.clients.items()},
                          described={rename[p]: {**d, "opponent": value} for p, d in loaded.described.items()},
                          engines={rename[p]: e for p, e in loaded.engines.items()})


def merged(evaluated: LoadedPolicies, opponent: LoadedPolicies) -> LoadedPolicies:
    """One set of clients for the executor: the evaluated policies and the opponent's."""
    return LoadedPolicies({**evaluated.clients, **opponent.clients}, dict(evaluated.agent_adapters),
                          {**evaluated.described, **opponent.described}, {**evaluated.engines, **opponent.engines})


def seatings(agent_specs: Mapping[str, AgentSpec], opponent: bool
             ) -> Iterator[tuple[str | None, dict[str, AgentSpec]]]:
    """(seat, agent specs) for each pass: without an opponent one pass (seat None) with the specs as they are; with
    one, a pass per agent, every other agent moved to its policy's opponent (the adapter it has, on that policy)."""
    if not opponent:
        yield None, dict(agent_specs)
        return
    if len(agent_specs) < 2:
        raise ConfigError(f"model.opponent plays the other agents, but the env has one agent ({list(agent_specs)}): "
                          "for a single-agent env against a fixed player use the env's own option (e.g. "
                          "env.options.opponent=random)")
    seats = [role for role, spec in agent_specs.items() if not is_served(spec.policy)]
    if not seats:
        raise ConfigError("model.opponent: every agent is played by a server (agents.<role>.server.url); no seat is "
                          "left for the evaluated weights")
    for seat in seats:  # an agent a server plays keeps its server in every pass and is never the evaluated seat
        yield seat, {role: spec if role == seat or is_served(spec.policy)
                     else dataclasses.replace(spec, policy=PREFIX + spec.policy) for role, spec in agent_specs.items()}
