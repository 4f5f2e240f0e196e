"""SandboxPool: bounded concurrency, asyncio, dead-worker replacement, infrastructure-failure counting."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pettingllms.core.errors import ConfigError, InfrastructureError
from pettingllms.sandbox import Sandbox, SandboxPool
from pettingllms.sandbox.result import RunResult

from sandbox_test_support import TEST_LIMITS, sandbox_for


@pytest.fixture(scope="module")
def sandbox():
    try:
        Sandbox("strong").plan()
        return sandbox_for("strong")
    except InfrastructureError:
        return sandbox_for("fallback")


class CountingSandbox:
    """Stands in for Sandbox: records the peak number of concurrent runs; 'die' kills the worker thread."""

    def __init__(self):
        self.active = 0
        self.peak = 0
        self.lock = threading.Lock()

    def run(self, source=None, **kwargs):
        if source == "die":
            raise SystemExit("worker killed by test")
        if source == "infra":
            raise InfrastructureError("test: sandbox could not start")
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.05)
        with self.lock:
            self.active -= 1
        return RunResult(verdict="ok", exit_code=0, stdout=source or "", stderr="", stdout_truncated=False,
                         stderr_truncated=False, wall_time_s=0.05, layer="fake", network_isolated=True)


def test_concurrency_is_bounded():
    fake = CountingSandbox()
    with SandboxPool(3, sandbox=fake) as pool:
        futures = [pool.submit(f"job{i}") for i in range(20)]
        assert [f.result().stdout for f in futures] == [f"job{i}" for i in range(20)]
    assert fake.peak == 3
    assert pool.metrics["completed"] == 20 and pool.metrics["verdict.ok"] == 20


def test_dead_worker_is_replaced_and_the_pool_keeps_working():
    fake = CountingSandbox()
    with SandboxPool(2, sandbox=fake) as pool:
        with pytest.raises(SystemExit):
            pool.submit("die").result(timeout=10)
        results = [pool.submit(f"after{i}").result(timeout=10).stdout for i in range(6)]
        assert results == [f"after{i}" for i in range(6)]
        deadline = time.monotonic() + 5
        while pool.alive_workers() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.alive_workers() == 2
        assert pool.metrics["workers_replaced"] == 1


def test_infrastructure_failures_are_counted_and_raised():
    with SandboxPool(2, sandbox=CountingSandbox()) as pool:
        with pytest.raises(InfrastructureError):
            pool.run("infra")
        assert pool.run("fine").verdict == "ok"
        assert pool.metrics["infrastructure_errors"] == 1


def test_closed_pool_refuses_work_and_bad_sizes_are_refused():
    pool = SandboxPool(1, sandbox=CountingSandbox())
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit("x")
    with pytest.raises(ConfigError):
        SandboxPool(0, sandbox=CountingSandbox())


def test_arun_overlaps_with_the_event_loop(sandbox):
    """Four half-second programs on four workers run at the same time while the loop keeps ticking."""

    async def main(pool):
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        program = "import time\nstart = time.time()\ntime.sleep(0.5)\nprint({}, start, time.time())"
        results = await asyncio.gather(*(pool.arun(program.format(i), limits=TEST_LIMITS) for i in range(4)))
        tick_task.cancel()
        return results, ticks

    with SandboxPool(4, sandbox=sandbox) as pool:
        results, ticks = asyncio.run(main(pool))
    lines = [r.stdout.split() for r in results]
    assert [int(line[0]) for line in lines] == list(range(4))
    # They overlapped: every program started before any ended. Read from the programs' own clocks, so the time a
    # loaded machine adds around them does not count, while a pool that ran them one at a time would fail this.
    assert max(float(line[1]) for line in lines) < min(float(line[2]) for line in lines)
    assert ticks > 10  # the loop was not blocked


def test_pool_from_non_main_threads(sandbox):
    with SandboxPool(2, sandbox=sandbox) as pool:
        outputs = {}

        def caller(i):
            outputs[i] = pool.run(f"print({i} + 1)", limits=TEST_LIMITS).stdout

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert outputs == {i: f"{i + 1}\n" for i in range(4)}
