"""A Ray instance of our own on this machine, with its session files in a directory only we can enter.

Ray makes its temporary directory and every session folder under it world-writable (0777, no sticky bit), by
default in the shared system temp dir: anyone on the machine, a sandboxed program included, could rename or delete
inside them (sockets, logs, spilled objects). ``start_local_ray`` gives Ray a folder inside a fresh owner-only
(0700) directory, ``<tmp>/pettingllms-ray-<uid>-<random>/r`` (short: Ray's unix sockets live under it, and a
socket path may not exceed 107 bytes), and removes it when Ray stops. A driver killed before it could stop Ray
leaves its directory behind: the next start removes every such directory of this user whose owner (the PID written
in it) is gone. Joining a cluster (``RAY_ADDRESS``) uses the cluster's own folders and is not started here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pettingllms.core.processes import process_alive

RAY_DIR = "r"  # Ray chmods this one to 0777; the private directory above it keeps everyone else out
OWNER_FILE = "owner.pid"  # the driver's PID: a directory whose owner is gone is removed at the next start


@dataclass
class LocalRay:
    """A started instance: ``stop()`` shuts Ray down and deletes its private directory."""

    private_dir: Path

    def stop(self) -> None:
        import ray

        ray.shutdown()
        shutil.rmtree(self.private_dir, ignore_errors=True)


def private_ray_parent() -> Path:
    """Where the private directories go: the system temp dir Ray itself would use."""
    return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir())


def start_local_ray(**init_kwargs: Any) -> LocalRay:
    """``ray.init(address="local", **init_kwargs)`` with the session under a fresh private directory."""
    import ray

    remove_stale_ray_dirs(private_ray_parent())
    private = Path(tempfile.mkdtemp(prefix=_prefix(), dir=private_ray_parent()))  # 0700
    (private / OWNER_FILE).write_text(str(os.getpid()))
    try:
        ray.init(address="local", _temp_dir=str(private / RAY_DIR), **init_kwargs)
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    return LocalRay(private)


def _prefix() -> str:
    return f"pettingllms-ray-{os.getuid()}-"


def remove_stale_ray_dirs(parent: Path) -> list[Path]:
    """Remove this user's private Ray directories under ``parent`` whose owner process is gone; returns them.
    Directories of live drivers, of other users, and without an owner file (written before this check existed, or
    being created right now) are left alone."""
    removed = []
    for folder in sorted(parent.glob(_prefix() + "*")):
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            pid = int((folder / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if pid <= 0 or process_alive(pid):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed
