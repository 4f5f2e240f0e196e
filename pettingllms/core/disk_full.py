"""Naming a full disk: a write that failed for lack of room says so, with the path and the free bytes there,
instead of torch's ``unexpected pos 704 vs 598``.

ENOSPC, EDQUOT and EFBIG reach a caller as an ``OSError`` somewhere in the exception's chain, or not at all: torch's
zip writer turns a short write into ``RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos ...")``
and drops the errno, distributed checkpointing wraps each rank's error (``failures``), and Ray wraps a worker's
(``cause``). So the chain is searched for the errno; failing that, a short write is blamed on what this process can
see: its file size limit (``RLIMIT_FSIZE``, ``ulimit -f``) or the free space where the file was going. Standard
library only.
"""

from __future__ import annotations

import errno
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pettingllms.core.errors import DiskFullError

CAUSES = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded", errno.EFBIG: "file too large"}
SHORT_WRITE = "unexpected pos"  # torch's inline_container.cc, when a write wrote less than it was given
NEARLY_FULL_BYTES = 1 << 20  # a short write with less than this free beside the file: the disk is full


def disk_full_error(exc: BaseException, path: str | Path) -> DiskFullError | None:
    """A ``DiskFullError`` naming the cause, ``path`` and the free bytes there when ``exc`` (or anything in its
    chain) is a write that ran out of room; None for any other error. Call it before removing a partial file: the
    free space is measured now."""
    chain = list(_chain(exc))
    code = next((c.errno for c in chain if isinstance(c, OSError) and c.errno in CAUSES), None)
    if code is None and not any(SHORT_WRITE in str(c) for c in chain):
        return None
    free = free_bytes(path)
    limit = file_size_limit()
    if code == errno.EFBIG or (code is None and limit is not None):
        cause = CAUSES[errno.EFBIG]
        if limit is not None:
            cause += f" (this process may not write a file past {limit:,} bytes: RLIMIT_FSIZE, `ulimit -f`)"
    elif code is not None:
        cause = CAUSES[code]
    elif free is not None and free < NEARLY_FULL_BYTES:
        cause = CAUSES[errno.ENOSPC]
    else:
        cause = "the write was cut short (a full disk, a quota or a file size limit)"
    room = f"{free:,} bytes free there" if free is not None else "free space unknown"
    return DiskFullError(f"{cause} while writing {path} ({room})")


INTERRUPTS = (KeyboardInterrupt, SystemExit, GeneratorExit)  # a stop, not a failed write


@contextmanager
def naming_a_full_disk(path: str | Path) -> Iterator[None]:
    """Re-raise a write that ran out of room inside the block as a ``DiskFullError`` naming ``path``."""
    try:
        yield
    except (DiskFullError, *INTERRUPTS):
        raise
    except BaseException as exc:  # torch's CheckpointException derives from BaseException
        full = disk_full_error(exc, path)
        if full is None:
            raise
        raise full from exc


def free_bytes(path: str | Path) -> int | None:
    """Free bytes (for an unprivileged user) on the file system of ``path`` or of its nearest existing parent."""
    for folder in (Path(path), *Path(path).parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def file_size_limit() -> int | None:
    """This process's soft limit on the size of a file it writes, or None when unlimited (or not a POSIX system)."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception behind it: causes, contexts, Ray's ``cause``, DCP's per-rank ``failures`` (values
    are ``(exception, traceback)``) and an exception group's members."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__, getattr(current, "cause", None)]
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) and f else f for f in failures.values()]
        members = getattr(current, "exceptions", None)
        if isinstance(members, (tuple, list)):
            todo += list(members)
