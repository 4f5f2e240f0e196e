"""``math``: a reasoning agent and a tool agent solve a math problem together (the paper's math workflow).

Agents (one parallel stage per turn: both act from the same turn-start state):
- **reasoner** thinks step by step and ends with the final answer in ``\\boxed{}``. Its action is the answer
  in the last ``\\boxed{}`` (fallback: an "Answer: X" line, else the last number; option ``strict_boxed``
  turns the fallback off).
- **tool** writes a Python program that prints the answer. Its action is the last ```python fenced block. The
  program runs in the sandbox (``pettingllms.sandbox``: standard library only, ``code_timeout_s`` limit); its
  answer is the last ``\\boxed{}`` in stdout, else stdout's last non-empty line.
Turn 0 shows the problem alone; later turns also show both agents' latest solutions and answers and ask each
agent to select or refine the best one.

Correctness: math-verify equivalence with the dataset's ``answer``, under our own timeout
(``pettingllms.envs.math.verifier``).

Rewards (the executor adds ``alpha * team``):
- team = 1 if the reasoner's latest answer is correct, else 0 (with ``env.agents=[tool]`` the tool's);
- reasoner local = 1 if its answer is correct, else 0;
- tool local = 1 if its program's answer is correct, 0 if it printed a wrong answer, -1 if there was no code,
  the program failed (non-zero exit, timeout, memory, killed) or printed nothing.
A sandbox failure is an ``InfrastructureError``, never a reward.

Termination: after both agents have acted in a turn and their answers are equivalent (math-verify), or at
``max_turns``. The ground truth is never used to stop. With a single agent (L0, ``env.agents=[reasoner]``)
there is nobody to agree with, so episodes run ``max_turns`` turns of self-refinement. Success = the lead
agent's (reasoner's) latest answer is correct.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Sequence

from pettingllms.envs.common.parsing import final_answer, last_boxed, last_python_block
from pettingllms.envs.common.sandbox_runner import SandboxRunner
from pettingllms.envs.math.verifier import MathVerifier, shared_verifier
from pettingllms.core import Agent, AgentGraph, Env, Message, Problem, Transition
from pettingllms.sandbox import Limits

REASONER, TOOL = "reasoner", "tool"
KEEP_RESPONSE_CHARS = 6_000  # of a solution kept in the state for later prompts (the tail, where the answer is)
KEEP_STDOUT_CHARS = 1_000
MAX_ANSWER_CHARS = 300

# Tool statuses. Only "ok" programs produce an answer.
OK, NO_CODE, FAILED, NO_OUTPUT = "ok", "no code", "program failed", "no output"


@dataclass(frozen=True)
class ReasonerAction:
    answer: str | None
    response: str


@dataclass(frozen=True)
class ToolAction:
    code: str | None
    response: str


@dataclass(frozen=True)
class Attempt:
    """One agent's latest move, with what the env made of it."""

    agent: str
    answer: str | None
    correct: bool
    response: str  # the tail of the response (reasoner) or the code (tool)
    status: str = OK
    stdout: str = ""


@dataclass(frozen=True)
class MathState:
    question: str
    gold: str
    reasoner: Attempt | None = None
    tool: Attempt | None = None
    moves: tuple[str, ...] = ()  # agents in the order they acted; counts per agent tell complete turns
    agreed: bool = False


def make_problem(problem_id: str, question: str, answer: str) -> Problem:
    return Problem(problem_id, {"question": question, "answer": answer})


class MathEnv(Env):
    graph = AgentGraph.parallel([REASONER, TOOL])
    agent_classes = {REASONER: "pettingllms.envs.math.env:ReasonerAgent", TOOL: "pettingllms.envs.math.env:ToolAgent"}
    known_options = ()
    domain = "math"
    problem_fields = {"question": str, "answer": str}

    def __init__(self, max_turns: int = 4, code_timeout_s: float = 10.0, sandbox_workers: int = 4,
                 verify_timeout_s: float = 10.0, **options: Any) -> None:
        super().__init__(max_turns=max_turns, **options)
        self.runner = SandboxRunner(sandbox_workers, Limits(wall_timeout_s=code_timeout_s, cpu_time_s=code_timeout_s,
                                                            max_output_bytes=1 << 16))
        self.verify_timeout_s = verify_timeout_s
        self._verifier: MathVerifier | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        state["_verifier"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def verifier(self) -> MathVerifier:
        with self._lock:
            if self._verifier is None:
                shared = shared_verifier()
                self._verifier = shared if shared.timeout_s == self.verify_timeout_s else MathVerifier(
                    timeout_s=self.verify_timeout_s)
            return self._verifier

    # ------------------------------------------------------------------ Env API
    def reset(self, problem: Problem, seed: int) -> MathState:
        del seed  # the problem fixes everything
        data = problem.data
        question, answer = data.get("question"), data.get("answer", data.get("solution"))
        if not question or answer is None or str(answer).strip() == "":
            raise ValueError(f"math problem {problem.problem_id!r} needs 'question' and 'answer'; got {sorted(data)}")
        return MathState(str(question), str(answer).strip())

    def step(self, state: MathState, agent: str, action: Any) -> Transition:
        if agent == REASONER:
            attempt = self._reasoner_attempt(state, action)
            new = replace(state, reasoner=attempt, moves=state.moves + (agent,))
        elif agent == TOOL:
            attempt = self._tool_attempt(state, action)
            new = replace(state, tool=attempt, moves=state.moves + (agent,))
        else:
            raise KeyError(f"unknown agent {agent!r}; math has {list(self.graph.agents)}")
        agreed = self._turn_complete(new) and self._agree(new)
        new = replace(new, agreed=agreed)
        return Transition(new, terminated=agreed, info={"status": attempt.status, "answer": attempt.answer})

    def team_reward(self, state: MathState) -> float:
        return float(self.success(state))

    def success(self, state: MathState) -> bool:
        lead = state.reasoner if REASONER in self.graph.agents else state.tool
        return bool(lead is not None and lead.correct)

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        examples = [("What is 6 times 7?", "42"), ("What is one half plus one quarter? Give a fraction.", "\\frac{3}{4}"),
                    ("How many primes are below 20?", "8")]
        return [make_problem(f"math-example-{i}", *examples[i % len(examples)]) for i in range(n)]

    # ------------------------------------------------------------------ internals
    def _reasoner_attempt(self, state: MathState, action: Any) -> Attempt:
        if not isinstance(action, ReasonerAction):
            action = ReasonerAction(None, "")
        answer = action.answer[:MAX_ANSWER_CHARS] if action.answer else None
        return Attempt(REASONER, answer, self.verifier.equivalent(state.gold, answer),
                       action.response[-KEEP_RESPONSE_CHARS:], OK if answer else NO_OUTPUT)

    def _tool_attempt(self, state: MathState, action: Any) -> Attempt:
        code = action.code if isinstance(action, ToolAction) else None
        if not code:
            return Attempt(TOOL, None, False, "", NO_CODE)
        result = self.runner.run(code)
        stdout = result.stdout[-KEEP_STDOUT_CHARS:]
        code_kept = code[-KEEP_RESPONSE_CHARS:]
        if not result.succeeded:
            detail = f"{FAILED}: {result.verdict}" + (f", exit code {result.exit_code}" if result.exit_code else "")
            return Attempt(TOOL, None, False, code_kept, detail, stdout + result.stderr[-KEEP_STDOUT_CHARS:])
        answer = stdout_answer(result.stdout)
        if answer is None:
            return Attempt(TOOL, None, False, code_kept, NO_OUTPUT, stdout)
        return Attempt(TOOL, answer, self.verifier.equivalent(state.gold, answer), code_kept, OK, stdout)

    def _turn_complete(self, state: MathState) -> bool:
        """Both agents acted equally often: the turn's parallel stage is fully applied."""
        if not {REASONER, TOOL} <= set(self.graph.agents):
            return False
        return state.moves.count(REASONER) == state.moves.count(TOOL) > 0

    def _agree(self, state: MathState) -> bool:
        r, t = state.reasoner, state.tool
        return bool(r and t and r.answer and t.answer and self.verifier.equivalent(r.answer, t.answer))


def stdout_answer(stdout: str) -> str | None:
    """The last ``\\boxed{}`` in the program's output, else its last non-empty line."""
    boxed = last_boxed(stdout)
    if boxed:
        return boxed[:MAX_ANSWER_CHARS]
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    return lines[-1][:MAX_ANSWER_CHARS] if lines else None


# ---------------------------------------------------------------------- agents
REASONER_EXAMPLE = [
    {"role": "user", "content": "Problem: What is 15% of 80?\nThink step by step and put the final answer in \\boxed{}."},
    {"role": "assistant", "content": "15% of 80 is 0.15 * 80 = 12. The answer is \\boxed{12}."},
]
TOOL_EXAMPLE = [
    {"role": "user", "content": "Problem: What is 15% of 80?\nWrite a Python program that prints the answer."},
    {"role": "assistant", "content": "**Code:**\n```python\nprint(0.15 * 80)\n```"},
]


def _history(state: MathState) -> str:
    """Both agents' latest work, for turns after the first."""
    parts = []
    if state.reasoner is not None:
        parts.append(f"Reasoning agent's solution:\n{state.reasoner.response or '(empty)'}\n"
                     f"Reasoning agent's answer: {state.reasoner.answer or '(none)'}")
    if state.tool is not None:
        code = state.tool.response or "(no code)"
        parts.append(f"Tool agent's code:\n```python\n{code}\n```\nIts output: {state.tool.stdout.strip()[:500] or '(none)'}"
                     f" ({state.tool.status})\nTool agent's answer: {state.tool.answer or '(none)'}")
    return "\n\n".join(parts)


class ReasonerAgent(Agent):
    """Options: ``one_shot`` (default True) prepends a worked example; ``strict_boxed`` (default False) reads only
    ``\\boxed{}`` answers."""

    known_options = ("one_shot", "strict_boxed")

    def observe(self, state: MathState, turn: int) -> list[Message]:
        content = f"Problem: {state.question}\n"
        if turn == 0 or (state.reasoner is None and state.tool is None):
            content += "Think step by step and put the final answer in \\boxed{}."
        else:
            content += (f"\nPrevious attempts by you and a teammate:\n\n{_history(state)}\n\n"
                        "Check these solutions, select or refine the best one, think step by step, and put the "
                        "final answer in \\boxed{}.")
        shots = REASONER_EXAMPLE if self.options.get("one_shot", True) else []
        return [*shots, {"role": "user", "content": content}]

    def parse(self, response: str) -> ReasonerAction:
        text = response if isinstance(response, str) else ""
        return ReasonerAction(final_answer(text, fallback=not self.options.get("strict_boxed", False)),
                              text[-KEEP_RESPONSE_CHARS:])

    def local_reward(self, state: MathState) -> float:
        return float(state.reasoner is not None and state.reasoner.correct)


class ToolAgent(Agent):
    """Options: ``one_shot`` (default True) prepends a worked example."""

    known_options = ("one_shot",)

    def observe(self, state: MathState, turn: int) -> list[Message]:
        content = f"Problem: {state.question}\n"
        instruction = ("Write a Python program (standard library only) that computes the answer and prints it. "
                       "Answer with a **Code:** section holding one ```python fenced block.")
        if turn == 0 or (state.reasoner is None and state.tool is None):
            content += instruction
        else:
            content += (f"\nPrevious attempts by you and a teammate:\n\n{_history(state)}\n\n"
                        f"Check these solutions, then select or refine the best one. {instruction}")
        shots = TOOL_EXAMPLE if self.options.get("one_shot", True) else []
        return [*shots, {"role": "user", "content": content}]

    def parse(self, response: str) -> ToolAction:
        text = response if isinstance(response, str) else ""
        return ToolAction(last_python_block(text), text[-KEEP_RESPONSE_CHARS:])

    def local_reward(self, state: MathState) -> float:
        if state.tool is None or state.tool.status != OK:
            return -1.0 if state.tool is not None else 0.0
        return 1.0 if state.tool.correct else 0.0
