"""Writing files and directories atomically: build under a temporary name beside the target, then rename.

A crash (or Ctrl-C) while writing leaves only a hidden ``.<name>.tmp-*`` entry, never a half-written target, so a
reader that finds the target can trust it is complete. Renames within one directory are atomic on POSIX file
systems; replacing an existing directory moves the old one aside first (a directory cannot be replaced by one
rename), so the target is missing for an instant but never half-written. The result has the mode an ordinary
``open``/``mkdir`` would give it (the umask's), never a wider one. The project's one home for this (checkpoints,
model caches, datasets). Standard library only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pettingllms.core.file_modes import ordinary_mode


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
    except BaseException:
        tmp.unlink(missing_ok=True)
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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _move_into_place(tmp, dest, replace=replace)


def remove_directory_aside(path: str | Path) -> None:
    """Delete ``path`` by first renaming it away, so nobody sees it half-deleted."""
    path = Path(path)
    if not path.exists():
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.rename(path, retired / path.name)
    shutil.rmtree(retired, ignore_errors=True)


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
