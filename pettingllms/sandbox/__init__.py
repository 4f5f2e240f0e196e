"""Sandbox for untrusted, model-generated programs. Standard library only (no torch/ray imports here).

    from pettingllms.sandbox import run_program, Limits
    result = run_program("print(input()[::-1])", stdin="abc\n", limits=Limits(wall_timeout_s=2))
    result.verdict, result.exit_code, result.stdout   # "ok", 0, "cba\n"

See docs/sandbox.md for the layers and exactly what each one covers.
"""

from .judge import TestCaseResult, TestReport, normalise_output, run_tests
from .layers import FALLBACK, STRONG
from .limits import Limits
from .pool import SandboxPool
from .result import INFRASTRUCTURE_ERROR, KILLED, MEMORY, OK, OUTPUT_LIMIT, TIMEOUT, VERDICTS, RunResult
from .runner import Sandbox, default_sandbox, reference_sandbox, run_program

__all__ = [
    "FALLBACK", "INFRASTRUCTURE_ERROR", "KILLED", "MEMORY", "OK", "OUTPUT_LIMIT", "STRONG", "TIMEOUT", "VERDICTS",
    "Limits", "RunResult", "Sandbox", "SandboxPool", "TestCaseResult", "TestReport", "default_sandbox",
    "normalise_output", "reference_sandbox", "run_program", "run_tests",
]
