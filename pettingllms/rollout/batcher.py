"""Collects generation requests from many concurrent episodes and sends each policy one batched call.

Episodes are asyncio tasks. An episode asks for all requests of one stage at once and then waits. When every
live episode is waiting, the batcher flushes: per policy, the pending requests (sorted by request id, so the
batch does not depend on task scheduling) go to the policy in one call, and the policies run concurrently.

An episode that runs parts of itself concurrently (tree mode's playouts) runs them through ``gather``: each part
counts as a live participant until it ends, and the episode waits meanwhile, so a flush still waits for every
part. (Run with ``asyncio.gather``, a few parts waiting could outnumber the live episodes and flush early: the
batches' make-up then depended on thread timing, and so did their results, in the last bits.)
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Awaitable, Iterable, Mapping, Sequence

from pettingllms.core.errors import ConfigError
from pettingllms.core.part_clock import PartClock
from pettingllms.core.types import GenerationRequest, GenerationResult
from pettingllms.rollout.policy_client import PolicyClient


@dataclass
class BatcherStats:
    flushes: int = 0
    requests: int = 0
    sequences: int = 0
    calls_per_policy: dict[str, int] = field(default_factory=lambda: defaultdict(int))


GENERATE = "generate"  # the clock's part for the engine calls


class RequestBatcher:
    def __init__(self, clients: Mapping[str, PolicyClient], clock: PartClock | None = None) -> None:
        self.clients = dict(clients)
        self.stats = BatcherStats()
        self.clock = clock if clock is not None else PartClock()  # the wall time of the engine calls: GENERATE
        self._pending: list[tuple[str, GenerationRequest, asyncio.Future]] = []
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
            futures.append(future)
        self._waiting_episodes += 1
        self._changed.set()
        try:
            return list(await asyncio.gather(*futures))
        finally:
            self._waiting_episodes -= 1

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
        """Run episode coroutines to completion, flushing requests whenever all live episodes wait."""
        tasks = [asyncio.ensure_future(e) for e in episodes]
        for task in tasks:
            task.add_done_callback(lambda _: self._changed.set())
        try:
            while True:
                _raise_first_failure(tasks)
                live = sum(not t.done() for t in tasks)
                if live == 0:
                    break
                live += self._parts
                if self._pending and self._waiting_episodes >= live:
                    await self._flush()
                    continue
                self._changed.clear()
                await self._changed.wait()
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [t.result() for t in tasks]

    async def _flush(self) -> None:
        pending, self._pending = self._pending, []
        by_policy: dict[str, list[tuple[GenerationRequest, asyncio.Future]]] = defaultdict(list)
        for policy, request, future in pending:
            by_policy[policy].append((request, future))
        batches = {p: sorted(items, key=lambda item: item[0].request_id) for p, items in sorted(by_policy.items())}
        with self.clock.part(GENERATE):  # policies run concurrently: their calls' wall time, once
            outputs = await asyncio.gather(*(self._call(p, [r for r, _ in items]) for p, items in batches.items()))
        self.stats.flushes += 1
        for (policy, items), results in zip(batches.items(), outputs):
            self.stats.calls_per_policy[policy] += 1
            for (request, future), result in zip(items, results):
                self.stats.requests += 1
                self.stats.sequences += request.n
                future.set_result(result)

    async def _call(self, policy: str, requests: list[GenerationRequest]) -> list[GenerationResult]:
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
