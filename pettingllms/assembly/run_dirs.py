"""Run directories, shared by training and evaluation: ``<log_dir>/<name>/<date>/<time>/``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

LOGGER_NAME = "pettingllms"  # the library's logger; a run directory's log file records it


def new_run_dir(log_dir: str | Path, experiment: str, now: datetime | None = None) -> Path:
    """A fresh directory for one run (``-2``, ``-3``, ... when two runs start in the same second), as an absolute
    path: it is handed to Ray actors, whose working directory (on another node, or under ``ray start``) is not the
    driver's."""
    now = now or datetime.now()
    base = Path(log_dir).absolute() / experiment / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True)
    return path
