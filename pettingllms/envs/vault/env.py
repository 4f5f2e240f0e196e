"""``vault``: two agents open a vault together. Each holds half of the code; neither can open it alone.

- Problems: generated from a seed. The **reader** holds a card with three labelled two-digit numbers in random order
  (its half of the code, labelled ``code``, and two distractors such as ``room 24``); the **opener** holds the other
  half. Train and test draw from disjoint seed spaces (``split="test"`` seeds start at 10**9), so validation never
  sees a training problem.
- Agents (sequential each turn): the reader reads its card and tells the opener its half; the opener types the code:
  its own half first, then the reader's, as ``CODE: <digits>``. The opener sees only the reader's message, never
  the card, so the team succeeds only if the reader relays the right number and the opener combines the halves in
  the right order. After a wrong code both see the attempt in the next turn.
- Rewards: team = 1 when the vault opens, else 0. The reader's local reward is 1 when the last number in its message
  is its half (it relayed the right one); the opener has no local reward (its job is the team's outcome).
  Every agent's reward is ``alpha * team + local``.
- Termination: the vault opens (terminated), or ``max_turns`` attempts. Success = the vault is open.
- ``players=1`` (an env option): the same task for one agent, the **solo** player, who holds the card and the
  opener's half and types the code itself (the single-agent baseline of ``benchmarks/learning_claims.py``).

The quickstart's task: SmolLM2-135M relays reliably but types the halves in the order it reads them (the reader's
first) far more often than the rule asks; the order is a protocol the team can learn from reward, and learning it
carries over to codes it never saw. One worked example per prompt gives a 135M model a usable GRPO signal.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

from pettingllms.core import Agent, AgentGraph, Env, Message, Problem, Transition

TEST_SEED_OFFSET = 10**9
READER, OPENER, SOLO = "reader", "opener", "solo"
DISTRACTORS = ("room", "floor", "door", "locker", "box")


@dataclass(frozen=True)
class VaultState:
    card: str  # what the reader sees, e.g. "room 24, code 31, floor 7"
    reader_half: int
    opener_half: int
    message: str | None = None  # the reader's latest message
    relayed: int | None = None  # the last number in it
    attempt: str | None = None  # the opener's latest code ("" when it typed none)
    opened: bool = False

    @property
    def code(self) -> str:
        return f"{self.opener_half}{self.reader_half}"


def make_problem(seed: int) -> Problem:
    rng = random.Random(seed)
    reader_half, opener_half = rng.randint(10, 99), rng.randint(10, 99)
    fields = [("code", reader_half)] + [(label, rng.randint(10, 99)) for label in rng.sample(DISTRACTORS, 2)]
    rng.shuffle(fields)
    card = ", ".join(f"{label} {value}" for label, value in fields)
    return Problem(f"vault-{seed}", {"card": card, "reader_half": reader_half, "opener_half": opener_half})


def last_number(text: str) -> int | None:
    numbers = re.findall(r"\d+", text) if isinstance(text, str) else []
    return int(numbers[-1]) if numbers else None


def parse_code(text: str) -> str:
    """The digits after the last ``CODE:``; "" when there is none."""
    found = re.findall(r"CODE:\s*(\d+)", text) if isinstance(text, str) else []
    return found[-1] if found else ""


class VaultEnv(Env):
    graph = AgentGraph.sequential([READER, OPENER])
    agent_classes = {READER: "vault.reader", OPENER: "vault.opener", SOLO: "vault.solo"}
    known_options = ()
    domain = "games"
    problem_fields = {"card": str, "reader_half": int, "opener_half": int}

    def __init__(self, max_turns: int = 2, players: int = 2, **options: Any) -> None:
        super().__init__(max_turns=max_turns, **options)
        if players not in (1, 2):
            raise ValueError(f"players must be 1 (one agent does it all) or 2 (reader and opener), got {players}")
        if players == 1:
            self.graph = AgentGraph.sequential([SOLO])

    def reset(self, problem: Problem, seed: int) -> VaultState:
        del seed  # the problem fixes everything
        data = problem.data
        return VaultState(str(data["card"]), int(data["reader_half"]), int(data["opener_half"]))

    def step(self, state: VaultState, agent: str, action: Any) -> Transition:
        if agent == READER:
            message = str(action or "")
            return Transition(replace(state, message=message, relayed=last_number(message)))
        if agent in (OPENER, SOLO):
            attempt = str(action or "")
            opened = attempt == state.code
            return Transition(replace(state, attempt=attempt, opened=opened), terminated=opened)
        raise KeyError(f"unknown agent {agent!r}; vault has {list(self.graph.agents)}")

    def team_reward(self, state: VaultState) -> float:
        return float(state.opened)

    def success(self, state: VaultState) -> bool:
        return state.opened

    def procedural_problems(self, split: str, count: int) -> list[Problem]:
        offset = {"train": 0, "test": TEST_SEED_OFFSET}[split]
        return [make_problem(offset + i) for i in range(count)]

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        return [make_problem(i) for i in range(n)]


READER_ASK = "You and your partner must open a vault together. Your card says: {card}. Tell your partner the code on your card."
OPENER_ASK = ("You and your partner must open a vault together. Type your code first, then your partner's code.\n"
              "Partner: {message}\nYour code: {half}")
READER_EXAMPLE: list[Message] = [
    {"role": "user", "content": READER_ASK.format(card="floor 7, code 31, room 24")},
    {"role": "assistant", "content": "My code is 31."},
]
OPENER_EXAMPLE: list[Message] = [
    {"role": "user", "content": OPENER_ASK.format(message="My code is 52.", half=98)},
    {"role": "assistant", "content": "CODE: 9852"},
]


class Reader(Agent):
    known_options = ()

    def observe(self, state: VaultState, turn: int) -> list[Message]:
        content = READER_ASK.format(card=state.card)
        if state.attempt is not None and not state.opened:
            content += f" Your partner typed CODE: {state.attempt or '(nothing)'} and the vault stayed shut."
        return READER_EXAMPLE + [{"role": "user", "content": content}]

    def parse(self, response: str) -> str:
        return response.strip()

    def local_reward(self, state: VaultState) -> float:
        return float(state.relayed == state.reader_half)


class Opener(Agent):
    known_options = ()

    def observe(self, state: VaultState, turn: int) -> list[Message]:
        message = (state.message or "").strip() or "(nothing)"
        content = OPENER_ASK.format(message=message, half=state.opener_half)
        if state.attempt is not None and not state.opened:
            content += f"\nYour last try, CODE: {state.attempt or '(nothing)'}, did not open the vault."
        return OPENER_EXAMPLE + [{"role": "user", "content": content}]

    def parse(self, response: str) -> str:
        return parse_code(response)


SOLO_ASK = ("You must open a vault. Your card says: {card}. Your own code is {half}. Type your own code first, then the "
            "code on your card.")
SOLO_EXAMPLE: list[Message] = [
    {"role": "user", "content": SOLO_ASK.format(card="floor 7, code 31, room 24", half=98)},
    {"role": "assistant", "content": "CODE: 9831"},
]


class Solo(Agent):
    """Both roles in one agent: it reads the card and combines the halves."""

    known_options = ()

    def observe(self, state: VaultState, turn: int) -> list[Message]:
        content = SOLO_ASK.format(card=state.card, half=state.opener_half)
        if state.attempt is not None and not state.opened:
            content += f" Your last try, CODE: {state.attempt or '(nothing)'}, did not open the vault."
        return SOLO_EXAMPLE + [{"role": "user", "content": content}]

    def parse(self, response: str) -> str:
        return parse_code(response)
