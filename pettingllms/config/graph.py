"""The agent graph a run executes: the env's own graph, or ``env.graph`` from the config, narrowed by ``env.agents``.

- ``env.graph: [[bidder_a, bidder_b], auctioneer]`` replaces the env class's graph: stages in order, each a list
  of agents acting from the same state (a plain name is a one-agent stage). It must name every acting agent once.
- ``env.agents: [a, b]`` selects the acting agents; the others do not act. It does not reorder them: without
  ``env.graph`` it must list them in the env graph's order, and with ``env.graph`` it must name the same agents.
- An agent of the env left out of ``env.graph`` is a mistake unless ``env.agents`` says it does not act.
"""

from __future__ import annotations

import difflib
from typing import Any, Sequence

from pettingllms.config.schema import EnvConfig
from pettingllms.core.errors import ConfigError
from pettingllms.core.graph import AgentGraph


def acting_graph(env_cfg: EnvConfig, env_graph: AgentGraph, env_label: str) -> AgentGraph:
    """The graph of the agents that act, in the order they act. Raises ConfigError naming the key and the fix.

    ``env_graph`` is the env's own graph (its agents are the env's agents); ``env_label`` names the env in errors.
    """
    env_agents = list(env_graph.agents)
    selected = _selected_agents(env_cfg.agents, env_agents, env_label)
    if env_cfg.graph is None:
        if selected is None:
            return env_graph
        in_graph_order = [a for a in env_agents if a in selected]
        if selected != in_graph_order:
            raise ConfigError(
                f"env.agents={selected} lists the agents in another order than the graph of {env_label}, "
                f"{describe_stages(env_graph.stage_list)}; env.agents selects agents, it does not reorder them: "
                f"write env.agents={_brackets(in_graph_order)}, or set the order with env.graph (e.g. "
                f"env.graph={_brackets(_brackets([a]) for a in selected)})")
        return env_graph.restricted_to(selected)
    graph = parse_graph(env_cfg.graph, env_agents, env_label)
    _check_coverage(graph, env_agents, selected, env_label)
    return graph


def parse_graph(stages: Any, env_agents: Sequence[str], env_label: str) -> AgentGraph:
    """``[[a, b], c]`` -> ``AgentGraph(((a, b), (c,)))``, every name one of ``env_agents``, none twice."""
    if isinstance(stages, str) or not isinstance(stages, (list, tuple)) or not stages:
        raise ConfigError(f"env.graph={stages!r} must be a non-empty list of stages, each a list of agents acting "
                          f"in parallel (or one agent's name), e.g. env.graph=[[a,b],[c]]")
    parsed = []
    for index, stage in enumerate(stages):
        names = [stage] if isinstance(stage, str) else stage
        if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"env.graph stage {index} ({stage!r}) must be an agent's name or a non-empty list of "
                              f"agents' names; {env_label}'s agents: {list(env_agents)}")
        for name in names:
            _check_env_agent(name, env_agents, env_label, f"env.graph stage {index}")
        parsed.append(tuple(names))
    seen: set[str] = set()
    for stage in parsed:
        for name in stage:
            if name in seen:
                raise ConfigError(f"env.graph names {name!r} twice; an agent acts once per turn, in one stage: "
                                  f"{describe_stages(parsed)}")
            seen.add(name)
    return AgentGraph(tuple(parsed))


def describe_stages(stages: Sequence[Sequence[str]]) -> str:
    """``[a, b] -> [c]``: stages in order, the agents of a stage act from the same state."""
    return " -> ".join("[" + ", ".join(stage) + "]" for stage in stages)


def _selected_agents(agents: Sequence[str] | None, env_agents: Sequence[str], env_label: str) -> list[str] | None:
    if agents is None:
        return None
    agents = list(agents)
    if not agents:
        raise ConfigError(f"env.agents=[] selects no agent; list the acting ones (of {list(env_agents)}) or leave "
                          f"it unset (null) for all of them")
    for name in agents:
        _check_env_agent(name, env_agents, env_label, "env.agents")
    twice = sorted({a for a in agents if agents.count(a) > 1})
    if twice:
        raise ConfigError(f"env.agents={agents} names {twice[0]!r} twice; list each acting agent once")
    return agents


def _check_coverage(graph: AgentGraph, env_agents: Sequence[str], selected: list[str] | None, env_label: str) -> None:
    in_graph = set(graph.agents)
    if selected is None:
        left_out = [a for a in env_agents if a not in in_graph]
        if left_out:
            raise ConfigError(
                f"env.graph leaves out {left_out}, agent(s) of {env_label} (agents: {list(env_agents)}); add them "
                f"to a stage, or, to run without them, also set env.agents={_brackets(graph.agents)}")
        return
    left_out = [a for a in selected if a not in in_graph]
    if left_out:
        raise ConfigError(f"env.graph leaves out {left_out}, which env.agents={selected} says act; add them to a "
                          f"stage of env.graph, or drop them from env.agents")
    extra = [a for a in graph.agents if a not in selected]
    if extra:
        raise ConfigError(f"env.graph has {extra}, which env.agents={selected} leaves out; drop them from "
                          f"env.graph, or add them to env.agents")


def _check_env_agent(name: str, env_agents: Sequence[str], env_label: str, where: str) -> None:
    if name not in env_agents:
        raise ConfigError(f"{where} names {name!r}, which is not an agent of {env_label}."
                          f"{_did_you_mean(name, env_agents)} Agents: {list(env_agents)}")


def _did_you_mean(name: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(map(repr, close))}?" if close else ""


def _brackets(items) -> str:
    return "[" + ",".join(items) + "]"
