"""A run directory's log file, shared by training (``train.log``) and evaluation (``eval.log``): pettingllms' own
records at INFO and above, every library's warnings and errors, Python warnings, the per-step lines and the record's
own lines; attached for the run and detached after it, with the logger's level and the warnings capture restored."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from pettingllms.assembly.run_dirs import LOGGER_NAME

# One line per training step. Not propagated: the console shows the step line through the progress bar instead.
STEP_LOGGER = "pettingllms.steps"
logging.getLogger(STEP_LOGGER).propagate = False
# What only the record needs: the run plan at the top of train.log, and the traceback of an error that stopped the
# run (the console prints the error's one line).
RECORD_LOGGER = "pettingllms.record"
logging.getLogger(RECORD_LOGGER).propagate = False


class _OursOrWarnings(logging.Filter):
    """A run's log keeps pettingllms' own records at INFO and above, and every library's warnings and errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name == LOGGER_NAME or record.name.startswith(
            LOGGER_NAME + ".")


@dataclass
class FileLog:
    """What ``attach_file_logger`` changed, so that ``detach_file_logger`` can undo exactly that."""

    handler: logging.FileHandler
    previous_level: int
    captured_warnings: bool


class _RunLogHandler(logging.FileHandler):
    """A run's log that cannot be written (a full disk) says so once on stderr, instead of a traceback per record."""

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self.failed:
            self.failed = True
            sys.stderr.write(f"warning: cannot write {self.baseFilename}: {sys.exc_info()[1]}; its records are lost "
                             "while this lasts (the console keeps its own)\n")


def attach_file_logger(run_dir: Path, name: str = "train.log") -> FileLog:
    """Write ``<run_dir>/<name>`` (``train.log``; ``pettingllms eval`` writes ``eval.log``): pettingllms' INFO lines, the per-step lines (``STEP_LOGGER``, which the
    console does not repeat: it shows the progress bar and its own step line), the record's own lines
    (``RECORD_LOGGER``: the plan, a stop's traceback), Python warnings, and every library's warnings and errors."""
    handler = _RunLogHandler(run_dir / name)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_OursOrWarnings())
    ours = logging.getLogger(LOGGER_NAME)
    previous_level = ours.level
    if ours.getEffectiveLevel() > logging.INFO:
        ours.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    logging.getLogger(STEP_LOGGER).addHandler(handler)
    logging.getLogger(RECORD_LOGGER).addHandler(handler)
    captured = logging._warnings_showwarning is not None  # type: ignore[attr-defined]
    logging.captureWarnings(True)  # warnings.warn(...) -> the "py.warnings" logger -> train.log
    return FileLog(handler, previous_level, captured)


def detach_file_logger(log: FileLog) -> None:
    logging.getLogger().removeHandler(log.handler)
    logging.getLogger(STEP_LOGGER).removeHandler(log.handler)
    logging.getLogger(RECORD_LOGGER).removeHandler(log.handler)
    logging.getLogger(LOGGER_NAME).setLevel(log.previous_level)
    if not log.captured_warnings:
        logging.captureWarnings(False)
    log.handler.close()
