"""Whether a process still runs, from its PID (a lock's holder, a private directory's owner). Standard library only."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """True while ``pid`` names a running process. Another user's process holding the PID counts as alive: not ours
    to judge."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
