"""``arith_duo``: two agents solve easy arithmetic together. The quickstart task.

- Problems: ``a op b`` with small integers, generated from a seed. Train and test draw from disjoint seed
  spaces (``split="train"`` seeds < 10**9 <= ``split="test"`` seeds), so validation never sees training items.
- Agents (sequential each turn): the **solver** answers the question; the **checker** sees the question and the
  solver's answer and gives its own final answer (it may copy or correct it). Later turns show both previous
  answers.
- Parsing: the number in the last ``\\boxed{...}``, else the last number in the text; no number is ``None``.
- Rewards: team = 1 if the checker's latest answer is correct, else 0. Local = 1 if the agent's own latest
  answer is correct, else 0. Each agent's reward is ``alpha * team + local``.
- Termination: when the checker's and the solver's latest answers agree (no ground truth is used to stop), or
  at ``max_turns``. Success = the checker's final answer is correct.
- ``train_pool=N`` (an env option) trains on the first N training problems only, revisited every epoch, so the
  training reward on the same problems can be compared across epochs; 0 (the default) draws a fresh problem
  every time. Validation always uses the disjoint test seeds.
A one-shot worked example in every prompt gives a 135M model a real GRPO signal (measured on
SmolLM2-135M: zero-shot boxed prompts give none).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

from pettingllms.core import Agent, AgentGraph, Env, Message, Problem, Transition

TEST_SEED_OFFSET = 10**9
OPS = ("+", "-", "*")


@dataclass(frozen=True)
class ArithState:
    question: str
    answer: int
    solver: int | None = None
    checker: int | None = None
    history: tuple[tuple[str, int | None], ...] = ()  # (agent, parsed answer) in order


def make_problem(seed: int, max_operand: int = 20) -> Problem:
    rng = random.Random(seed)
    op = rng.choice(OPS)
    a, b = rng.randint(1, max_operand), rng.randint(1, max_operand if op != "*" else 9)
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return Problem(f"arith-{seed}", {"question": f"What is {a} {op} {b}?", "answer": answer})


def parse_number(text: str) -> int | None:
    """The integer in the last \\boxed{...}, else the last integer in the text."""
    if not isinstance(text, str):
        return None
    boxed = re.findall(r"\\boxed\{\s*(-?\d{1,12})\s*\}", text)
    numbers = boxed or re.findall(r"-?\d{1,12}", text)
    return int(numbers[-1]) if numbers else None


ONE_SHOT = [
    {"role": "user", "content": "What is 7 + 5? Put the final answer in \\boxed{}."},
    {"role": "assistant", "content": "7 + 5 = 12. The answer is \\boxed{12}."},
]


class ArithDuoEnv(Env):
    graph = AgentGraph.sequential(["solver", "checker"])
    agent_classes = {"solver": "arith.solver", "checker": "arith.checker"}
    known_options = ()
    domain = "math"
    problem_fields = {"question": str, "answer": int}

    def __init__(self, max_turns: int = 2, max_operand: int = 20, train_pool: int = 0, **options: Any) -> None:
        super().__init__(max_turns=max_turns, **options)
        if train_pool < 0:
            raise ValueError(f"train_pool must be >= 0 (0 = no pool), got {train_pool}")
        self.max_operand = max_operand
        self.train_pool = train_pool

    def reset(self, problem: Problem, seed: int) -> ArithState:
        del seed  # the problem fixes everything
        return ArithState(str(problem.data["question"]), int(problem.data["answer"]))

    def step(self, state: ArithState, agent: str, action: Any) -> Transition:
        value = action if isinstance(action, int) else None
        history = state.history + ((agent, value),)
        if agent == "solver":
            return Transition(replace(state, solver=value, history=history))
        if agent == "checker":
            new = replace(state, checker=value, history=history)
            return Transition(new, terminated=value is not None and value == state.solver)
        raise KeyError(f"unknown agent {agent!r}; arith_duo has {list(self.graph.agents)}")

    def team_reward(self, state: ArithState) -> float:
        return float(state.checker == state.answer)

    def success(self, state: ArithState) -> bool:
        return state.checker == state.answer

    def procedural_problems(self, split: str, count: int) -> list[Problem]:
        offset = {"train": 0, "test": TEST_SEED_OFFSET}[split]
        if split == "train" and self.train_pool:
            count = min(count, self.train_pool)
        return [make_problem(offset + i, self.max_operand) for i in range(count)]

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        return [make_problem(i) for i in range(n)]


class Solver(Agent):
    known_options = ()

    def observe(self, state: ArithState, turn: int) -> list[Message]:
        content = f"{state.question} Put the final answer in \\boxed{{}}."
        if turn > 0:
            content += f" Earlier answers: solver {state.solver}, checker {state.checker}. Check them and answer again."
        return ONE_SHOT + [{"role": "user", "content": content}]

    def parse(self, response: str) -> int | None:
        return parse_number(response)

    def local_reward(self, state: ArithState) -> float:
        return float(state.solver == state.answer)


class Checker(Agent):
    known_options = ()

    def observe(self, state: ArithState, turn: int) -> list[Message]:
        content = (
            f"{state.question} A teammate answered {state.solver}. Check it and give the correct final answer "
            "in \\boxed{}."
        )
        return ONE_SHOT + [{"role": "user", "content": content}]

    def parse(self, response: str) -> int | None:
        return parse_number(response)

    def local_reward(self, state: ArithState) -> float:
        return float(state.checker == state.answer)
