"""A crash in native code (a segfault in a kernel, an abort in a C++ library) names where it happened.

Without this, such a crash ends the process with nothing but its signal: the training or the rehearsal stops and the
user has no line to look at. ``report_native_crashes`` turns on the standard library's ``faulthandler`` here, which
prints every thread's Python stack on SIGSEGV, SIGFPE, SIGABRT, SIGBUS and SIGILL, and sets ``PYTHONFAULTHANDLER``
so every Python process started from here (Ray's workers, vLLM's engine processes) does the same. A user's own
setting of the variable is kept. Standard library only.
"""

from __future__ import annotations

import faulthandler
import io
import os
import signal
import sys


def report_native_crashes() -> None:
    if os.environ.get("PYTHONFAULTHANDLER") == "":
        return
    if not faulthandler.is_enabled():
        try:
            faulthandler.enable(all_threads=True)
        except (AttributeError, ValueError, io.UnsupportedOperation):  # a stderr without a file descriptor
            if sys.__stderr__ is not None:
                faulthandler.enable(file=sys.__stderr__, all_threads=True)
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")


def exit_status(returncode: int) -> str:
    """A child's return code in words: ``exit code 1``, or ``signal SIGSEGV`` for a process a signal ended."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"signal {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"
