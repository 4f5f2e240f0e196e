"""Atomic checkpoints: write into a temp dir, rename it into place, then move the ``latest`` pointer.

Layout: ``<run>/checkpoints/step_000010/{trainer_state.json, <policy>/...}`` and ``<run>/checkpoints/latest``
(a text file holding the directory name). A crash at any point leaves either the old or the new checkpoint,
never a half-written one that ``latest`` points to. ``prune_checkpoints`` keeps the newest N
(``training.max_ckpt_to_keep``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

LATEST = "latest"
STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"step_\d{6,}")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def save_checkpoint(root: Path, step: int, trainer_state: dict[str, Any], write_payload: Callable[[Path], None]) -> Path:
    """Create ``root/step_<step>`` atomically; ``write_payload(tmp_dir)`` writes the policies' state into it."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write_payload(tmp)
        (tmp / STATE_FILE).write_text(json.dumps(trainer_state, indent=1, sort_keys=True))
        _fsync_dir(tmp)
        if final.exists():  # a re-run of the same step: replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_atomic(root / LATEST, final.name)
    return final


def prune_checkpoints(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` step directories (``keep <= 0``: keep every one). The checkpoint that
    ``latest`` names is never deleted. Returns the deleted directories, oldest first."""
    if keep <= 0 or not root.is_dir():
        return []
    steps = sorted((p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name)), key=lambda p: p.name)
    latest = latest_checkpoint(root)
    doomed = [p for p in steps[:-keep] if latest is None or p.name != latest.name]
    for path in doomed:
        # Rename first, so a crash mid-delete never leaves a half step directory that looks like a checkpoint.
        trash = root / f".del-{path.name}-{uuid.uuid4().hex[:8]}"
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return doomed


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / STATE_FILE).is_file() else None


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / STATE_FILE).read_text())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
