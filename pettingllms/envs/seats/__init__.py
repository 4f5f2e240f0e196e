"""A seat at a game table: the agent of the library-game envs (``openspiel``, ``textarena``), and their problems
(one seed each).

The env renders what the seat to move sees into the state (``state.prompt``: the library's own observation text, the
legal moves where the library lists them, the reason a move was refused), so one agent class serves every game and
holds nothing per episode. The env decides who acts (``Env.acting_agents``): only the seat to move is asked.
"""

from __future__ import annotations

from typing import Any

from pettingllms.core import Agent, Message, Problem

MAX_ACTION_CHARS = 2_000  # a move is short; a flood of text is cut before the game's parser sees it
TEST_SEED_OFFSET = 10**9  # test problems' seeds start here: a space disjoint from training's


def seeded_problems(game: str, split: str, count: int) -> list[Problem]:
    """A library game's problems: one seed each (its chance, its opponent, its seat), train and test disjoint."""
    offset = {"train": 0, "test": TEST_SEED_OFFSET}[split]
    return [Problem(f"{game}-{offset + i}", {"seed": offset + i}) for i in range(count)]


def example_problems(n: int) -> list[Problem]:
    return [Problem(f"example-{i}", {"seed": i}) for i in range(n)]


class SeatAgent(Agent):
    """Options: ``instruction`` (text after the observation; default: the env's own)."""

    known_options = ("instruction",)

    def observe(self, state: Any, turn: int) -> list[Message]:
        instruction = self.options.get("instruction")
        text = state.prompt if instruction is None else f"{state.prompt}\n{instruction}"
        shot = getattr(state, "shot", ())  # a worked example the env offers (openspiel's one_shot)
        example: list[Message] = ([{"role": "user", "content": shot[0]}, {"role": "assistant", "content": shot[1]}]
                                  if shot else [])
        return [*example, {"role": "user", "content": text}]

    def parse(self, response: str) -> str:
        return response.strip()[:MAX_ACTION_CHARS]
