"""The clock every timing/* metric is read from: a part's overlapping calls count once."""

from __future__ import annotations

import threading
import time

import pytest

from pettingllms.core.part_clock import PartClock


def test_overlapping_calls_of_a_part_count_their_wall_time_once():
    clock = PartClock()
    inside, inner_done = threading.Event(), threading.Event()
    inner = {}

    def second_call():
        inside.wait()
        started = time.perf_counter()
        with clock.part("env"):
            time.sleep(0.1)
        inner["s"] = time.perf_counter() - started
        inner_done.set()

    thread = threading.Thread(target=second_call)
    thread.start()
    started = time.perf_counter()
    with clock.part("env"):  # the second call starts and ends while this one runs
        inside.set()
        inner_done.wait()
    outer = time.perf_counter() - started
    thread.join()
    assert inner["s"] >= 0.1
    assert clock.seconds("env") <= outer  # summing both calls would give outer + inner
    assert clock.seconds("env") >= inner["s"]


def test_sequential_calls_add_up_and_parts_are_separate():
    clock = PartClock()
    for _ in range(3):
        with clock.part("update"):
            time.sleep(0.01)
    with pytest.raises(RuntimeError):
        with clock.part("sync"):  # a call that raises still counts
            time.sleep(0.01)
            raise RuntimeError("the push failed")
    assert clock.seconds("update") >= 0.03
    assert 0.01 <= clock.seconds("sync") < clock.seconds("update")
    assert clock.seconds("checkpoint") == 0.0
    assert set(clock.totals()) == {"update", "sync"}


def test_alone_seconds_count_only_the_time_no_other_part_ran(monkeypatch):
    """gen 0-10; env 4-6 and 8-14 (overlapping gen), env 16-18 alone: env alone = 10-14 and 16-18 = 6 s."""
    import pettingllms.core.part_clock as part_clock

    now = [0.0]
    monkeypatch.setattr(part_clock.time, "perf_counter", lambda: now[0])
    clock = PartClock()
    gen, env = clock.part("generate"), clock.part("env")

    def at(t, action):
        now[0] = t
        action()

    at(0, gen.__enter__)
    at(4, env.__enter__)
    at(6, lambda: env.__exit__(None, None, None))
    at(8, env.__enter__)
    at(10, lambda: gen.__exit__(None, None, None))
    at(14, lambda: env.__exit__(None, None, None))
    at(16, env.__enter__)
    at(18, lambda: env.__exit__(None, None, None))
    assert clock.seconds("generate") == 10 and clock.seconds("env") == 10
    assert clock.alone_seconds("generate") == 6  # 0-4 and 6-8
    assert clock.alone_seconds("env") == 6
