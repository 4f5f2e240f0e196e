"""Continuous batching over one vLLM ``LLM`` for concurrent callers (the streaming rollout's vLLM side).

vLLM's offline ``LLM.generate`` adds its requests, then steps the engine until *every* unfinished request is done: a
call lasts as long as its slowest sample, and two calls cannot share the engine. ``EngineLoop`` instead adds each
caller's requests with ``LLM.enqueue`` (vLLM's own rendering, LoRA resolution and request ids) and steps the engine
(``llm.llm_engine.step()``) in a thread of its own. Requests that arrive while others generate join the running batch
at the next step, and each caller is answered as soon as its own requests finish.

The engine's lock (``VLLMEngine._lock``) is held for each enqueue and each step, never across steps, so weight syncs,
sleep and adapter changes (which take the same lock) wait for at most one step; the trainer makes them between
rollouts, when nothing is in flight.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


class EngineStepFailed(RuntimeError):
    """An engine step failed while a caller's requests were in it. Every request in flight shares the step, so the
    request that failed it may be another caller's (``retry_after_step_failure``)."""


def retry_after_step_failure(run: Callable[[], T], retries: threading.Lock) -> T:
    """``run()``, and once more if an engine step failed under it (``EngineStepFailed``), holding ``retries`` so that
    no two callers' retries share a step: a request that fails every step it is in then fails its own retry alone,
    and the others' retries succeed. A barrier's ``generate`` gets the same from ``run_or_retry_one_by_one``."""
    try:
        return run()
    except EngineStepFailed:
        with retries:
            return run()


class _Waiter:
    """One caller's requests: their outputs by position, and an event set once all are in (or one failed)."""

    def __init__(self, count: int) -> None:
        self.outputs: list[Any] = [None] * count
        self.missing = count
        self.error: BaseException | None = None
        self.done = threading.Event()

    def put(self, position: int, output: Any) -> None:
        self.outputs[position] = output
        self.missing -= 1
        if self.missing == 0:
            self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class EngineLoop:
    """Steps ``llm``'s engine while any caller waits; ``run`` adds requests and returns their final outputs."""

    def __init__(self, llm: Any, lock: threading.Lock, name: str = "pettingllms-vllm-loop") -> None:
        self._llm = llm
        self._lock = lock
        self._changed = threading.Condition()  # guards _waiting and _stopped
        # the request id vLLM answers with -> (caller, position, the id vLLM gave it: what an abort names)
        self._waiting: dict[str, tuple[_Waiter, int, str]] = {}
        self._stopped = False
        self.steps = 0  # engine steps taken (for tests and metrics)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def run(self, prompts: Sequence[Any], params: Sequence[Any], lora_requests: Sequence[Any] | None) -> list[Any]:
        """vLLM ``RequestOutput``s of these prompts, in order, once all of them finished."""
        waiter = _Waiter(len(prompts))
        if not prompts:
            return []
        with self._lock:
            with self._changed:
                if self._stopped:
                    raise RuntimeError("the vLLM engine loop is closed")
            ids = self._llm.enqueue(list(prompts), list(params), lora_request=lora_requests, use_tqdm=False)
            with self._changed:
                if self._stopped:  # closed while these were added: the loop will not step them
                    self._llm.llm_engine.abort_request([str(i) for i in ids], internal=True)
                    raise RuntimeError("the vLLM engine loop was closed while requests were added")
                for position, request_id in enumerate(ids):
                    self._waiting[answer_id(request_id)] = (waiter, position, str(request_id))
                self._changed.notify()
        waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error
        return waiter.outputs

    def close(self) -> None:
        """Stop the thread; callers still waiting get an error."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join(timeout=60)

    # ---- the loop thread ----
    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self._waiting and not self._stopped:
                    self._changed.wait()
                if self._stopped:
                    self._fail_all(RuntimeError("the vLLM engine loop was closed while requests were in flight"))
                    return
            try:
                # Step, hand out what finished and look for what vLLM lost, all under the engine's lock: a caller
                # enqueueing between the step and the check would otherwise be taken for lost.
                with self._lock:
                    outputs = self._llm.llm_engine.step()
                    self.steps += 1
                    for output in outputs:
                        if output.finished:
                            with self._changed:
                                entry = self._waiting.pop(str(output.request_id), None)
                            if entry is not None:
                                entry[0].put(entry[1], output)
                    if not self._llm.llm_engine.has_unfinished_requests():
                        with self._changed:
                            lost = sorted(self._waiting)
                        if lost:  # vLLM has nothing left, yet callers wait: never hang on them
                            self._fail_all(RuntimeError(f"vLLM finished without answering requests {lost[:5]}"))
            except Exception as error:  # the engine failed: every caller in flight hears it, later calls may retry
                logger.exception("a vLLM engine step failed; failing the %d requests in flight", len(self._waiting))
                failed = EngineStepFailed(f"a vLLM engine step failed: {type(error).__name__}: {error}")
                failed.__cause__ = error
                self._abort(self._fail_all(failed))

    def _fail_all(self, error: BaseException) -> list[str]:
        """Fail every waiting caller; the ids vLLM gave their requests."""
        with self._changed:
            waiting, self._waiting = self._waiting, {}
        for waiter, _, _ in waiting.values():
            waiter.fail(error)
        return [engine_id for _, _, engine_id in waiting.values()]

    def _abort(self, engine_ids: list[str]) -> None:
        """Drop failed requests from vLLM, so their steps do not go on for nobody (best effort: it may be dead)."""
        try:
            with self._lock:
                self._llm.llm_engine.abort_request(engine_ids, internal=True)
        except Exception:
            logger.warning("could not abort %d failed vLLM requests", len(engine_ids), exc_info=True)


def answer_id(request_id: str) -> str:
    """The id vLLM's outputs carry for a request ``LLM.enqueue`` returned: the id without the random suffix that
    vLLM's input processor adds internally (``<id>-<8 characters>``)."""
    head, sep, tail = str(request_id).rpartition("-")
    return head if sep and len(tail) == 8 else str(request_id)
