"""How a game env runs its tool agent's program: a ``ProgramRunner`` (source, stdin) -> output.

Production uses ``tool_runner``: the envs' ``SandboxRunner`` (``pettingllms.envs.common.sandbox_runner``) with
the games' short limits and one pool per process, shared by every game env (env steps run in the rollout
executor's worker threads, K branches x many problems at once, so the pool is what bounds the number of
programs alive at a time). A sandbox failure raises ``InfrastructureError``; it is never turned into a reward.
Tests inject ``EchoRunner``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pettingllms.envs.common.sandbox_runner import SandboxRunner
from pettingllms.sandbox import Limits, RunResult


@dataclass(frozen=True)
class ProgramOutput:
    stdout: str
    verdict: str  # the sandbox verdict: ok, timeout, memory, output-limit, killed


ProgramRunner = Callable[[str, str], "ProgramOutput | RunResult"]
"""(source, stdin) -> an output with ``stdout`` and ``verdict``. Tests inject fakes; production uses ``tool_runner``."""


def tool_runner(timeout_s: float = 5.0, workers: int = 4, memory_mib: int = 512,
                max_output_kib: int = 64) -> SandboxRunner:
    """Short limits: a solver for these small boards needs well under a second. No result cache: every step
    runs its program."""
    timeout_s, workers = float(timeout_s), int(workers)
    limits = Limits(
        wall_timeout_s=timeout_s,
        cpu_time_s=timeout_s,
        address_space_bytes=int(memory_mib) << 20,
        max_processes=8,
        max_output_bytes=int(max_output_kib) << 10,
    )
    return SandboxRunner(workers, limits, cache_size=0, shared_pool=True, name=f"games-tool-{workers}")


class EchoRunner:
    """A test double that runs nothing: the "program" prints its own source. Tests pick the output through the
    code, with no sandbox and no subprocess (``GameEnv(runner=EchoRunner())``)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, source: str, stdin: str) -> ProgramOutput:
        del stdin
        self.calls += 1
        return ProgramOutput(source, "ok")
