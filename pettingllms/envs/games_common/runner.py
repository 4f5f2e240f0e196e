"""Runs a tool agent's program in the sandbox, through one bounded pool per process.

Env steps run in the rollout executor's worker threads (K branches x many problems at once), so the pool is
what bounds the number of programs alive at a time. A sandbox failure raises ``InfrastructureError``; it is
never turned into a reward.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

ProgramRunner = Callable[[str, str], "ProgramOutput"]
"""(source, stdin) -> ProgramOutput. Tests inject fakes; production uses ``SandboxRunner``."""


@dataclass(frozen=True)
class ProgramOutput:
    stdout: str
    verdict: str  # the sandbox verdict: ok, timeout, memory, output-limit, killed


_pools: dict[int, object] = {}
_pools_lock = threading.Lock()


def _shared_pool(workers: int):
    from pettingllms.sandbox import SandboxPool  # imported lazily: envs import nothing heavy at import time

    with _pools_lock:
        if workers not in _pools:
            _pools[workers] = SandboxPool(max_workers=workers, name=f"games-tool-{workers}")
        return _pools[workers]


class SandboxRunner:
    """Short limits: a solver for these small boards needs well under a second."""

    def __init__(self, timeout_s: float = 5.0, workers: int = 4, memory_mib: int = 512, max_output_kib: int = 64):
        self.timeout_s = float(timeout_s)
        self.workers = int(workers)
        self.memory_mib = int(memory_mib)
        self.max_output_kib = int(max_output_kib)

    def limits(self):
        from pettingllms.sandbox import Limits

        return Limits(
            wall_timeout_s=self.timeout_s,
            cpu_time_s=self.timeout_s,
            address_space_bytes=self.memory_mib << 20,
            max_processes=8,
            max_output_bytes=self.max_output_kib << 10,
        )

    def __call__(self, source: str, stdin: str) -> ProgramOutput:
        result = _shared_pool(self.workers).run(source, stdin=stdin, limits=self.limits())
        return ProgramOutput(result.stdout if isinstance(result.stdout, str) else str(result.stdout), result.verdict)


class EchoRunner:
    """A test double that runs nothing: the "program" prints its own source. Tests pick the output through the
    code, with no sandbox and no subprocess (``GameEnv(runner=EchoRunner())``)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, source: str, stdin: str) -> ProgramOutput:
        del stdin
        self.calls += 1
        return ProgramOutput(source, "ok")
