"""Spreading one policy's generation requests over its engines (every GPU generates).

The request batcher (``rollout/batcher.py``) sends each policy one batched call per flush; a policy with E
engines (``layout.num_engines``) splits that call here:

- a request is never split: its ``n`` samples are the K branches of one tree node and share the prompt's KV
  blocks (vLLM's ``n`` and prefix cache), so they stay on one engine;
- requests of one episode (``GenerationRequest.prefix_group``) go to one engine as a unit, preferably the engine
  its group name hashes to, so every turn of an episode lands on the same engine and reuses its prefix cache;
- units are dealt longest first, each to its preferred engine while that engine stays under 1.25x the mean load,
  else to the least-loaded engine (cost = n x (prompt + max_tokens) tokens). The assignment is a pure function of
  the call's requests (no state between calls), so a resumed run spreads its requests exactly as the original.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any, Callable, Sequence

from pettingllms.core import GenerationRequest, GenerationResult
from pettingllms.core.part_clock import PartClock

STICKY_SLACK = 1.25  # a unit goes to its preferred engine while that engine's load stays under 1.25x the mean


def request_cost(request: GenerationRequest) -> int:
    """Tokens an engine processes for a request at most: n x (prompt + max_tokens)."""
    return request.n * (len(request.prompt_ids) + request.sampling.max_tokens)


def assign_requests(requests: Sequence[GenerationRequest], num_engines: int) -> list[list[int]]:
    """Request indices per engine (each list in request order)."""
    if num_engines < 1:
        raise ValueError(f"num_engines must be >= 1, got {num_engines}")
    units: dict[str, list[int]] = {}
    for index, request in enumerate(requests):
        key = request.prefix_group if request.prefix_group is not None else f"request:{request.request_id}"
        units.setdefault(key, []).append(index)
    costs = {key: sum(request_cost(requests[i]) for i in members) for key, members in units.items()}
    cap = STICKY_SLACK * sum(costs.values()) / num_engines
    loads = [0] * num_engines
    out: list[list[int]] = [[] for _ in range(num_engines)]
    for key in sorted(units, key=lambda k: (-costs[k], units[k][0])):
        preferred = zlib.crc32(key.encode()) % num_engines
        if loads[preferred] + costs[key] <= max(cap, costs[key]):
            engine = preferred
        else:
            engine = min(range(num_engines), key=lambda e: (loads[e], e))
        out[engine].extend(units[key])
        loads[engine] += costs[key]
    return [sorted(indices) for indices in out]


class EngineSetClient:
    """A policy's client over its E engine hosts: splits each call with ``assign_requests``, runs the parts
    concurrently, and returns the results in request order.

    call: ``(engine index, requests) -> awaitable list of results`` (a Ray actor call, or a local engine).
    """

    def __init__(self, num_engines: int, call: Callable[[int, list[GenerationRequest]], Any], codec: Any,
                 continuous: bool = False) -> None:
        self.num_engines = num_engines
        self._call = call
        self.codec = codec
        self.continuous = continuous  # the engines batch concurrent calls themselves (see PolicyClient)
        self.requests_per_engine = [0] * num_engines  # counters, for metrics and tests
        self._busy = PartClock()  # per engine: the wall time during which it had a call in flight, since start

    def engine_busy_seconds(self) -> list[float]:
        """Per engine, the wall time during which it had a call in flight, summed since this client was made (a
        rollout reads its own share as the difference between its end and its start)."""
        return [self._busy.seconds(str(engine)) for engine in range(self.num_engines)]

    async def _timed_call(self, engine: int, requests: list[GenerationRequest]) -> Any:
        with self._busy.part(str(engine)):
            return await self._call(engine, requests)

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        requests = list(requests)
        parts = assign_requests(requests, self.num_engines)
        busy = [(engine, indices) for engine, indices in enumerate(parts) if indices]
        outputs = await asyncio.gather(*(self._timed_call(engine, [requests[i] for i in indices])
                                         for engine, indices in busy))
        results: list[GenerationResult | None] = [None] * len(requests)
        for (engine, indices), answers in zip(busy, outputs):
            if len(answers) != len(indices):
                raise RuntimeError(f"engine {engine} returned {len(answers)} results for {len(indices)} requests")
            self.requests_per_engine[engine] += len(indices)
            for index, answer in zip(indices, answers):
                results[index] = answer
        return results  # type: ignore[return-value]
