"""Resource limits for one sandboxed run, and the result of that run."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from pettingllms.core.errors import ConfigError

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Limits of one run. Defaults suit competitive-programming code (stdin/stdout, stdlib only).

    ``max_processes`` counts threads too (RLIMIT_NPROC counts tasks) and includes the program itself.
    ``max_disk_bytes`` caps each private tmpfs (work dir and /tmp; the fallback as root also /var/tmp, /dev/shm,
    /run/lock); where the fallback gets no mount namespace, only ``max_file_size_bytes`` per file holds
    (``RunResult.disk_bounded`` says which; docs/sandbox.md).
    """

    wall_timeout_s: float = 10.0
    cpu_time_s: float = 10.0
    address_space_bytes: int = 1 * GIB
    max_processes: int = 16
    max_file_size_bytes: int = 16 * MIB
    max_open_files: int = 64
    max_output_bytes: int = 4 * MIB
    max_disk_bytes: int = 64 * MIB

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"Limits.{field.name} must be a positive number, got {value!r}")
        if self.max_open_files < 8:
            raise ConfigError(f"Limits.max_open_files={self.max_open_files} is too low for Python to start (>= 8)")
        if self.address_space_bytes < 64 * MIB:
            raise ConfigError(
                f"Limits.address_space_bytes={self.address_space_bytes} is too low for Python to start (>= 64 MiB)"
            )

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """The (soft, hard) rlimits the launcher applies to the program just before exec."""
        cpu = max(1, math.ceil(self.cpu_time_s))
        return {
            "CORE": (0, 0),
            # SIGXCPU at the soft limit; SIGKILL one second later if the program ignores SIGXCPU.
            "CPU": (cpu, cpu + 1),
            "AS": (int(self.address_space_bytes), int(self.address_space_bytes)),
            "NPROC": (int(self.max_processes), int(self.max_processes)),
            "FSIZE": (int(self.max_file_size_bytes), int(self.max_file_size_bytes)),
            "NOFILE": (int(self.max_open_files), int(self.max_open_files)),
        }
