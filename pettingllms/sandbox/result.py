"""What one sandboxed run produced."""

from __future__ import annotations

from dataclasses import dataclass

OK = "ok"
TIMEOUT = "timeout"
MEMORY = "memory"
OUTPUT_LIMIT = "output-limit"
KILLED = "killed"
INFRASTRUCTURE_ERROR = "infrastructure-error"
VERDICTS = (OK, TIMEOUT, MEMORY, OUTPUT_LIMIT, KILLED, INFRASTRUCTURE_ERROR)


@dataclass(frozen=True)
class RunResult:
    """Outcome of one program run.

    ``verdict`` is about the sandbox: "ok" means the program ended by itself within every limit -- with any
    exit code; whether its answer is right is the judge's business. ``exit_code`` is None when the program
    did not exit by itself (killed by a signal or by the sandbox); ``signal`` names the signal then.
    ``network_isolated``: the program had an empty network namespace. ``shared_dirs_private``: its /tmp,
    /var/tmp, /dev/shm (and SysV/POSIX IPC) were its own and went with it -- no host unix socket or other run's
    file there was reachable, and nothing it left there outlived it. ``disk_bounded``: everything it could write
    (its work dir and those shared dirs) lay on tmpfs of ``max_disk_bytes`` each, so its writes were bounded in
    total, not only per file.
    """

    verdict: str
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    wall_time_s: float
    layer: str
    network_isolated: bool
    shared_dirs_private: bool = False
    disk_bounded: bool = False
    signal: int | None = None
    cpu_time_s: float | None = None
    max_rss_kib: int | None = None
    infrastructure_message: str = ""

    @property
    def succeeded(self) -> bool:
        """Ended normally with exit code 0 and complete output."""
        return self.verdict == OK and self.exit_code == 0 and not self.stdout_truncated
