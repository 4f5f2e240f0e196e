"""Collects generation requests from many concurrent episodes and sends them to their policies in batched calls.

Episodes are asyncio tasks. An episode asks for all requests of one stage at once and then waits. Two ways to send:

- **Barrier** (the default; reproducible): when every live episode is waiting, the batcher flushes: per policy, the
  pending requests (sorted by request id, so the batch does not depend on task scheduling) go to the policy in one
  call, and the policies run concurrently. A stage lasts as long as its slowest sample and its slowest env step.
- **Streaming** (``streaming=True``): each policy is fed on its own, without waiting for the other episodes. An
  engine that batches continuously (``client.continuous``: vLLM's engine loop) gets each episode's requests the
  moment they are asked for; any other engine (transformers) gets, whenever it is free, everything pending for it,
  after waiting up to ``wait_s`` for more to arrive (or less, once every live episode waits). Which requests share a
  batch then depends on timing, so runs are not bit-reproducible; grouping, trees and every sample's ids and
  logprobs are as in barrier mode.

An episode that runs parts of itself concurrently (tree mode's playouts) runs them through ``gather``: each part
counts as a live participant until it ends, and the episode waits meanwhile, so a flush still waits for every
part. (Run with ``asyncio.gather``, a few parts waiting could outnumber the live episodes and flush early: the
batches' make-up then depended on thread timing, and so did their results, in the last bits.)
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Awaitable, Iterable, Mapping, Sequence

from pettingllms.core.errors import ConfigError
from pettingllms.core.part_clock import PartClock
from pettingllms.core.types import GenerationRequest, GenerationResult
from pettingllms.rollout.policy_client import PolicyClient


@dataclass
class BatcherStats:
    calls: int = 0  # engine calls (a barrier flush calls each policy that has requests once)
    requests: int = 0
    sequences: int = 0
    calls_per_policy: dict[str, int] = field(default_factory=lambda: defaultdict(int))


GENERATE = "generate"  # the clock's part for the engine calls


@dataclass
class _Ticket:
    """One ``generate_many`` call's futures still unanswered; the caller stops counting as waiting when they are all
    answered (at delivery, not when its task next runs: a send deciding meanwhile must not count it as waiting)."""

    remaining: int
    released: bool = False


class RequestBatcher:
    def __init__(self, clients: Mapping[str, PolicyClient], clock: PartClock | None = None, *,
                 streaming: bool = False, wait_s: float = 0.0) -> None:
        if wait_s < 0:
            raise ConfigError(f"rollout.streaming_wait_s must be >= 0, got {wait_s}")
        self.clients = dict(clients)
        self.streaming = bool(streaming)
        self.wait_s = float(wait_s)
        self.stats = BatcherStats()
        self.clock = clock if clock is not None else PartClock()  # the wall time of the engine calls: GENERATE
        self.busy = PartClock()  # per policy: the wall time during which it had a call in flight
        # A policy over several engines (runtime/dispatch.py) times each engine itself: its totals at this start.
        self._engines_at_start = {policy: list(client.engine_busy_seconds()) for policy, client in self.clients.items()
                                  if hasattr(client, "engine_busy_seconds")}
        self._pending: list[tuple[str, GenerationRequest, asyncio.Future]] = []
        self._first_pending: dict[str, float] = {}  # streaming: policy -> when its oldest pending request came
        self._in_flight: dict[str, int] = defaultdict(int)  # streaming: policy -> calls in flight
        self._sends: set[asyncio.Task] = set()
        self._tickets: dict[asyncio.Future, _Ticket] = {}  # each pending future -> its generate_many call
        self._waiting_episodes = 0  # participants waiting for results (an episode waiting on its parts counts)
        self._parts = 0  # live participants beside the episode tasks: the running parts of ``gather``
        self._changed = asyncio.Event()

    async def generate_many(self, requests: Sequence[tuple[str, GenerationRequest]]) -> list[GenerationResult]:
        """Submit (policy, request) pairs of one episode and wait for all of their results, in order."""
        loop = asyncio.get_running_loop()
        futures = []
        for policy, request in requests:
            if policy not in self.clients:
                raise ConfigError(f"no policy named {policy!r}; known policies: {sorted(self.clients)}")
            future = loop.create_future()
            self._pending.append((policy, request, future))
            self._first_pending.setdefault(policy, time.monotonic())
            futures.append(future)
        ticket = _Ticket(len(futures))
        for future in futures:
            self._tickets[future] = ticket
        self._waiting_episodes += 1
        self._changed.set()
        try:
            return list(await asyncio.gather(*futures))
        finally:
            for future in futures:
                self._tickets.pop(future, None)
            self._release(ticket)

    async def gather(self, parts: Iterable[Awaitable]) -> list:
        """Run parts of one episode concurrently (its playouts), each a participant of the flush rule until it ends;
        results in order. The calling episode counts as waiting until its last part ends (then it is live again, about
        to ask for more: no flush may leave it out). Every part runs to its end; the first failure is raised then."""
        parts = list(parts)
        if not parts:
            return []
        running = [len(parts)]

        async def part(awaitable: Awaitable):
            try:
                return await awaitable
            finally:
                self._parts -= 1
                running[0] -= 1
                if running[0] == 0:
                    self._waiting_episodes -= 1  # the caller resumes next: live, not waiting
                self._changed.set()

        self._parts += len(parts)
        self._waiting_episodes += 1
        self._changed.set()
        results = await asyncio.gather(*(part(a) for a in parts), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed
        return list(results)

    async def run(self, episodes: Iterable[Awaitable]) -> list:
        """Run episode coroutines to completion, sending requests by the barrier or streaming rule."""
        tasks = [asyncio.ensure_future(e) for e in episodes]
        for task in tasks:
            task.add_done_callback(lambda _: self._changed.set())
        try:
            while True:
                _raise_first_failure(tasks)
                live = sum(not t.done() for t in tasks)
                if live == 0:
                    break
                all_waiting = self._waiting_episodes >= live + self._parts
                timeout = None
                if self.streaming:
                    timeout = self._send_ready(all_waiting)
                elif self._pending and all_waiting:
                    await self._flush()
                    continue
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout)
                except asyncio.TimeoutError:
                    pass  # a held-back batch's wait is over
        except BaseException:
            for task in [*tasks, *self._sends]:
                task.cancel()
            await asyncio.gather(*tasks, *self._sends, return_exceptions=True)
            raise
        return [t.result() for t in tasks]

    def busy_seconds(self) -> dict[str, list[float]]:
        """Per policy, per engine: the wall time during which that engine had a call in flight since this batcher
        began. A client that does not time its engines counts as one engine, busy while the policy has a call in
        flight (one call over several engines would otherwise count every engine busy while any is)."""
        out = {}
        for policy, client in self.clients.items():
            start = self._engines_at_start.get(policy)
            if start is None:
                out[policy] = [self.busy.seconds(policy)]
            else:
                out[policy] = [now - then for now, then in zip(client.engine_busy_seconds(), start)]
        return out

    # ---- streaming ----
    def _send_ready(self, all_waiting: bool) -> float | None:
        """Start a call for every policy that may take one now; the seconds until a held-back batch may go."""
        now = time.monotonic()
        next_due = None
        for policy in sorted({p for p, _, _ in self._pending}):
            continuous = bool(getattr(self.clients[policy], "continuous", False))
            if not continuous and self._in_flight[policy]:
                continue  # sent when its call returns
            due = self._first_pending[policy] + self.wait_s
            if continuous or all_waiting or now >= due:
                self._start_call(policy)
            else:
                next_due = min(due - now, next_due if next_due is not None else due - now)
        return next_due

    def _start_call(self, policy: str) -> None:
        items = sorted(((r, f) for p, r, f in self._pending if p == policy), key=lambda item: item[0].request_id)
        self._pending = [entry for entry in self._pending if entry[0] != policy]
        del self._first_pending[policy]
        self._in_flight[policy] += 1
        task = asyncio.ensure_future(self._stream_call(policy, items))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _stream_call(self, policy: str, items: list[tuple[GenerationRequest, asyncio.Future]]) -> None:
        try:
            with self.clock.part(GENERATE):
                results = await self._call(policy, [r for r, _ in items])
            self._deliver(policy, items, results)
        except BaseException as error:  # the episodes waiting on it fail with it, and so does the rollout
            for _, future in items:
                if not future.done():
                    future.set_exception(error)
                self._answered(future)
            if not isinstance(error, Exception):
                raise
        finally:
            self._in_flight[policy] -= 1
            self._changed.set()  # after delivery: the run loop sees the answered episodes as no longer waiting

    # ---- barrier ----

    async def _flush(self) -> None:
        pending, self._pending = self._pending, []
        self._first_pending.clear()
        by_policy: dict[str, list[tuple[GenerationRequest, asyncio.Future]]] = defaultdict(list)
        for policy, request, future in pending:
            by_policy[policy].append((request, future))
        batches = {p: sorted(items, key=lambda item: item[0].request_id) for p, items in sorted(by_policy.items())}
        with self.clock.part(GENERATE):  # policies run concurrently: their calls' wall time, once
            outputs = await asyncio.gather(*(self._call(p, [r for r, _ in items]) for p, items in batches.items()))
        for (policy, items), results in zip(batches.items(), outputs):
            self._deliver(policy, items, results)

    def _deliver(self, policy: str, items: list[tuple[GenerationRequest, asyncio.Future]],
                 results: list[GenerationResult]) -> None:
        self.stats.calls += 1
        self.stats.calls_per_policy[policy] += 1
        for (request, future), result in zip(items, results):
            self.stats.requests += 1
            self.stats.sequences += request.n
            if not future.done():  # a cancelled episode's future stays cancelled
                future.set_result(result)
            self._answered(future)

    def _answered(self, future: asyncio.Future) -> None:
        ticket = self._tickets.pop(future, None)
        if ticket is not None:
            ticket.remaining -= 1
            if ticket.remaining == 0:
                self._release(ticket)

    def _release(self, ticket: _Ticket) -> None:
        if not ticket.released:
            ticket.released = True
            self._waiting_episodes -= 1

    async def _call(self, policy: str, requests: list[GenerationRequest]) -> list[GenerationResult]:
        with self.busy.part(policy):
            results = await self.clients[policy].generate(requests)
        if len(results) != len(requests):
            raise RuntimeError(f"policy {policy!r} returned {len(results)} results for {len(requests)} requests")
        for request, result in zip(requests, results):
            if result.request_id != request.request_id or len(result.completions) != request.n:
                raise RuntimeError(
                    f"policy {policy!r} answered request {request.request_id!r} (n={request.n}) with "
                    f"{result.request_id!r} and {len(result.completions)} completions"
                )
        return results


def _raise_first_failure(tasks: Sequence[asyncio.Future]) -> None:
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()
