"""Bounded, cached sandbox runs for the code and math envs.

- Every program runs in ``pettingllms.sandbox`` through one ``SandboxPool`` per runner, so the number of
  concurrent programs is bounded however many env steps run in worker threads.
- Results are cached by (program, stdin, limits). The executor re-steps a stage's chosen actions, and K
  branches often share code or tests; the cache makes those repeats free and keeps ``step`` deterministic for
  programs whose output would otherwise vary between runs.
- A sandbox failure propagates as ``InfrastructureError``: it is never turned into a failed test.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

from pettingllms.sandbox import Limits, RunResult, SandboxPool
from pettingllms.sandbox.judge import TestReport, judge_case

CACHEABLE_OUTPUT_CHARS = 1 << 16  # bigger outputs are not kept in memory


def encodable(text: str) -> str:
    """Model text may hold lone surrogates, which cannot be written to a file: replace them (the program then
    fails or differs on its own merits, instead of crashing the env step)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


class CachedRunner:
    """Runs programs in a lazily started sandbox pool. Safe to share between threads; pickles without the pool."""

    def __init__(self, workers: int = 4, limits: Limits | None = None, cache_size: int = 20_000) -> None:
        self.workers = workers
        self.limits = limits or Limits(wall_timeout_s=10, cpu_time_s=10, max_output_bytes=1 << 20)
        self.cache_size = cache_size
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._pool: SandboxPool | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], RunResult] = OrderedDict()

    def __getstate__(self) -> dict:
        return {"workers": self.workers, "limits": self.limits, "cache_size": self.cache_size}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def _get_pool(self) -> SandboxPool:
        with self._lock:
            if self._pool is None:
                self._pool = SandboxPool(max_workers=self.workers, name="env-sandbox")
            return self._pool

    def run(self, source: str, stdin: str = "") -> RunResult:
        source, stdin = encodable(source), encodable(stdin)
        key = (source, stdin)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        result = self._get_pool().run(source, stdin=stdin, limits=self.limits)
        if len(result.stdout) <= CACHEABLE_OUTPUT_CHARS:
            with self._lock:
                self._cache[key] = result
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return result

    def run_many(self, source: str, stdins: Sequence[str]) -> list[RunResult]:
        """Runs concurrently in the pool (cached ones are free); results in input order."""
        source, stdins = encodable(source), [encodable(s) for s in stdins]
        pool = self._get_pool()
        futures = {}
        for stdin in dict.fromkeys(stdins):
            with self._lock:
                hit = self._cache.get((source, stdin))
            futures[stdin] = hit if hit is not None else pool.submit(source, stdin=stdin, limits=self.limits)
        results = {}
        for stdin, item in futures.items():
            result = item if isinstance(item, RunResult) else item.result()
            if not isinstance(item, RunResult) and len(result.stdout) <= CACHEABLE_OUTPUT_CHARS:
                with self._lock:
                    self._cache[(source, stdin)] = result
                    while len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
            results[stdin] = result
        return [results[s] for s in stdins]

    def judge(self, source: str, tests: Sequence[tuple[str, str]]) -> TestReport:
        """Pass/fail per (stdin, expected) test, compared in this process (sandbox.judge rules)."""
        results = self.run_many(source, [stdin for stdin, _ in tests])
        cases = tuple(judge_case(i, r, expected) for i, (r, (_, expected)) in enumerate(zip(results, tests)))
        return TestReport(cases=cases, total=len(tests))

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
