"""One writer per run directory.

``pettingllms train`` holds an exclusive lock on ``<run_dir>/.lock`` (``fcntl.flock``) from the moment it has chosen
the directory, before it writes anything there, until it closes. A second ``train`` resuming the same run is refused
at start, naming the PID that holds it: two writers would append the same steps to summary.log, mix two lineages
and replace each other's checkpoints. The kernel drops the lock of a process that died (kill -9 included), so a
stale lock never blocks a resume; the dead holder's PID, still in the file, is named in a warning when taken over.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from pettingllms.core import ConfigError
from pettingllms.core.processes import process_alive

LOCK_FILE = ".lock"
log = logging.getLogger("pettingllms.trainer")


class RunLock:
    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, run_dir: str | Path) -> "RunLock":
        path = Path(run_dir) / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise ConfigError(
                f"the run directory {run_dir} is being written by another `pettingllms train` (PID "
                f"{holder or 'unknown'}): two writers would log the same steps twice and replace each other's "
                f"checkpoints. Wait for it to end or stop it, or start a new run (training.resume=none)") from None
        previous = _holder(fd)
        if previous and previous != os.getpid() and not process_alive(previous):
            log.warning("run directory %s: taking over the lock of PID %d, which is no longer running", run_dir,
                        previous)
        try:  # the PID only names the holder in a refusal: a full disk must not stop a resume here
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        return cls(fd, path)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # a run that ended normally leaves no PID behind
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
