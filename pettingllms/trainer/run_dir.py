"""The run directory: ``logs/<experiment>/<date>/<time>/`` with train.log, summary.log (JSON lines),
config.yaml, checkpoints/ and validate/."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Sequence

from pettingllms.core import EpisodeRecord

LOGGER_NAME = "pettingllms"


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


def attach_file_logger(run_dir: Path) -> logging.Handler:
    handler = logging.FileHandler(run_dir / "train.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return handler


def detach_file_logger(handler: logging.Handler) -> None:
    logging.getLogger(LOGGER_NAME).removeHandler(handler)
    handler.close()


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
