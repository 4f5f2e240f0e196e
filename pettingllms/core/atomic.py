"""Writing files and directories atomically: build under a temporary name beside the target, then rename.

A crash (or Ctrl-C) while writing leaves only a hidden ``.<name>.tmp-*`` entry, never a half-written target, so a
reader that finds the target can trust it is complete. Renames within one directory are atomic on POSIX file
systems; replacing an existing directory moves the old one aside first (a directory cannot be replaced by one
rename), so the target is missing for an instant but never half-written. The result has the mode an ordinary
``open``/``mkdir`` would give it (the umask's), never a wider one. The project's one home for this (checkpoints,
model caches, datasets, and appends to line logs: ``append_whole``). Standard library only.

A write that runs out of room (a full disk, a quota, a file size limit) raises ``DiskFullError`` naming the cause, the
target and the free bytes, measured before the partial temporary entry is removed. A process killed mid-write leaves
its hidden entry behind: ``leftovers`` finds them, for the next start to remove.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pettingllms.core.disk_full import INTERRUPTS, disk_full_error
from pettingllms.core.errors import DiskFullError
from pettingllms.core.file_modes import ordinary_mode

_LEFTOVER = re.compile(r"\..+\.(?:tmp|old)-[^/]+")  # mkstemp/mkdtemp names below: .<name>.tmp-* and .<name>.old-*


@contextmanager
def atomic_file(dest: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; write the file there. On a clean exit it replaces ``dest``; on an
    exception it is deleted and ``dest`` is left as it was."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)
    os.close(handle)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, ordinary_mode(directory=False))  # mkstemp makes it 0600; the result is an ordinary file
        os.replace(tmp, dest)
    except BaseException as exc:
        full = _out_of_room(exc, dest)  # before the partial file goes: the free space is the failure's
        tmp.unlink(missing_ok=True)
        if full is not None:
            raise full from exc
        raise


def write_text_atomic(dest: str | Path, text: str) -> Path:
    """Replace ``dest``'s content with ``text`` atomically."""
    with atomic_file(dest) as tmp:
        tmp.write_text(text)
    return Path(dest)


@contextmanager
def atomic_directory(dest: str | Path, *, replace: bool) -> Iterator[Path]:
    """Yield an empty temporary directory; on a clean exit it becomes ``dest``.

    replace=True swaps out an existing ``dest``; replace=False keeps an existing one (another process finished the
    same build first) and discards ours. On an exception the temporary directory is deleted. The directory's
    entries are flushed to disk before the rename.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    os.chmod(tmp, ordinary_mode(directory=True))  # mkdtemp makes it 0700; the result is an ordinary folder
    try:
        yield tmp
        _fsync_directory(tmp)
    except BaseException as exc:
        full = _out_of_room(exc, dest)  # before the partial directory goes: the free space is the failure's
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise DiskFullError(f"{full}; the partial {tmp.name} was removed") from exc
        raise
    _move_into_place(tmp, dest, replace=replace)


def append_whole(path: str | Path, text: str) -> None:
    """Append ``text`` (whole lines) to ``path``, or nothing: a write that fails part-way (a full disk) is cut back
    to the old end, so the file never ends in a torn line that the next append would continue."""
    data = memoryview(text.encode())
    with open(path, "ab", buffering=0) as fh:  # unbuffered: nothing is left to flush after a failure
        end = fh.seek(0, os.SEEK_END)
        try:
            while data:
                data = data[fh.write(data):]
        except BaseException as exc:
            full = _out_of_room(exc, path)
            try:
                os.ftruncate(fh.fileno(), end)  # shrinking needs no room
            except OSError:
                pass  # the reader drops a torn last line (trainer/run_dir.py)
            if full is not None:
                raise full from exc
            raise


def leftovers(folder: str | Path) -> list[Path]:
    """The hidden temporary (``.<name>.tmp-*``) and retired (``.<name>.old-*``) entries in ``folder`` that a process
    stopped mid-write left behind, sorted by name. Only safe to remove while nobody writes to ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _LEFTOVER.fullmatch(p.name))


_TEMPORARY = re.compile(r"\.(.+)\.tmp-[^/]+")  # atomic_directory's .<name>.tmp-* (the name: group 1)


def published_path(path: str | Path) -> Path:
    """Where ``path``, inside a folder ``atomic_directory`` is still building, will be once it is renamed into place
    (``root/.step_3.tmp-x/a`` -> ``root/step_3/a``); any other path is returned as it is."""
    return Path(*(match.group(1) if (match := _TEMPORARY.fullmatch(part)) else part for part in Path(path).parts))


def remove_directory_aside(path: str | Path) -> None:
    """Delete ``path`` by first renaming it away, so nobody sees it half-deleted."""
    path = Path(path)
    if not path.exists():
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.rename(path, retired / path.name)
    shutil.rmtree(retired, ignore_errors=True)


def _out_of_room(exc: BaseException, dest: Path) -> DiskFullError | None:
    if isinstance(exc, (DiskFullError, *INTERRUPTS)):
        return None  # already named by an inner write; or a stop, not a failed write
    return disk_full_error(exc, dest)


def _move_into_place(tmp: Path, dest: Path, *, replace: bool) -> None:
    if not dest.exists():
        try:
            os.rename(tmp, dest)
            return
        except OSError:
            if not dest.exists():  # not a lost race: a real failure
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    if not replace:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
    os.rename(dest, retired / dest.name)
    os.rename(tmp, dest)
    shutil.rmtree(retired, ignore_errors=True)


def _fsync_directory(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
