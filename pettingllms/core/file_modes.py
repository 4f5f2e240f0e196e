"""File and directory modes: what an ordinary creation gives (the process's umask), and owner-only trees.

Run directories and checkpoints hold trained weights, prompts and samples; by default they are owner-only
(``training.share_run_dir``). Files written through a temporary name (``atomic.py``) get the mode an ordinary
``open`` or ``mkdir`` would have given them, never a wider fixed one. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
_GROUP_AND_OTHERS = 0o077


def current_umask() -> int:
    """The process's umask, read without changing it where the system allows (a change would race other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def ordinary_mode(directory: bool) -> int:
    """The mode ``mkdir`` (0777) or ``open`` (0666) creates with under the current umask."""
    return (0o777 if directory else 0o666) & ~current_umask()


def restrict_to_owner(root: str | Path) -> None:
    """Take every permission of group and others off ``root`` and everything under it (links are left alone)."""
    root = Path(root)
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    for path in paths:
        if not path.is_symlink():
            os.chmod(path, path.stat().st_mode & 0o7777 & ~_GROUP_AND_OTHERS)
