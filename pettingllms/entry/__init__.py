"""The commands' implementations (``pettingllms train``, ``eval``, ``export``, ``plot``, ``check-env``)."""

import logging

# HTTP clients that log every request at INFO: an agent program's `openai` client talking to the run's gateway
# would print a line per model call.
CHATTY_LOGGERS = ("httpx", "httpx2", "httpcore", "openai")


def console_logging() -> None:
    """The commands' console log: INFO lines of the library, warnings of chatty HTTP clients."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
