"""A private, unprivileged uid for each concurrent run (only when the runner is root).

Why: RLIMIT_NPROC is counted per uid and does nothing for root, so as root the program must run as some
other uid -- and a uid of its own, or two concurrent runs would share one process budget, and the
tree kill by ``kill(-1)`` as that uid would hit the other run. A uid also makes everything outside the
work dir that is not world-readable unreadable, and lets the fallback layer find every file the run left
in world-writable directories.

Slots are claimed with ``flock`` on one lock file per slot, so concurrent runners in different processes
(Ray workers) never share a uid. The lock fd is inherited by the launcher, which holds the slot until the
program's whole tree is dead, even when the runner itself crashes. The lock dir is root's own (0700, checked), so
no other user can create, hold or delete a slot's lock; every runner of the machine -- two trainings, a training
and a test suite -- claims from the same locks. A slot whose uid still has processes (survivors of a run whose
runner died) is skipped: handing it out would put a new run beside programs that can signal it.

Model-written programs and trusted reference programs (a dataset's golden solutions) claim from two disjoint
ranges, so a model's program never runs as a uid that a reference program used.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import stat
import threading
from dataclasses import dataclass
from typing import Iterator

from pettingllms.core.errors import InfrastructureError

# Far above any uid a distribution, LDAP or /etc/subuid range normally hands out; below 2**31.
DEFAULT_UID_BASE = 1_879_048_192
DEFAULT_SLOTS = 4096
REFERENCE_UID_BASE = DEFAULT_UID_BASE + DEFAULT_SLOTS  # the reference programs' range, right after the models'
DEFAULT_LOCK_DIR = "/run/pettingllms-sandbox" if os.path.isdir("/run") else "/tmp/pettingllms-sandbox"

_dir_lock = threading.Lock()


@dataclass
class UidSlot:
    uid: int
    gid: int
    lock_fd: int
    quarantined: bool = False  # processes of the uid survived: keep the lock until this process exits

    def release(self) -> None:
        if self.lock_fd >= 0 and not self.quarantined:
            os.close(self.lock_fd)  # closing our copy; the launcher's copy dies with the launcher
            self.lock_fd = -1


def ensure_private_dir(path: str, mode: int = 0o700, what: str = "sandbox uid lock dir") -> None:
    """Create ``path`` with ``mode`` unless it exists; either way it must be ours and writable by us only (anyone
    else who could write in it could replace what we keep there)."""
    with _dir_lock:
        try:
            os.makedirs(path, mode)
            os.chmod(path, mode)  # mkdir's mode is masked by the umask
        except FileExistsError:
            pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise InfrastructureError(
            f"{what} {path} must be a directory owned by uid {os.geteuid()} and not group/world "
            "writable; remove it or pick another one"
        )


def proc_files(name: str) -> Iterator[tuple[int, bytes]]:
    """(pid, contents of /proc/<pid>/<name>) for every process, skipping those gone before they were read."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/{name}", "rb") as f:
                contents = f.read()
        except OSError:
            continue
        yield int(entry), contents


def pids_of_uid(uid: int) -> list[int]:
    """Processes whose real uid is ``uid``."""
    found = []
    for pid, status in proc_files("status"):
        for line in status.splitlines():
            if line.startswith(b"Uid:"):
                if int(line.split()[1]) == uid:
                    found.append(pid)
                break
    return found


def _uid_is_free_of_accounts(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return True
    return False


def acquire_uid_slot(base: int = DEFAULT_UID_BASE, slots: int = DEFAULT_SLOTS,
                     lock_dir: str = DEFAULT_LOCK_DIR) -> UidSlot:
    """Claim the lowest free slot; raises InfrastructureError when all are taken."""
    ensure_private_dir(lock_dir)
    for slot in range(slots):
        uid = base + slot
        path = os.path.join(lock_dir, f"uid-{uid}.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if not _uid_is_free_of_accounts(uid) or pids_of_uid(uid):
            os.close(fd)
            continue
        return UidSlot(uid=uid, gid=uid, lock_fd=fd)
    raise InfrastructureError(f"all {slots} sandbox uid slots in {lock_dir} are in use")
