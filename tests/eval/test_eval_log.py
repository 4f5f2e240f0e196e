"""``eval.log`` is written by the same code as ``train.log`` (``assembly/run_log.py``) and leaves the loggers as it
found them: the library logger's level and its handlers (an evaluation used to leave ``pettingllms`` at INFO)."""

from __future__ import annotations

import logging
import warnings

from pettingllms.eval.runner import _eval_log


def test_eval_log_records_our_lines_and_warnings_then_restores_the_loggers(tmp_path):
    ours = logging.getLogger("pettingllms")
    before_level, before_handlers = ours.level, list(logging.getLogger().handlers)
    ours.setLevel(logging.WARNING)
    try:
        with _eval_log(tmp_path):
            logging.getLogger("pettingllms.eval").info("an evaluation line")
            logging.getLogger("some.library").warning("a library's warning")
            logging.getLogger("some.library").info("a library's chatter")
            warnings.warn("a Python warning", UserWarning, stacklevel=1)
        text = (tmp_path / "eval.log").read_text()
        assert "an evaluation line" in text and "a library's warning" in text and "a Python warning" in text
        assert "chatter" not in text
        assert ours.level == logging.WARNING and logging.getLogger().handlers == before_handlers
    finally:
        ours.setLevel(before_level)
