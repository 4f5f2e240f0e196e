"""What a run's private uid can leave behind outside its work dir, found and removed after the run (fallback layer as
root): files in world-writable directories, at any depth, and SysV IPC objects.

The fallback launcher gives each run a private IPC namespace and private tmpfs mounts over ``SHARED_WRITABLE_DIRS``
where the kernel allows it, so usually nothing of this reaches the host; the sweep covers the directories the
launcher could not make private (it reports which it did) and is the only clean-up where namespaces are refused.
It runs after every process of the uid is dead, so the uid cannot race it; entries are opened relative to
their parent's fd and never through a symlink.
"""

from __future__ import annotations

import ctypes
import logging
import os
import stat

logger = logging.getLogger("pettingllms.sandbox")

# Writable by every uid on a usual Linux machine (found by scanning for o+w directories); the launcher mounts a
# private tmpfs (mqueue for /dev/mqueue) over each in the fallback layer.
SHARED_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")

IPC_RMID = 0
SYSV_IPC_KINDS = ("shm", "sem", "msg")  # /proc/sysvipc/<kind>


def sweep_shared_dirs(uid: int, skip: tuple[str, ...] = ()) -> list[str]:
    """Remove every entry owned by ``uid`` under ``SHARED_WRITABLE_DIRS`` (except ``skip``), descending into
    every directory the uid could traverse. Returns the removed paths."""
    removed: list[str] = []
    for top in SHARED_WRITABLE_DIRS:
        if top in skip:
            continue
        try:
            top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            _sweep_dir(top_fd, top, uid, removed)
        finally:
            os.close(top_fd)
    return removed


def _sweep_dir(dir_fd: int, path: str, uid: int, removed: list[str]) -> None:
    try:
        entries = os.listdir(dir_fd)
    except OSError:
        return
    for name in entries:
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        full = os.path.join(path, name)
        if info.st_uid == uid:
            if _remove_at(dir_fd, name, info):
                removed.append(full)
        elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IXOTH:
            # Another owner's directory the uid could enter: it may hold a world-writable folder deeper down.
            try:
                sub_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                _sweep_dir(sub_fd, full, uid, removed)
            finally:
                os.close(sub_fd)


def _remove_at(dir_fd: int, name: str, info: os.stat_result) -> bool:
    try:
        if stat.S_ISDIR(info.st_mode):
            sub_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            try:
                os.fchmod(sub_fd, stat.S_IRWXU)  # the program may have made it unreadable to its owner
                for child in os.listdir(sub_fd):
                    _remove_at(sub_fd, child, os.stat(child, dir_fd=sub_fd, follow_symlinks=False))
            finally:
                os.close(sub_fd)
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
        return True
    except (OSError, RecursionError) as exc:  # RecursionError: a program can nest directories deeper than our stack
        logger.error("sandbox could not remove %s left by a run: %s", name, exc)
        return False


# ------------------------------------------------------------------------------------------ SysV IPC

def sysv_ipc_of_uid(uid: int) -> list[tuple[str, int]]:
    """(kind, id) of every SysV shared memory segment, semaphore set and message queue that ``uid`` owns or
    created, in this IPC namespace."""
    found = []
    for kind in SYSV_IPC_KINDS:
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                header, *rows = f.read().splitlines()
        except OSError:
            continue
        columns = header.split()
        id_col = 1  # key, then shmid / semid / msqid
        owner_cols = [columns.index(c) for c in ("uid", "cuid") if c in columns]
        for row in rows:
            fields = row.split()
            if any(int(fields[c]) == uid for c in owner_cols):
                found.append((kind, int(fields[id_col])))
    return found


def remove_sysv_ipc(uid: int) -> list[tuple[str, int]]:
    """Remove the SysV IPC objects of ``uid``; returns those it removed."""
    found = sysv_ipc_of_uid(uid)
    if not found:
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    removers = {
        "shm": lambda ipc_id: libc.shmctl(ipc_id, IPC_RMID, None),
        "sem": lambda ipc_id: libc.semctl(ipc_id, 0, IPC_RMID),
        "msg": lambda ipc_id: libc.msgctl(ipc_id, IPC_RMID, None),
    }
    removed = []
    for kind, ipc_id in found:
        if removers[kind](ipc_id) == 0:
            removed.append((kind, ipc_id))
        else:
            logger.error("sandbox could not remove SysV %s %d of uid %d: %s", kind, ipc_id, uid,
                         os.strerror(ctypes.get_errno()))
    return removed


def sweep(uid: int, private_dirs: tuple[str, ...] = ()) -> None:
    """Everything a finished run of ``uid`` left outside its work dir (``private_dirs``: made private by the
    launcher, nothing of the run can be there)."""
    remove_sysv_ipc(uid)
    sweep_shared_dirs(uid, skip=private_dirs)
