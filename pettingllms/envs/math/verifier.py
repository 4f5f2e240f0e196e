"""Answer equivalence with math-verify, under our own timeout.

math-verify's built-in timeouts use ``signal.alarm``, which fails outside a process's main thread, and env
steps run in worker threads (``asyncio.to_thread``). So every check runs in a small pool of *processes* with
math-verify's timeouts off, and the caller waits at most ``timeout_s``. A check that overruns counts as "not
equivalent" (math-verify's own convention for its timeouts: the model wrote something pathological) and the
pool is restarted so the stuck worker is gone. A pool that breaks for another reason is an
``InfrastructureError``, never a wrong answer.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import threading
from collections import OrderedDict

from pettingllms.core.errors import InfrastructureError

logger = logging.getLogger(__name__)
MAX_ANSWER_CHARS = 2_000  # longer "answers" are not answers; refuse them before they reach sympy


def _quiet_worker() -> None:
    # math-verify warns on every call with timeouts off; we bound the call ourselves.
    for name in ("math_verify", "math_verify.parser", "math_verify.grader", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _verify_worker(gold: str, answer: str) -> bool:
    from math_verify import parse, verify

    gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=None)
    answer_parsed = parse("\\boxed{" + answer + "}", parsing_timeout=None)
    if not gold_parsed or not answer_parsed:
        return False
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=None))


def normalise(text: str) -> str:
    return "".join(text.split()).strip("$").rstrip(".")


class MathVerifier:
    """``equivalent(gold, answer)``: math-verify equivalence of two answer strings (\\boxed{} contents)."""

    def __init__(self, workers: int = 2, timeout_s: float = 10.0, cache_size: int = 100_000) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self._lock = threading.Lock()
        self._pool: cf.ProcessPoolExecutor | None = None
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self.timeouts = 0

    def equivalent(self, gold: str | None, answer: str | None) -> bool:
        if not gold or not answer or not isinstance(gold, str) or not isinstance(answer, str):
            return False
        if len(answer) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
            return False
        if normalise(gold) == normalise(answer):
            return True  # the common case needs no sympy
        key = (gold, answer)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        verdict, final = self._check(gold, answer)
        if not final:
            return verdict  # a timeout may be the machine's fault (load, a cold worker): never cache it
        with self._lock:
            self._cache[key] = verdict
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return verdict

    def _check(self, gold: str, answer: str) -> tuple[bool, bool]:
        """(equivalent, final): final is False for a timeout verdict."""
        for attempt in range(2):
            pool = self._get_pool()
            try:
                future = pool.submit(_verify_worker, gold, answer)
            except (cf.process.BrokenProcessPool, RuntimeError):
                self._restart(pool)
                continue
            try:
                return future.result(timeout=self.timeout_s), True
            except cf.TimeoutError:
                self.timeouts += 1
                logger.warning("math-verify took over %.1fs on %r vs %r; counted as not equivalent",
                               self.timeout_s, gold[:80], answer[:80])
                self._restart(pool)
                return False, False
            except cf.process.BrokenProcessPool:
                self._restart(pool)  # another thread's timeout may have restarted it under us: retry once
            except Exception as exc:  # math-verify raised on odd input: that input is not an equivalent answer
                logger.debug("math-verify raised %r on %r vs %r", exc, gold[:80], answer[:80])
                return False, True
        raise InfrastructureError("the math-verify process pool failed twice in a row")

    def _get_pool(self) -> cf.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn: forking a process that holds torch/Ray threads is unsafe
                context = multiprocessing.get_context("spawn")
                self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=context, initializer=_quiet_worker)
            return self._pool

    def _restart(self, pool: cf.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        # The stuck worker never returns by itself; kill it (no public API for this in concurrent.futures).
        # A pool another thread already shut down has _processes = None.
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


_shared: MathVerifier | None = None
_shared_lock = threading.Lock()


def shared_verifier() -> MathVerifier:
    """One verifier per process, shared by every env instance (it holds processes, not episode state)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MathVerifier()
        return _shared
