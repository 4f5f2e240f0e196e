"""What a run's outcome is called, decided only from what the trusted side observed.

The verdict comes from the runner's own records (why it killed the run, if it did) and the launcher's report
(exit status, rusage): never from anything the program controls, except that a ``MemoryError`` line on
stderr names a non-zero exit "memory" (a heuristic for Python under ``RLIMIT_AS``; see docs/sandbox.md).
"""

from __future__ import annotations

import ast
import re
import signal

from pettingllms.core.errors import InfrastructureError

from .limits import Limits
from .result import KILLED, MEMORY, OK, OUTPUT_LIMIT, TIMEOUT

_MEMORY_ERROR = re.compile(r"^MemoryError\b", re.MULTILINE)


def decide_verdict(*, kill_reason: str | None, exit_event: dict | None, stderr: str,
                   limits: Limits) -> str:
    if kill_reason == OUTPUT_LIMIT:
        return OUTPUT_LIMIT
    if kill_reason == TIMEOUT:
        return TIMEOUT
    if exit_event is None or exit_event.get("exit_code") is None and exit_event.get("signal") is None:
        return KILLED  # the launcher vanished after the start: only the program or an escalation did that
    sig = exit_event.get("signal")
    cpu_soft = limits.rlimits()["CPU"][0]
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and (exit_event.get("cpu_s") or 0) >= cpu_soft):
        return TIMEOUT
    if exit_event.get("exit_code") not in (None, 0) and _MEMORY_ERROR.search(stderr):
        return MEMORY
    if sig is not None:
        return KILLED
    return OK


def parse_event(line: bytes) -> dict:
    """One line of the launcher's report pipe (a dict literal: started, exit, setup-error, ...)."""
    try:
        event = ast.literal_eval(line.decode())
    except (ValueError, SyntaxError, UnicodeDecodeError) as exc:
        raise InfrastructureError(f"sandbox launcher sent an unreadable report line {line[:200]!r}") from exc
    if not isinstance(event, dict):
        raise InfrastructureError(f"sandbox launcher sent a report that is not a dict: {line[:200]!r}")
    return event


class CappedOutput:
    """Keeps the first ``limit`` bytes of a stream and remembers whether more came."""

    def __init__(self, limit: int):
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> bool:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.data += chunk[: max(room, 0)]
            self.truncated = True
        else:
            self.data += chunk
        return self.truncated

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")
