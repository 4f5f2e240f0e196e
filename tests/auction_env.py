"""A small three-agent env for the tests of the agent graph and the env and agent options (not registered: tests
name it ``auction_env:AuctionEnv``). Two bidders bid, an auctioneer closes the auction.

Every prompt says which agents have acted so far (``acted so far: bidder_a, bidder_b``), so a test can
read the stage order from the prompts a run records."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from pettingllms.core import Agent, AgentGraph, Env, Problem, Transition

BIDDERS = ("bidder_a", "bidder_b")
AUCTIONEER = "auctioneer"


@dataclass(frozen=True)
class AuctionState:
    lot: int
    acted: tuple[str, ...] = ()  # agents that have acted, in order
    closed: bool = False


def prompt(agent: str, state: AuctionState) -> list[dict]:
    acted = ", ".join(state.acted) or "nobody"
    return [{"role": "user", "content": f"You are {agent}. Lot {state.lot}. Acted so far: {acted}. Reply briefly."}]


class Bidder(Agent):
    def __init__(self, name: str, style: str = "plain") -> None:  # named options only: agents.<a>.options is checked
        if style not in ("plain", "bold"):
            raise ValueError(f"style must be plain or bold, got {style!r}")
        super().__init__(name, style=style)

    def observe(self, state, turn):
        return prompt(self.name, state)

    def parse(self, response):
        return str(response)[:50]


class Auctioneer(Agent):
    def observe(self, state, turn):
        return prompt(self.name, state)

    def parse(self, response):
        return str(response)[:50]


class AuctionRules:
    """The auction itself; the env classes below differ only in how they take their options."""

    graph = AgentGraph.sequential([*BIDDERS, AUCTIONEER])
    agent_classes = {"bidder_a": "auction_env:Bidder", "bidder_b": "auction_env:Bidder",
                     AUCTIONEER: "auction_env:Auctioneer"}

    def reset(self, problem, seed):
        return AuctionState(lot=int(problem.data.get("lot", random.Random(seed).randint(1, 99))))

    def step(self, state, agent, action):
        new = replace(state, acted=(*state.acted, agent), closed=state.closed or agent == AUCTIONEER)
        return Transition(new, terminated=new.closed)

    def team_reward(self, state):
        return float(state.closed)

    def success(self, state):
        return state.closed

    def procedural_problems(self, split, count):
        offset = 0 if split == "train" else 1_000_000
        return [Problem(f"lot-{split}-{i}", {"lot": offset + i}) for i in range(count)]

    @classmethod
    def example_problems(cls, n=2):
        return [Problem(f"lot-{i}", {"lot": i}) for i in range(n)]


class AuctionEnv(AuctionRules, Env):
    def __init__(self, max_turns: int = 1, layout: str = "open", reserve: int = 0) -> None:  # no **kwargs
        super().__init__(max_turns=max_turns)
        if reserve < 0:
            raise ValueError(f"reserve must be >= 0, got {reserve}")
        self.layout, self.reserve = layout, reserve


class OpenAuctionEnv(AuctionRules, Env):
    """As in docs/custom_env.md: no ``__init__`` (``Env``'s takes ``**options``), the option read from
    ``self.options`` and declared."""

    known_options = ("layout",)

    @property
    def layout(self) -> str:
        return self.options.get("layout", "open")


class UndeclaredAuctionEnv(OpenAuctionEnv):
    """The same env without the declaration: its options cannot be checked."""

    known_options = None


class UnstaffedAuctionEnv(AuctionEnv):
    """Its graph has an auctioneer, its agent classes none."""

    agent_classes = {bidder: "auction_env:Bidder" for bidder in BIDDERS}


class Appraiser(Agent):
    """An agent class whose constructor calls the agent's name ``role`` and has a required option."""

    def __init__(self, role: str, currency: str) -> None:
        super().__init__(role, currency=currency)

    def observe(self, state, turn):
        return prompt(self.name, state)

    def parse(self, response):
        return str(response)[:50]
