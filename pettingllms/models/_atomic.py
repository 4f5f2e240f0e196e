"""Write a directory atomically: build it under a temporary name beside the target, then rename.

A crash (or Ctrl-C) while building leaves only a hidden ``.<name>.tmp-*`` folder, never a half-written
target, so readers that find the target can trust it is complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_directory(dest: Path, *, replace: bool) -> Iterator[Path]:
    """Yield an empty temporary directory; on a clean exit it becomes ``dest``.

    replace=True swaps out an existing ``dest``; replace=False keeps an existing one (another process
    finished the same build first) and discards ours. On an exception the temporary directory is deleted.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the finished directory is an ordinary cache folder
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _move_into_place(tmp, dest, replace=replace)


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


def remove_directory_aside(path: Path) -> None:
    """Delete ``path`` by first renaming it away, so nobody sees it half-deleted."""
    if not path.exists():
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.rename(path, retired / path.name)
    shutil.rmtree(retired, ignore_errors=True)
