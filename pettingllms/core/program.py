"""An env whose episode is one run of a user's agent program: the program talks to an OpenAI-compatible endpoint
(the run's gateway, ``rollout/gateway.py``), each agent naming itself in the request's ``model``, and returns each
agent's reward. The rollout (``rollout/program.py``) records every call's exact token ids, so the program is trained
as it is, unmodified.

A program cannot be forked: its state is a running process's, not a value. It trains in trajectory mode only (every
call of an agent in a run carries that agent's return; groups per (task, agent) over the task's K runs).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Mapping, Sequence

from pettingllms.core.env import Env, Problem
from pettingllms.core.errors import EnvError
from pettingllms.core.graph import AgentGraph
from pettingllms.core.types import Transition


class AgentProgram(Env):
    """Subclasses implement ``play`` and ``procedural_problems`` (its tasks) and set ``graph`` to the program's
    agents (the model names it uses). ``timeout_s``: seconds one run may take before it is recorded as failed."""

    timeout_s: float = 600.0

    def __init__(self, agents: Sequence[str], max_turns: int = 1, **options: Any) -> None:
        super().__init__(max_turns=max_turns, **options)
        if not agents or any(not isinstance(a, str) or not a for a in agents) or len(set(agents)) != len(agents):
            raise EnvError(f"an agent program needs its agents, the model names it uses, each once: got {agents!r}")
        self.graph = AgentGraph.parallel(list(agents))
        self.agent_classes = {agent: "program_agent" for agent in agents}

    @abstractmethod
    async def play(self, task: Mapping[str, Any], base_url: str, api_key: str) -> Mapping[str, float]:
        """One run of the program on ``task`` against ``base_url`` (``/v1`` included) with ``api_key`` as the bearer
        token; returns each agent's reward."""

    # An agent program is never stepped: these make the Env protocol whole and say so if anything tries.
    def reset(self, problem: Problem, seed: int) -> Any:
        return dict(problem.data)

    def step(self, state: Any, agent: str, action: Any) -> Transition:
        raise EnvError("an agent program runs as a whole (rollout/program.py); it has no step to call")

    def team_reward(self, state: Any) -> float:
        return 0.0

    def success(self, state: Any) -> bool:
        return False


def episode_success(rewards: Mapping[str, float]) -> bool:
    """A run succeeded when every agent it rewarded got a positive reward (a program's ``success_rate``)."""
    return bool(rewards) and all(r > 0 for r in rewards.values())


def checked_rewards(value: Any, agents: Sequence[str]) -> dict[str, float]:
    """The rewards a program returned, as floats, or EnvError naming what is wrong (non-finite values pass: the
    run's ``reward.non_finite`` decides)."""
    if not isinstance(value, Mapping):
        raise EnvError(f"the program returned {type(value).__name__}, not a dict of each agent's reward")
    unknown = sorted(str(k) for k in value if k not in agents)
    if unknown:
        raise EnvError(f"the program returned rewards for {unknown}, which are not among env.agents {list(agents)}")
    rewards = {}
    for agent, reward in value.items():
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise EnvError(f"the program's reward for {agent!r} is {reward!r}, not a number")
        rewards[agent] = float(reward)
    return rewards
