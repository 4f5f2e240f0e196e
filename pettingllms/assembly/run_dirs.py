"""Run directories, shared by training and evaluation: ``<log_dir>/<name>/<date>/<time>/``.

A run directory is owner-only (0700) unless the run shares it (``training.share_run_dir``): what a run writes
(weights, prompts, samples, logs) is then out of reach of other users of the machine, whatever their modes."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from pettingllms.core.file_modes import PRIVATE_DIR_MODE

LOGGER_NAME = "pettingllms"  # the library's logger; a run directory's log file records it


def new_run_dir(log_dir: str | Path, experiment: str, now: datetime | None = None, *, shared: bool = False) -> Path:
    """A fresh directory for one run (``-2``, ``-3``, ... when two runs start in the same second), as an absolute
    path: it is handed to Ray actors, whose working directory (on another node, or under ``ray start``) is not the
    driver's. Owner-only unless ``shared`` (then the umask's mode, as ``mkdir`` gives)."""
    now = now or datetime.now()
    base = Path(log_dir).absolute() / experiment / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if shared:
        path.mkdir()
    else:
        path.mkdir(mode=PRIVATE_DIR_MODE)  # never readable by others, not even for an instant
        os.chmod(path, PRIVATE_DIR_MODE)  # exactly 0700, whatever the umask took off
    return path
