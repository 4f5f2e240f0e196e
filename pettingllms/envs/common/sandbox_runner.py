"""Bounded, optionally cached sandbox runs for the envs (code, math and the games' tool agent).

- Every program runs in ``pettingllms.sandbox`` through a ``SandboxPool``, so the number of concurrent programs
  is bounded however many env steps run in the rollout executor's worker threads. The pool is the runner's own
  (closed by ``close``), or with ``shared_pool`` one pool per process and (name, workers), shared by every
  runner that asks for it (the game envs: many env objects, one bound).
- Results are cached by (program, stdin) unless ``cache_size`` is 0. The executor re-steps a stage's chosen
  actions, and K branches often share code or tests; the cache makes those repeats free and keeps ``step``
  deterministic for programs whose output would otherwise vary between runs.
- A sandbox failure propagates as ``InfrastructureError``: it is never turned into a failed test or a reward.
- ``reference=True`` runs trusted reference programs (golden solutions) in ``reference_sandbox``: a pool of their
  own, with uids of their own, never beside or after a model's program under one uid.
- The first runner of a process that finds the sandbox on its fallback layer logs one warning naming what the
  fallback leaves open (docs/sandbox.md, "What is covered").
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Sequence

from pettingllms.sandbox import FALLBACK, Limits, RunResult, Sandbox, SandboxPool, default_sandbox, reference_sandbox
from pettingllms.sandbox.judge import TestReport, judge_case

logger = logging.getLogger("pettingllms.envs")

CACHEABLE_OUTPUT_CHARS = 1 << 16  # bigger outputs are not kept in memory

_shared_pools: dict[tuple[str, int, bool], SandboxPool] = {}
_shared_pools_lock = threading.Lock()
_fallback_warned = threading.Event()

FALLBACK_WARNING = (
    "sandbox: model-written programs run on the fallback layer (bubblewrap does not work here; see the warning "
    "of logger pettingllms.sandbox for why). Open there and closed by the strong layer: a program can read every "
    "world-readable file of this machine and see every process; where the kernel refuses the fallback's "
    "namespaces, also fill the disk through its work dir, reach host unix sockets and leave POSIX message queues "
    "behind. See docs/sandbox.md, "
    "'What is covered'; install bubblewrap (scripts/install_system_deps.sh) to close them."
)


def warn_once_if_fallback(sandbox: Sandbox) -> None:
    """One warning per process when ``sandbox`` runs on the fallback layer (probing it if needed)."""
    if not _fallback_warned.is_set() and sandbox.layer == FALLBACK:
        _fallback_warned.set()
        logger.warning(FALLBACK_WARNING)


def encodable(text: str) -> str:
    """Model text may hold lone surrogates, which cannot be written to a file: replace them (the program then
    fails or differs on its own merits, instead of crashing the env step)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


class SandboxRunner:
    """Runs programs in a lazily started sandbox pool. Safe to share between threads; pickles without the pool.

    ``runner(source, stdin)`` is ``runner.run(source, stdin)``: the shape the game envs take (any callable
    returning an object with ``stdout`` and ``verdict``, so tests can pass a fake)."""

    def __init__(self, workers: int = 4, limits: Limits | None = None, cache_size: int = 20_000, *,
                 shared_pool: bool = False, name: str = "env-sandbox", reference: bool = False) -> None:
        self.workers = workers
        self.limits = limits or Limits(wall_timeout_s=10, cpu_time_s=10, max_output_bytes=1 << 20)
        self.cache_size = cache_size
        self.shared_pool = shared_pool
        self.name = name
        self.reference = reference
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._pool: SandboxPool | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], RunResult] = OrderedDict()

    def __getstate__(self) -> dict:
        return {"workers": self.workers, "limits": self.limits, "cache_size": self.cache_size,
                "shared_pool": self.shared_pool, "name": self.name, "reference": self.reference}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({"reference": False, **state})
        self._init_runtime()

    def _new_pool(self) -> SandboxPool:
        sandbox = reference_sandbox() if self.reference else default_sandbox()
        warn_once_if_fallback(sandbox)
        return SandboxPool(max_workers=self.workers, sandbox=sandbox, name=self.name)

    def _get_pool(self) -> SandboxPool:
        if self.shared_pool:
            with _shared_pools_lock:
                key = (self.name, self.workers, self.reference)
                if key not in _shared_pools:
                    _shared_pools[key] = self._new_pool()
                return _shared_pools[key]
        with self._lock:
            if self._pool is None:
                self._pool = self._new_pool()
            return self._pool

    def _cached(self, key: tuple[str, str]) -> RunResult | None:
        if self.cache_size <= 0:
            return None
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def _remember(self, key: tuple[str, str], result: RunResult) -> None:
        if self.cache_size <= 0 or len(result.stdout) > CACHEABLE_OUTPUT_CHARS:
            return
        with self._lock:
            self._cache[key] = result
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def run(self, source: str, stdin: str = "") -> RunResult:
        key = (encodable(source), encodable(stdin))
        hit = self._cached(key)
        if hit is not None:
            return hit
        result = self._get_pool().run(key[0], stdin=key[1], limits=self.limits)
        self._remember(key, result)
        return result

    __call__ = run

    def run_many(self, source: str, stdins: Sequence[str]) -> list[RunResult]:
        """Runs concurrently in the pool (cached ones are free); results in input order."""
        source, stdins = encodable(source), [encodable(s) for s in stdins]
        pool = self._get_pool()
        futures = {}
        for stdin in dict.fromkeys(stdins):
            hit = self._cached((source, stdin))
            futures[stdin] = hit if hit is not None else pool.submit(source, stdin=stdin, limits=self.limits)
        results = {}
        for stdin, item in futures.items():
            if isinstance(item, RunResult):
                results[stdin] = item
            else:
                results[stdin] = item.result()
                self._remember((source, stdin), results[stdin])
        return [results[s] for s in stdins]

    def judge(self, source: str, tests: Sequence[tuple[str, str]]) -> TestReport:
        """Pass/fail per (stdin, expected) test, compared in this process (sandbox.judge rules)."""
        results = self.run_many(source, [stdin for stdin, _ in tests])
        cases = tuple(judge_case(i, r, expected) for i, (r, (_, expected)) in enumerate(zip(results, tests)))
        return TestReport(cases=cases, total=len(tests))

    def close(self) -> None:
        """Stop this runner's own pool; a shared pool lives as long as the process."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
