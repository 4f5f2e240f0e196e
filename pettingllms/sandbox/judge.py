"""Score a program against (stdin, expected stdout) tests. The comparison happens here, in the runner's
process: nothing the program prints or how it exits (``sys.exit(0)`` before any work, a forged "PASSED"
line) can turn into a pass. A sandbox failure raises InfrastructureError; it is never a failed test.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Sequence

from pettingllms.core.errors import ConfigError, InfrastructureError

from .limits import Limits
from .result import INFRASTRUCTURE_ERROR, OK, RunResult
from .runner import Sandbox, default_sandbox

KEEP_CHARS = 2000  # of stdout/stderr per test in the report: enough to debug, bounded in memory


def normalise_output(text: str) -> str:
    """Trailing spaces on each line and blank lines at both ends do not matter; anything else does."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines)


@dataclass(frozen=True)
class TestCaseResult:
    index: int
    passed: bool
    reason: str  # "passed", "wrong answer", "runtime error (exit code 1)", or the sandbox verdict
    verdict: str
    exit_code: int | None
    wall_time_s: float
    stdout_head: str
    stderr_tail: str


@dataclass(frozen=True)
class TestReport:
    cases: tuple[TestCaseResult, ...]
    total: int  # tests asked for; more than len(cases) when stop_on_first_failure cut the run short

    @property
    def passed(self) -> int:
        return sum(case.passed for case in self.cases)

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total


def judge_case(index: int, result: RunResult, expected_stdout: str) -> TestCaseResult:
    if result.verdict == INFRASTRUCTURE_ERROR:
        raise InfrastructureError(result.infrastructure_message or "sandbox infrastructure error")
    if result.verdict != OK:
        reason = result.verdict
    elif result.exit_code != 0:
        reason = f"runtime error (exit code {result.exit_code})"
    elif result.stdout_truncated or normalise_output(result.stdout) != normalise_output(expected_stdout):
        reason = "wrong answer"
    else:
        reason = "passed"
    return TestCaseResult(index=index, passed=reason == "passed", reason=reason, verdict=result.verdict,
                          exit_code=result.exit_code, wall_time_s=result.wall_time_s,
                          stdout_head=result.stdout[:KEEP_CHARS], stderr_tail=result.stderr[-KEEP_CHARS:])


def _check_tests(tests: Sequence[tuple[str, str]]) -> None:
    if not tests:
        raise ConfigError("run_tests needs at least one (stdin, expected_stdout) test; zero tests cannot pass")
    for i, test in enumerate(tests):
        if len(test) != 2 or not all(isinstance(part, str) for part in test):
            raise ConfigError(f"test {i} must be a (stdin, expected_stdout) pair of str, got {test!r}")


def run_tests(source: str, tests: Sequence[tuple[str, str]], limits: Limits | None = None, *,
              sandbox: Sandbox | None = None, pool=None, stop_on_first_failure: bool = False) -> TestReport:
    """Run ``source`` once per test; pass means verdict ok, exit code 0 and the expected stdout.

    With ``pool`` (a SandboxPool) the tests run concurrently; otherwise one after another in ``sandbox``
    (default: the process-wide auto-layer sandbox)."""
    _check_tests(tests)
    if pool is not None:
        futures = [pool.submit(source, stdin=stdin, limits=limits) for stdin, _ in tests]
        pairs = enumerate(zip(futures, tests, strict=True))
        cases = tuple(judge_case(i, future.result(), expected) for i, (future, (_, expected)) in pairs)
        return TestReport(cases=cases, total=len(tests))
    sandbox = sandbox or default_sandbox()
    cases = []
    for i, (stdin, expected) in enumerate(tests):
        case = judge_case(i, sandbox.run(source, stdin=stdin, limits=limits), expected)
        cases.append(case)
        if stop_on_first_failure and not case.passed:
            break
    return TestReport(cases=tuple(cases), total=len(tests))


async def arun_tests(source: str, tests: Sequence[tuple[str, str]], pool, limits: Limits | None = None) -> TestReport:
    """run_tests for asyncio callers: the tests run concurrently in ``pool`` without blocking the loop."""
    _check_tests(tests)
    results = await asyncio.gather(*(pool.arun(source, stdin=stdin, limits=limits) for stdin, _ in tests))
    cases = tuple(judge_case(i, r, expected) for i, (r, (_, expected)) in enumerate(zip(results, tests, strict=True)))
    return TestReport(cases=cases, total=len(tests))
