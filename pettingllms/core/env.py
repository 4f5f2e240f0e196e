"""The environment and agent API that built-in and user environments implement.

Design rules (they are what make tree sampling correct):
- ``Env.step`` is a pure transition: it takes a state and returns a new ``Transition``; it never mutates its
  input, so K branches stepped from one state cannot alias. States made of tuples and frozen dataclasses
  get this for free.
- Seeding happens only in ``reset``. Anything random inside ``step`` must derive from the state.
- ``terminated`` (the task ended) and ``truncated`` (stopped from outside) are kept apart.
- Agents hold no per-episode state: everything they need is in the env state. One agent object serves
  every episode and branch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from pettingllms.core.graph import AgentGraph
from pettingllms.core.types import Message, Transition

# How many problems a run asks an env that generates its own for: per training epoch, and per validation set (when
# env.max_val_problems is unset). The splits must be disjoint over these counts; the checker compares them.
PROCEDURAL_TRAIN_SIZE = 100_000
PROCEDURAL_TEST_SIZE = 50


@dataclass(frozen=True)
class Problem:
    """One task instance: a dataset row or a procedural seed, with a stable id."""

    problem_id: str
    data: Mapping[str, Any] = field(default_factory=dict)


class Agent(ABC):
    """A role: turns a state into chat messages, a response into an action, and scores its own part.

    ``known_options`` names the options the class reads from ``self.options`` (those its ``__init__`` does not
    name; ``Agent.__init__`` takes any): a run then refuses any other ``agents.<role>.options`` key with the close
    matches. ``None`` (undeclared) passes the options unchecked, with a warning at start-up; ``()`` reads none.
    """

    known_options: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, name: str, **options: Any) -> None:
        self.name = name
        self.options = dict(options)

    @abstractmethod
    def observe(self, state: Any, turn: int) -> list[Message]:
        """Chat messages that prompt this agent at ``turn``."""

    @abstractmethod
    def parse(self, response: str) -> Any:
        """The action in a model response. Must never raise, whatever the text."""

    def local_reward(self, state: Any) -> float:
        """This agent's own reward, read from the state its action produced. Default: none."""
        del state
        return 0.0


class Env(ABC):
    """A multi-agent environment with a pure transition function.

    ``known_options`` names the options the class reads from ``self.options`` (those its ``__init__`` does not
    name; ``Env.__init__`` takes any): a run then refuses any other ``env.options`` key with the close matches.
    ``None`` (undeclared) passes the options unchecked, with a warning at start-up; ``()`` reads none.
    """

    #: Agents acting each turn, in stages. Override per class or per instance.
    graph: ClassVar[AgentGraph]
    #: Role name -> agent registry name (or "module:Class"), used to build this env's agents.
    agent_classes: ClassVar[Mapping[str, str]]
    #: The options read from ``self.options`` (see the class docstring); None: undeclared, unchecked.
    known_options: ClassVar[tuple[str, ...] | None] = None
    #: Columns every dataset row must hold, with their types (``{"question": str, "answer": str}``; ``list[str]``
    #: for a list of strings): every row of ``env.dataset`` and ``env.benchmark`` is checked against it before step 1,
    #: and values are never converted. Optional: None checks only what the domain's loader writes.
    problem_fields: ClassVar[Mapping[str, Any] | None] = None

    def __init__(self, max_turns: int = 2, **options: Any) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.options = dict(options)

    @abstractmethod
    def reset(self, problem: Problem, seed: int) -> Any:
        """The initial state for ``problem``. The only place randomness is seeded."""

    @abstractmethod
    def step(self, state: Any, agent: str, action: Any) -> Transition:
        """Apply ``agent``'s ``action`` to ``state`` and return a *new* state. Never mutate ``state``."""

    @abstractmethod
    def team_reward(self, state: Any) -> float:
        """The shared outcome every agent is credited with (times ``reward.alpha``)."""

    @abstractmethod
    def success(self, state: Any) -> bool:
        """Whether the task is solved in ``state`` (the headline validation metric)."""

    def procedural_problems(self, split: str, count: int) -> Sequence[Problem]:
        """``count`` generated problems of ``split`` ("train" or "test"; the seed spaces must be disjoint).

        Only for envs that generate their tasks; the others read ``env.dataset`` files.
        """
        from pettingllms.core.errors import DataError

        raise DataError(f"{type(self).__name__} generates no problems itself: set env.dataset (and env.benchmark)")

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        """A few problems for the conformance checker and smoke tests. Override in every env."""
        del n
        return [Problem("example-0")]

    def acting_agents(self, state: Any) -> Sequence[str] | None:
        """The agents that act next from ``state``, when the state decides: a game's player to move, a resubmit
        after an invalid move, the starter of this hand. ``None`` (the default): ``graph`` decides, its stages for
        the turn. An env that names the acting agents runs one stage per turn: a "turn" is then one decision point
        (every named agent acts once, from the same state), ``max_turns`` bounds an episode's decision points, and
        the group key (problem, turn, agent) counts decision points. Agents not named generate nothing."""
        del state
        return None

    def outcome(self, state: Any) -> Mapping[str, float] | None:
        """Every agent's final result (a game's per-seat returns: win 1, loss -1, draw 0; chips won; zero-sum or
        not), read on an episode's final state whichever agent moved last, terminated or truncated. ``None`` (the
        default): the env has none, and rewards are ``team_reward`` and each agent's ``local_reward`` only.

        It reaches every move of an agent: in tree mode each candidate is valued by playouts to the end
        (``rollout.playouts``), in independent mode by its own episode's end, in trajectory mode it joins the
        agent's return (docs/self_play.md)."""
        del state
        return None

    @staticmethod
    def describe(state: Any) -> str:
        """A short human-readable state for logs."""
        return repr(state)[:500]


def decides_who_acts(env: Env) -> bool:
    """Whether ``env`` names its acting agents (overrides ``Env.acting_agents``) instead of following its graph."""
    return type(env).acting_agents is not Env.acting_agents


def has_outcome(env: Env) -> bool:
    """Whether ``env`` reports per-agent outcomes (overrides ``Env.outcome``): a game."""
    return type(env).outcome is not Env.outcome
