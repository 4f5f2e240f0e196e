"""The test-verdict helper: comparisons happen in our process, infrastructure failures are never a fail."""

from __future__ import annotations

import asyncio

import pytest

from pettingllms.core.errors import ConfigError, InfrastructureError
from pettingllms.sandbox import Sandbox, SandboxPool, normalise_output, run_tests
from pettingllms.sandbox.judge import arun_tests

from sandbox_test_support import TEST_LIMITS, sandbox_for

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
TESTS = [("1 2\n", "3\n"), ("10 -4\n", "6"), ("0 0\n", "0\n\n")]


@pytest.fixture(scope="module")
def sandbox():
    return sandbox_for("strong") if _strong_ok() else sandbox_for("fallback")


def _strong_ok() -> bool:
    try:
        Sandbox("strong").plan()
        return True
    except InfrastructureError:
        return False


def test_normalise_output_ignores_only_trailing_space_and_outer_blank_lines():
    assert normalise_output("1 2  \r\n3\n\n") == normalise_output("\n1 2\n3") == "1 2\n3"
    assert normalise_output("1  2") != normalise_output("1 2")  # inner spacing matters
    assert normalise_output(" 1") != normalise_output("1")  # so does indentation
    assert normalise_output("1\n\n2") != normalise_output("1\n2")


def test_correct_program_passes_every_test(sandbox):
    report = run_tests(ADD, TESTS, TEST_LIMITS, sandbox=sandbox)
    assert report.all_passed and report.passed == report.total == 3 and report.pass_rate == 1.0
    assert [case.reason for case in report.cases] == ["passed"] * 3


def test_wrong_runtime_error_and_timeout_are_distinguished(sandbox):
    source = (
        "a, b = map(int, input().split())\n"
        "if a == 10:\n    raise SystemExit(2)\n"
        "if a == 0:\n    while True:\n        pass\n"
        "print(a - b)\n"
    )
    report = run_tests(source, TESTS, TEST_LIMITS, sandbox=sandbox)
    assert [case.reason for case in report.cases] == ["wrong answer", "runtime error (exit code 2)", "timeout"]
    assert report.passed == 0 and not report.all_passed


def test_correct_output_with_nonzero_exit_is_not_a_pass(sandbox):
    report = run_tests(ADD + "raise SystemExit(1)\n", TESTS[:1], TEST_LIMITS, sandbox=sandbox)
    assert report.cases[0].reason == "runtime error (exit code 1)"


def test_stop_on_first_failure_keeps_the_total(sandbox):
    report = run_tests("print(3)", TESTS, TEST_LIMITS, sandbox=sandbox, stop_on_first_failure=True)
    assert len(report.cases) == 2 and report.total == 3 and report.passed == 1
    assert not report.all_passed


def test_zero_tests_cannot_pass():
    with pytest.raises(ConfigError, match="at least one"):
        run_tests(ADD, [])
    with pytest.raises(ConfigError, match="pair"):
        run_tests(ADD, [("1 2\n",)])


def test_infrastructure_failure_raises_instead_of_failing():
    broken = Sandbox("fallback", TEST_LIMITS, python="/nonexistent/python3")
    with pytest.raises(InfrastructureError):
        run_tests(ADD, TESTS, TEST_LIMITS, sandbox=broken)
    as_verdict = Sandbox("fallback", TEST_LIMITS, python="/nonexistent/python3", infrastructure_errors="verdict")
    with pytest.raises(InfrastructureError):
        run_tests(ADD, TESTS, TEST_LIMITS, sandbox=as_verdict)


def test_judge_through_a_pool_and_from_asyncio(sandbox):
    with SandboxPool(2, sandbox=sandbox) as pool:
        report = run_tests(ADD, TESTS, TEST_LIMITS, pool=pool)
        assert report.all_passed
        cheat = asyncio.run(arun_tests("import sys\nsys.exit(0)\n", TESTS, pool, TEST_LIMITS))
        assert cheat.passed == 0 and {case.reason for case in cheat.cases} == {"wrong answer"}
