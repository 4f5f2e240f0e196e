"""``toy_targets``: each agent should write text rich in its own target character.

A tiny env with a real, learnable signal for tests and the fast learning checks.

- Agents: by default ``alice`` (target ``a``) and ``bob`` (target ``b``), in sequential stages each turn; each
  sees the other's last answer. Targets are set by ``targets={"agent": "char"}``.
- Local reward of an agent: the fraction of the non-space characters of its latest answer that equal its
  target character (0 for an empty answer).
- Team reward: the mean of all agents' latest scores.
- Terminates (success) when every agent's latest score is at least ``threshold``; otherwise it is truncated by
  the executor at ``max_turns``.
The state is a tuple of immutable values, so a step can never alias another branch's state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from pettingllms.core import Agent, AgentGraph, Env, Message, Problem, Transition


@dataclass(frozen=True)
class TargetsState:
    problem_id: str
    prompt: str
    targets: tuple[tuple[str, str], ...]  # (agent, target char)
    answers: tuple[tuple[str, str], ...] = ()  # (agent, latest answer)
    turn_steps: int = 0

    def answer(self, agent: str) -> str | None:
        return dict(self.answers).get(agent)

    def target(self, agent: str) -> str:
        return dict(self.targets)[agent]


def target_score(text: str | None, target: str) -> float:
    chars = [c for c in (text or "") if not c.isspace()]
    return sum(c == target for c in chars) / len(chars) if chars else 0.0


class TargetsEnv(Env):
    graph = AgentGraph.sequential(["alice", "bob"])
    agent_class = "toy.target_writer"  # every role uses it; subclasses may swap it
    agent_classes = {"alice": agent_class, "bob": agent_class}
    known_options = ()

    def __init__(
        self,
        max_turns: int = 2,
        targets: Mapping[str, str] | None = None,
        threshold: float = 0.9,
        parallel: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(max_turns=max_turns, **options)
        self.targets = dict(targets or {"alice": "a", "bob": "b"})
        self.threshold = threshold
        names = list(self.targets)
        self.graph = AgentGraph.parallel(names) if parallel else AgentGraph.sequential(names)
        self.agent_classes = {name: self.agent_class for name in names}

    def reset(self, problem: Problem, seed: int) -> TargetsState:
        del seed  # deterministic: nothing to sample
        prompt = str(problem.data.get("prompt", "Write something."))
        return TargetsState(problem.problem_id, prompt, tuple(sorted(self.targets.items())))

    def step(self, state: TargetsState, agent: str, action: Any) -> Transition:
        if agent not in self.targets:
            raise KeyError(f"unknown agent {agent!r}; this env has {sorted(self.targets)}")
        answers = dict(state.answers)
        answers[agent] = str(action) if action is not None else ""
        new = replace(state, answers=tuple(sorted(answers.items())), turn_steps=state.turn_steps + 1)
        return Transition(new, terminated=self.success(new))

    def team_reward(self, state: TargetsState) -> float:
        scores = [target_score(state.answer(a), t) for a, t in state.targets]
        return sum(scores) / len(scores)

    def success(self, state: TargetsState) -> bool:
        return all(target_score(state.answer(a), t) >= self.threshold for a, t in state.targets)

    def procedural_problems(self, split: str, count: int) -> list[Problem]:
        return [Problem(f"toy-{split}-{i}", {"prompt": f"Task {i}: write a short line."}) for i in range(count)]

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        return [Problem(f"toy-{i}", {"prompt": f"Task {i}: write a short line."}) for i in range(n)]


class TargetWriter(Agent):
    """Asks for text; the action is the raw response text."""

    known_options = ()

    def observe(self, state: TargetsState, turn: int) -> list[Message]:
        others = [f"{a} said: {t}" for a, t in state.answers if a != self.name]
        content = f"{state.prompt} You are {self.name}, turn {turn}."
        if others:
            content += " " + " ".join(others)
        return [{"role": "user", "content": content}]

    def parse(self, response: str) -> str:
        return response if isinstance(response, str) else ""

    def local_reward(self, state: TargetsState) -> float:
        return target_score(state.answer(self.name), state.target(self.name))
