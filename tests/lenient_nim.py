"""A two-seat Nim in which every answer is a legal move, for tests of self-play machinery with an untrained model
(not registered: tests name it ``lenient_nim:LenientNim``). An answer takes 1 stone when its first character is a
"1", else 2 (at most what is left); whoever takes the last stone wins (+1, the other -1). Seats alternate from
player_0, so every game reaches both seats whatever the model writes."""

from __future__ import annotations

from dataclasses import dataclass

from pettingllms.core import Agent, AgentGraph, Env, Problem, Transition


@dataclass(frozen=True)
class NimState:
    stones: int
    to_move: int = 0
    winner: int | None = None


class Taker(Agent):
    def observe(self, state, turn):
        return [{"role": "user", "content": f"{state.stones} stones left. Take 1 or 2."}]

    def parse(self, text):
        return 1 if text[:1] == "1" else 2

    def local_reward(self, state):
        return 0.0


class LenientNim(Env):
    graph = AgentGraph.sequential(["player_0", "player_1"])
    agent_classes = {"player_0": "lenient_nim:Taker", "player_1": "lenient_nim:Taker"}
    known_options = ()

    def __init__(self, max_turns: int = 8, **options):
        super().__init__(max_turns=max_turns, **options)

    def reset(self, problem, seed):
        return NimState(stones=int(problem.data["stones"]))

    def acting_agents(self, state):
        return (f"player_{state.to_move}",) if state.winner is None else ()

    def step(self, state, agent, action):
        stones = state.stones - min(action, state.stones)
        if stones == 0:
            return Transition(NimState(0, -1, state.to_move), terminated=True)
        return Transition(NimState(stones, 1 - state.to_move))

    def outcome(self, state):
        if state.winner is None:
            return {"player_0": 0.0, "player_1": 0.0}
        return {f"player_{i}": 1.0 if i == state.winner else -1.0 for i in (0, 1)}

    def team_reward(self, state):
        return 0.0

    def success(self, state):
        return state.winner is not None

    def procedural_problems(self, split, count):
        start = 0 if split == "train" else 1_000_000  # past the 100,000 training tasks a run asks for
        return [Problem(f"nim-{start + i}", {"stones": 4 + (start + i) % 3}) for i in range(count)]

    @classmethod
    def example_problems(cls, n=2):
        return [Problem(f"nim-{i}", {"stones": 4 + i}) for i in range(n)]
