"""The run directory: ``logs/<experiment>/<date>/<time>/`` with train.log, summary.log (JSON lines),
config.yaml, checkpoints/ and validate/."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Sequence

from pettingllms.core import EpisodeRecord

LOGGER_NAME = "pettingllms"
# One line per training step. Not propagated: the console shows the step line through the progress bar instead.
STEP_LOGGER = "pettingllms.steps"
logging.getLogger(STEP_LOGGER).propagate = False


def new_run_dir(log_dir: str | Path, experiment: str, now: datetime | None = None) -> Path:
    now = now or datetime.now()
    base = Path(log_dir) / experiment / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True)
    return path


def find_resumable_run(log_dir: str | Path, experiment: str) -> Path | None:
    """The most recent run of ``experiment`` that has a checkpoint."""
    runs = sorted(Path(log_dir, experiment).glob("*/*/checkpoints/latest"), key=lambda p: p.stat().st_mtime)
    return runs[-1].parents[1] if runs else None


class _OursOrWarnings(logging.Filter):
    """train.log keeps pettingllms' own records at INFO and above, and every library's warnings and errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name == LOGGER_NAME or record.name.startswith(
            LOGGER_NAME + ".")


@dataclass
class FileLog:
    """What ``attach_file_logger`` changed, so that ``detach_file_logger`` can undo exactly that."""

    handler: logging.FileHandler
    previous_level: int
    captured_warnings: bool


def attach_file_logger(run_dir: Path) -> FileLog:
    """Write ``<run_dir>/train.log``: pettingllms' INFO lines, the per-step lines (``STEP_LOGGER``, which the
    console does not repeat: it shows the progress bar and its own step line), Python warnings, and every
    library's warnings and errors."""
    handler = logging.FileHandler(run_dir / "train.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_OursOrWarnings())
    ours = logging.getLogger(LOGGER_NAME)
    previous_level = ours.level
    if ours.getEffectiveLevel() > logging.INFO:
        ours.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    steps = logging.getLogger(STEP_LOGGER)
    steps.addHandler(handler)
    captured = logging._warnings_showwarning is not None  # type: ignore[attr-defined]
    logging.captureWarnings(True)  # warnings.warn(...) -> the "py.warnings" logger -> train.log
    return FileLog(handler, previous_level, captured)


def detach_file_logger(log: FileLog) -> None:
    logging.getLogger().removeHandler(log.handler)
    logging.getLogger(STEP_LOGGER).removeHandler(log.handler)
    logging.getLogger(LOGGER_NAME).setLevel(log.previous_level)
    if not log.captured_warnings:
        logging.captureWarnings(False)
    log.handler.close()


def truncate_summary(run_dir: Path, last_step: int) -> None:
    """On resume, drop summary lines written after the checkpoint's step (they will be written again)."""
    path = run_dir / "summary.log"
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


def write_validation_records(run_dir: Path, step: int, benchmark: str, episodes: Sequence[EpisodeRecord]) -> Path:
    folder = run_dir / "validate" / f"step_{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{benchmark}.jsonl"
    with path.open("w") as fh:
        for episode in episodes:
            fh.write(json.dumps(dataclasses.asdict(episode), ensure_ascii=False, default=str) + "\n")
    return path
