"""Wall time per named part of some work (generation, env calls, update, ...): the one clock every ``timing/*``
metric is read from.

A part's seconds are the wall time during which at least one of its calls was running, so calls of one part that
overlap (concurrent episodes, env steps in threads) count once, never more than the wall time they cover. Parts
are not checked against each other: two parts that overlap are each counted in full. Only ``time.perf_counter``
is read, once when a part starts and once when it stops, so timing costs nothing next to what it measures.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator


class PartClock:
    """Seconds per part. ``with clock.part("env"): ...`` from any thread; ``seconds`` and ``totals`` read it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # env calls run in worker threads
        self._running: dict[str, int] = {}  # part -> calls inside it now
        self._since: dict[str, float] = {}  # part -> when its first running call started
        self._seconds: dict[str, float] = {}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        self._enter(name)
        try:
            yield
        finally:
            self._leave(name)

    def seconds(self, name: str) -> float:
        """The part's finished seconds (0 for a part never entered)."""
        with self._lock:
            return self._seconds.get(name, 0.0)

    def totals(self) -> dict[str, float]:
        with self._lock:
            return dict(self._seconds)

    def _enter(self, name: str) -> None:
        now = time.perf_counter()
        with self._lock:
            running = self._running.get(name, 0)
            if running == 0:
                self._since[name] = now
            self._running[name] = running + 1

    def _leave(self, name: str) -> None:
        now = time.perf_counter()
        with self._lock:
            self._running[name] -= 1
            if self._running[name] == 0:
                self._seconds[name] = self._seconds.get(name, 0.0) + now - self._since.pop(name)
