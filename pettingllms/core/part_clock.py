"""Wall time per named part of some work (generation, env calls, update, ...): the one clock every ``timing/*``
metric is read from.

A part's seconds are the wall time during which at least one of its calls was running, so calls of one part that
overlap (concurrent episodes, env steps in threads) count once, never more than the wall time they cover. Parts
are not checked against each other: two parts that overlap are each counted in full, and ``alone_seconds`` says how
much of a part ran while no other part did (a streaming rollout steps envs while the engines generate). Only
``time.perf_counter`` is read, once when a part starts and once when it stops: a few microseconds a call, nothing next
to an env call.
"""

from __future__ import annotations

import threading
import time


class PartClock:
    """Seconds per part. ``with clock.part("env"): ...`` from any thread; ``seconds`` and ``totals`` read it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # env calls run in worker threads
        self._running: dict[str, int] = {}  # part -> calls inside it now
        self._since: dict[str, float] = {}  # part -> when its first running call started
        self._seconds: dict[str, float] = {}
        self._alone_seconds: dict[str, float] = {}
        self._alone: tuple[str, float] | None = None  # the one part running now, and since when it runs alone

    def part(self, name: str) -> "_Part":
        return _Part(self, name)

    def seconds(self, name: str) -> float:
        """The part's finished seconds (0 for a part never entered)."""
        with self._lock:
            return self._seconds.get(name, 0.0)

    def alone_seconds(self, name: str) -> float:
        """The part's finished seconds during which no other part was running."""
        with self._lock:
            return self._alone_seconds.get(name, 0.0)

    def totals(self) -> dict[str, float]:
        with self._lock:
            return dict(self._seconds)

    def _enter(self, name: str) -> None:
        with self._lock:  # the time is read under the lock: events of several threads apply in the order they happen
            now = time.perf_counter()
            running = self._running.get(name, 0)
            if running == 0:
                self._since[name] = now
            self._running[name] = running + 1
            self._track_alone(now)

    def _leave(self, name: str) -> None:
        with self._lock:
            now = time.perf_counter()
            self._running[name] -= 1
            if self._running[name] == 0:
                self._seconds[name] = self._seconds.get(name, 0.0) + now - self._since.pop(name)
            self._track_alone(now)

    def _track_alone(self, now: float) -> None:
        """After a part started or stopped (lock held): close the alone-interval that ended, open one that began."""
        running = [name for name, calls in self._running.items() if calls]
        if self._alone is not None and running != [self._alone[0]]:
            name, since = self._alone
            self._alone_seconds[name] = self._alone_seconds.get(name, 0.0) + now - since
            self._alone = None
        if self._alone is None and len(running) == 1:
            self._alone = (running[0], now)


class _Part:
    """``with clock.part(name):`` (a plain class: a generator-based context manager costs several times more)."""

    __slots__ = ("_clock", "_name")

    def __init__(self, clock: PartClock, name: str) -> None:
        self._clock, self._name = clock, name

    def __enter__(self) -> None:
        self._clock._enter(self._name)

    def __exit__(self, *exc) -> None:
        self._clock._leave(self._name)
