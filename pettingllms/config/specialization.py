"""Resolve a config into who-uses-which-policy: the specialization levels L0-L3, made explicit.

- L0: one agent (``env.agents=[role]``) on one policy. At every level ``env.agents`` selects the acting agents.
- L1: every agent on one shared policy; roles differ by prompt.
- L2: one shared base model with one LoRA adapter per agent, named after the agent.
- L3: one model per agent. Agents that would share a policy get their own entry (its config), named
  ``policy_<agent>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from pettingllms.config.frozen import evolve, thaw
from pettingllms.config.graph import acting_graph
from pettingllms.config.schema import AgentConfig, AgentServerConfig, Config, ModelConfig, SamplingConfig
from pettingllms.core.choices import Specialization
from pettingllms.core.errors import ConfigError
from pettingllms.core.graph import AgentGraph
from pettingllms.core.types import SamplingParams

LEVELS = Specialization.values()


@dataclass(frozen=True)
class AgentPlan:
    role: str
    policy: str
    adapter: str | None
    trainable: bool
    train_sampling: SamplingParams
    val_sampling: SamplingParams
    cls: str | None
    options: Mapping
    server: AgentServerConfig | None = None  # agents.<role>.server: a served model plays the agent (never trained)


@dataclass(frozen=True)
class PolicyPlan:
    name: str
    model: ModelConfig
    agents: tuple[str, ...]  # agents this policy serves
    adapters: tuple[str, ...]  # L2: one adapter per agent; empty otherwise
    frozen_adapters: tuple[str, ...]  # adapters of agents with trainable=false
    config_key: str = ""  # the base_models.<key> its settings come from ("": its name; an L3 copy's source entry)

    @property
    def trainable(self) -> bool:
        return bool(self.model_trainable_agents)

    @property
    def model_trainable_agents(self) -> tuple[str, ...]:
        return tuple(a for a in self.agents if a not in self.frozen_adapters)


def plan_run(cfg: Config, env_roles: Sequence[str], acting: Sequence[str] | None = None,
             ) -> tuple[dict[str, PolicyPlan], dict[str, AgentPlan]]:
    """Map every acting agent to a policy (and adapter). Raises ConfigError naming what is wrong.

    ``env_roles`` are the env's agents (``agents.*`` entries must name one of them); ``acting`` are the agents that
    act, in graph order (``config.graph.acting_graph``); None: ``env_roles`` narrowed by ``env.agents``."""
    unknown = sorted(set(cfg.agents) - set(env_roles))
    if unknown:
        raise ConfigError(f"config has agents {unknown} that env {cfg.env.name!r} does not have: {list(env_roles)}")
    if acting is None:
        acting = acting_graph(cfg.env, AgentGraph.sequential(env_roles), f"env {cfg.env.name!r}").agents
    roles = list(acting)
    level = cfg.specialization
    if level not in LEVELS:
        raise ConfigError(f"specialization must be one of {LEVELS}, got {level!r}")
    agent_cfgs = {role: cfg.agents.get(role, AgentConfig()) for role in roles}
    models = dict(cfg.base_models)
    copied: dict[str, str] = {}  # L3's copies -> the base_models entry each copies
    if level == "L0" and len(roles) != 1:
        raise ConfigError(f"L0 is a single agent: set env.agents=[<one of {list(env_roles)}>], got {roles}")
    if level == "L3":
        agent_cfgs, models, copied = _split_shared_policies(agent_cfgs, models)
    used = {a.policy for a in agent_cfgs.values()}
    missing = sorted(used - set(models))
    if missing:
        raise ConfigError(f"agents use policies {missing} with no base_models entry; defined: {sorted(models)}")
    if level in ("L0", "L1", "L2") and len(used) != 1:
        raise ConfigError(f"{level} uses one shared policy, but agents map to {sorted(used)}; use L3 for several")
    if level == "L2" and models[next(iter(used))].lora.rank <= 0:
        raise ConfigError("L2 needs base_models.<policy>.lora.rank > 0 (one LoRA adapter per agent)")
    agents = {role: _agent_plan(role, a, level) for role, a in agent_cfgs.items()}
    policies = {name: _policy_plan(name, models[name], agents, level, copied.get(name, "")) for name in sorted(used)}
    return policies, agents


def _split_shared_policies(
    agent_cfgs: dict[str, AgentConfig], models: dict[str, ModelConfig]
) -> tuple[dict[str, AgentConfig], dict[str, ModelConfig], dict[str, str]]:
    """L3: one copy ``policy_<agent>`` of every base_models entry that several agents use; also returns each
    copy's source entry."""
    users: dict[str, list[str]] = {}
    copied: dict[str, str] = {}
    for role, a in agent_cfgs.items():
        users.setdefault(a.policy, []).append(role)
    agent_cfgs, models = dict(agent_cfgs), dict(models)
    for policy, roles in users.items():
        if len(roles) < 2:
            continue
        if policy not in models:
            raise ConfigError(f"agents {roles} use policy {policy!r}, which has no base_models entry")
        for role in roles:
            name = f"policy_{role}"
            models[name] = models[policy]  # read-only, so the entries may share it
            copied[name] = policy
            agent_cfgs[role] = _with_policy(agent_cfgs[role], name)
    return agent_cfgs, models, copied


def _with_policy(agent: AgentConfig, policy: str) -> AgentConfig:
    return evolve(agent, {"policy": policy})


def _agent_plan(role: str, a: AgentConfig, level: str) -> AgentPlan:
    served = a.server.url is not None
    if served and a.trainable:
        raise ConfigError(f"agents.{role}.server.url={a.server.url}: a served model is never updated, so the agent "
                          f"cannot train; set agents.{role}.trainable=false")
    if served and not a.server.url.startswith(("http://", "https://")):
        raise ConfigError(f"agents.{role}.server.url must be an http(s) API root such as http://host:8000/v1, got "
                          f"{a.server.url!r}")
    return AgentPlan(
        role=role,
        policy=a.policy,
        adapter=role if level == "L2" else None,
        trainable=a.trainable,
        train_sampling=_sampling(a.train_sampling, f"agents.{role}.train_sampling"),
        val_sampling=_sampling(a.val_sampling, f"agents.{role}.val_sampling"),
        cls=a.cls,
        options=thaw(a.options),
        server=a.server if served else None,
    )


def _policy_plan(name: str, model: ModelConfig, agents: Mapping[str, AgentPlan], level: str,
                 config_key: str) -> PolicyPlan:
    mine = tuple(role for role, a in agents.items() if a.policy == name)
    frozen = tuple(role for role in mine if not agents[role].trainable)
    return PolicyPlan(name, model, mine, mine if level == "L2" else (), frozen, config_key)


def _sampling(s: SamplingConfig, where: str) -> SamplingParams:
    try:
        return SamplingParams(s.temperature, s.top_p, s.top_k, s.max_tokens)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
