"""Bounded concurrency for sandbox runs, usable from any thread and from asyncio.

Each worker is a thread that launches one sandboxed program at a time (the work happens in child
processes, so threads are enough and the GIL is not a bottleneck). A worker that dies -- a BaseException
escaping a run -- fails its job and is replaced. Counters in ``metrics``: submitted, completed,
infrastructure_errors, errors, workers_replaced, and one ``verdict.<name>`` per verdict.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import Counter
from concurrent.futures import Future

from pettingllms.core.errors import ConfigError, InfrastructureError

from .result import INFRASTRUCTURE_ERROR, RunResult
from .runner import Sandbox, default_sandbox

logger = logging.getLogger("pettingllms.sandbox")
_STOP = object()


class SandboxPool:
    def __init__(self, max_workers: int, sandbox: Sandbox | None = None, name: str = "sandbox-pool"):
        if not isinstance(max_workers, int) or max_workers < 1:
            raise ConfigError(f"SandboxPool max_workers must be a positive int, got {max_workers!r}")
        self.max_workers = max_workers
        self.sandbox = sandbox or default_sandbox()
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._counts: Counter = Counter()
        self._closed = False
        self._workers: list[threading.Thread] = [self._start_worker(i) for i in range(max_workers)]

    # ------------------------------------------------------------------ workers

    def _start_worker(self, index: int) -> threading.Thread:
        thread = threading.Thread(target=self._work, args=(index,), name=f"{self.name}-{index}", daemon=True)
        thread.start()
        return thread

    def _work(self, index: int) -> None:
        clean_exit = False
        try:
            while True:
                job = self._jobs.get()
                if job is _STOP:
                    clean_exit = True
                    return
                future, kwargs = job
                if future.set_running_or_notify_cancel():
                    try:
                        self._run_job(future, kwargs)
                    except BaseException:  # noqa: B036 -- a SystemExit & co. from the job: end this worker
                        logger.exception("sandbox pool worker %s-%d hit a fatal error", self.name, index)
                        return  # the finally below starts a replacement
        finally:
            if not clean_exit:
                self._replace(index)

    def _run_job(self, future: Future, kwargs: dict) -> None:
        try:
            result = self.sandbox.run(**kwargs)
        except InfrastructureError as exc:
            self._count("infrastructure_errors")
            future.set_exception(exc)
        except BaseException as exc:  # the job fails either way; a non-Exception also ends this worker
            self._count("errors")
            future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self._count("completed", f"verdict.{result.verdict}")
            if result.verdict == INFRASTRUCTURE_ERROR:
                self._count("infrastructure_errors")
            future.set_result(result)

    def _replace(self, index: int) -> None:
        with self._lock:
            if self._closed:
                return
            logger.error("sandbox pool worker %s-%d died; starting a replacement", self.name, index)
            self._counts["workers_replaced"] += 1
            self._workers[index] = self._start_worker(index)

    def _count(self, *names: str) -> None:
        with self._lock:
            for name in names:
                self._counts[name] += 1

    # ------------------------------------------------------------------ public API

    @property
    def metrics(self) -> dict[str, int]:
        with self._lock:
            counts = dict(self._counts)
        counts.setdefault("infrastructure_errors", 0)
        counts.setdefault("workers_replaced", 0)
        return counts

    def alive_workers(self) -> int:
        with self._lock:
            return sum(t.is_alive() for t in self._workers)

    def submit(self, source: str | None = None, **kwargs) -> Future:
        """Queue one run (same arguments as Sandbox.run); returns a concurrent.futures.Future."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"sandbox pool {self.name} is closed")
            self._counts["submitted"] += 1
        self._jobs.put((future, {"source": source, **kwargs}))
        return future

    def run(self, source: str | None = None, **kwargs) -> RunResult:
        """Blocking run from any thread (not from one of this pool's own workers: that could deadlock)."""
        return self.submit(source, **kwargs).result()

    async def arun(self, source: str | None = None, **kwargs) -> RunResult:
        """Awaitable run: the event loop keeps going (e.g. model generation) while the program runs."""
        return await asyncio.wrap_future(self.submit(source, **kwargs))

    def close(self, wait: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._workers)
        for _ in workers:
            self._jobs.put(_STOP)
        if wait:
            for thread in workers:
                thread.join()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
