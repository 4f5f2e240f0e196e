"""``code``: a coder and a tester solve a programming problem together (the paper's code workflow).

Agents (one parallel stage per turn; stage order coder, tester):
- **coder** writes a stdin/stdout Python program; its action is the last ```python fenced block.
- **tester** writes up to ``max_tests`` test cases, each a ``**Test Input:**`` fenced block followed by a
  ``**Test Output:**`` fenced block.
Later turns show the coder's latest program and every mismatch between it and the tester's valid tests, and
ask each agent to refine its work.

Judging (every program, the dataset's golden solution included, runs in ``pettingllms.sandbox`` through a
bounded ``SandboxPool``, golden solutions in a pool and uid range of their own; outputs are compared in this
process, trailing whitespace ignored):
- the coder's program runs on the ground-truth tests (``test_input``/``test_output``): ``pass_rate``;
- each generated test is **valid** when the golden solution (``solution`` column) run on its input prints its
  expected output. Without a golden solution validity cannot be known: no test is valid for rewards, and all
  parsed tests count for termination.

Rewards (the executor adds ``alpha * team``):
- team = the ground-truth pass rate of the coder's latest program (0 without one);
- coder local = the ground-truth pass rate of its program (0 without code);
- tester local = validity + catch, where validity = (tests the golden solution passes) / (tests written), 0
  when none parse, and catch = 1 when at least one valid test fails the coder's program in the state (wrong
  output, crash or timeout), else 0. In the parallel stage the tester's K candidates are scored against the
  coder's program from the previous turn, so at turn 0 (no program yet) only validity counts. Each term is in
  [0, 1]; the tester's reward therefore rises with the share of correct tests and with finding real bugs.
A sandbox failure raises ``InfrastructureError``; it never becomes a reward.

Termination: once both agents acted in a turn, when the coder's program passes every valid generated test
(at least one), or at ``max_turns``. Success = the program passes every ground-truth test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from pettingllms.envs.common.parsing import last_python_block, parse_test_pairs
from pettingllms.envs.common.sandbox_runner import SandboxRunner
from pettingllms.core import Agent, AgentGraph, Env, Message, Problem, Transition
from pettingllms.sandbox import Limits, normalise_output

CODER, TESTER = "coder", "tester"
MAX_TEST_CHARS = 10_000  # a generated test longer than this is dropped (it would not fit a prompt anyway)
SHOW_CHARS = 300  # of each input/expected/actual shown in later prompts
MAX_CODE_CHARS = 50_000


@dataclass(frozen=True)
class CodeAction:
    code: str | None


@dataclass(frozen=True)
class WrittenTests:
    tests: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Mismatch:
    """A valid generated test that the coder's program fails."""

    stdin: str
    expected: str
    actual: str


@dataclass(frozen=True)
class CodeAttempt:
    code: str | None
    passed: int = 0
    total: int = 0

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


@dataclass(frozen=True)
class GeneratedTests:
    tests: tuple[tuple[str, str], ...]
    valid: tuple[bool, ...]  # per test: the golden solution passes it
    golden_known: bool

    @property
    def validity(self) -> float:
        return sum(self.valid) / len(self.tests) if self.tests and self.golden_known else 0.0

    @property
    def checking_tests(self) -> tuple[tuple[str, str], ...]:
        """Tests the program is checked against: the valid ones, or all of them without a golden solution."""
        if not self.golden_known:
            return self.tests
        return tuple(t for t, ok in zip(self.tests, self.valid) if ok)


@dataclass(frozen=True)
class CodeState:
    question: str
    gt_tests: tuple[tuple[str, str], ...]
    golden: str | None
    code: CodeAttempt | None = None
    tests: GeneratedTests | None = None
    mismatches: tuple[Mismatch, ...] = ()  # the program vs the checking tests
    checked: int = 0  # checking tests the program was run on
    moves: tuple[str, ...] = ()
    aligned: bool = False


class CodeEnv(Env):
    graph = AgentGraph.parallel([CODER, TESTER])
    agent_classes = {CODER: "pettingllms.envs.code.env:CoderAgent", TESTER: "pettingllms.envs.code.env:TesterAgent"}
    known_options = ()
    domain = "code"
    problem_fields = {"question": str, "test_input": list[str], "test_output": list[str]}

    def __init__(self, max_turns: int = 5, timeout_s: float = 5.0, sandbox_workers: int = 4,
                 max_gt_tests: int = 0, **options: Any) -> None:
        super().__init__(max_turns=max_turns, **options)
        self.max_gt_tests = max_gt_tests  # 0: all ground-truth tests
        limits = Limits(wall_timeout_s=timeout_s, cpu_time_s=timeout_s, max_output_bytes=1 << 20)
        self.runner = SandboxRunner(sandbox_workers, limits, name="code-programs")
        # Golden solutions run apart from the models' programs (own pool, own uids): a model's program must never
        # find a reference solution of a concurrent problem.
        self.reference_runner = SandboxRunner(sandbox_workers, limits, name="code-reference", reference=True)

    # ------------------------------------------------------------------ Env API
    def reset(self, problem: Problem, seed: int) -> CodeState:
        del seed
        data = problem.data
        inputs, outputs = list(data.get("test_input") or []), list(data.get("test_output") or [])
        if not data.get("question") or not inputs or len(inputs) != len(outputs):
            raise ValueError(f"code problem {problem.problem_id!r} needs 'question' and equally long non-empty "
                             f"'test_input'/'test_output' lists; got keys {sorted(data)}")
        tests = tuple((str(i), str(o)) for i, o in zip(inputs, outputs))
        if self.max_gt_tests > 0:
            tests = tests[: self.max_gt_tests]
        golden = data.get("solution")
        return CodeState(str(data["question"]), tests, str(golden) if golden else None)

    def step(self, state: CodeState, agent: str, action: Any) -> Transition:
        if agent == CODER:
            new = replace(state, code=self._judge_code(state, action), moves=state.moves + (agent,))
        elif agent == TESTER:
            new = replace(state, tests=self._judge_tests(state, action), moves=state.moves + (agent,))
        else:
            raise KeyError(f"unknown agent {agent!r}; code has {list(self.graph.agents)}")
        new = self._cross_check(new)
        aligned = self._turn_complete(new) and new.checked > 0 and not new.mismatches
        new = replace(new, aligned=aligned)
        return Transition(new, terminated=aligned, info={"pass_rate": new.code.pass_rate if new.code else 0.0})

    def team_reward(self, state: CodeState) -> float:
        return state.code.pass_rate if state.code else 0.0

    def success(self, state: CodeState) -> bool:
        return bool(state.code and state.code.total and state.code.passed == state.code.total)

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        examples = [
            ("Read two integers a and b on one line and print a + b.", "a, b = map(int, input().split())\nprint(a + b)\n",
             ["1 2\n", "10 -3\n"], ["3\n", "7\n"]),
            ("Read a line and print it reversed.", "print(input()[::-1])\n", ["abc\n", "racecar\n"], ["cba\n", "racecar\n"]),
        ]
        out = []
        for i in range(n):
            q, sol, ins, outs = examples[i % len(examples)]
            out.append(Problem(f"code-example-{i}", {"question": q, "solution": sol, "test_input": ins,
                                                     "test_output": outs}))
        return out

    # ------------------------------------------------------------------ internals
    def _judge_code(self, state: CodeState, action: Any) -> CodeAttempt:
        code = action.code if isinstance(action, CodeAction) else None
        if not code or len(code) > MAX_CODE_CHARS:
            return CodeAttempt(None, 0, len(state.gt_tests))
        report = self.runner.judge(code, state.gt_tests)
        return CodeAttempt(code, report.passed, report.total)

    def _judge_tests(self, state: CodeState, action: Any) -> GeneratedTests:
        tests = action.tests if isinstance(action, WrittenTests) else ()
        tests = tuple(t for t in tests if len(t[0]) + len(t[1]) <= MAX_TEST_CHARS)
        if not tests or state.golden is None:
            return GeneratedTests(tests, (False,) * len(tests), state.golden is not None)
        results = self.reference_runner.run_many(state.golden, [stdin for stdin, _ in tests])
        valid = tuple(r.succeeded and normalise_output(r.stdout) == normalise_output(expected)
                      for r, (_, expected) in zip(results, tests))
        return GeneratedTests(tests, valid, True)

    def _cross_check(self, state: CodeState) -> CodeState:
        """Run the coder's latest program on the tester's checking tests; keep the mismatches."""
        if state.code is None or state.code.code is None or state.tests is None:
            return replace(state, mismatches=(), checked=0)
        tests = state.tests.checking_tests
        if not tests:
            return replace(state, mismatches=(), checked=0)
        report = self.runner.judge(state.code.code, tests)
        mismatches = tuple(Mismatch(stdin[:SHOW_CHARS], expected[:SHOW_CHARS],
                                    (case.stdout_head if case.reason == "wrong answer" else case.reason)[:SHOW_CHARS])
                           for case, (stdin, expected) in zip(report.cases, tests) if not case.passed)
        return replace(state, mismatches=mismatches, checked=len(tests))

    def _turn_complete(self, state: CodeState) -> bool:
        if not {CODER, TESTER} <= set(self.graph.agents):
            return False
        return state.moves.count(CODER) == state.moves.count(TESTER) > 0


# ---------------------------------------------------------------------- agents
def _mismatch_report(state: CodeState) -> str:
    if not state.mismatches:
        return "The program passes every valid test the tester wrote." if state.checked else "No valid tests yet."
    lines = [f"Input:\n{m.stdin}\nExpected output:\n{m.expected}\nProgram's output:\n{m.actual}" for m in state.mismatches]
    return "Mismatches between the program and the tests:\n\n" + "\n\n".join(lines)


def _previous_work(state: CodeState) -> str:
    code = state.code.code if state.code and state.code.code else "(no program yet)"
    parts = [f"Current program:\n```python\n{code}\n```"]
    if state.tests is not None and state.tests.tests:
        shown = "\n\n".join(f"**Test Input:**\n```\n{i[:SHOW_CHARS]}```\n**Test Output:**\n```\n{o[:SHOW_CHARS]}\n```"
                            for i, o in state.tests.tests)
        parts.append(f"Current tests:\n{shown}")
    parts.append(_mismatch_report(state))
    return "\n\n".join(parts)


class CoderAgent(Agent):
    known_options = ()

    def observe(self, state: CodeState, turn: int) -> list[Message]:
        instruction = ("Write a complete Python 3 program that reads the input from standard input (input() or "
                       "sys.stdin) and prints the answer to standard output. Answer with **Code:** followed by one "
                       "```python fenced block.")
        content = f"Problem:\n{state.question}\n\n"
        if turn > 0 and (state.code is not None or state.tests is not None):
            content += f"{_previous_work(state)}\n\nFix the program if the tests show a bug, or keep it. "
        return [{"role": "user", "content": content + instruction}]

    def parse(self, response: str) -> CodeAction:
        return CodeAction(last_python_block(response))

    def local_reward(self, state: CodeState) -> float:
        return state.code.pass_rate if state.code else 0.0


class TesterAgent(Agent):
    """Option ``max_tests`` (default 3): test cases read from one response."""

    known_options = ("max_tests",)

    __test__ = False  # not a pytest class, despite the name

    @property
    def max_tests(self) -> int:
        return int(self.options.get("max_tests", 3))

    def observe(self, state: CodeState, turn: int) -> list[Message]:
        instruction = (f"Write up to {self.max_tests} test cases that a correct program must pass. Work out each "
                       "expected output carefully by reasoning about the problem. Format each as:\n"
                       "**Test Input:**\n```\n<stdin>\n```\n**Test Output:**\n```\n<expected stdout>\n```")
        content = f"Problem:\n{state.question}\n\n"
        if turn > 0 and (state.code is not None or state.tests is not None):
            content += (f"{_previous_work(state)}\n\nIf a mismatch comes from a wrong test, fix the test; keep tests "
                        "that expose real bugs. ")
        return [{"role": "user", "content": content + instruction}]

    def parse(self, response: str) -> WrittenTests:
        return WrittenTests(parse_test_pairs(response, self.max_tests))

    def local_reward(self, state: CodeState) -> float:
        if state.tests is None:
            return 0.0
        catch = 1.0 if state.mismatches and state.tests.golden_known else 0.0
        return state.tests.validity + catch
