"""How the executor reaches a policy: an async batched ``generate`` plus the policy's chat codec."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, Sequence, runtime_checkable

from pettingllms.core.types import GenerationRequest, GenerationResult
from pettingllms.rollout.engine import ChatCodec, RolloutEngine


CONTINUOUS_CALLS = 256  # calls in flight to one continuous engine (a streaming rollout's episodes wait on them)


@runtime_checkable
class PolicyClient(Protocol):
    """``continuous`` (optional, default False): the engine batches concurrent calls itself, so the streaming rollout
    sends each episode's requests at once (``rollout/batcher.py``)."""

    codec: ChatCodec

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        ...


class LocalPolicyClient:
    """An engine in this process. Its blocking calls run on one thread of their own, so other policies can
    generate meanwhile, and every call reuses that thread's OpenMP team of torch threads. (With
    ``asyncio.to_thread`` successive calls land on different pool threads; each starts its own team, and idle
    teams spin against the working one on a small CPU.) An engine that batches concurrent calls itself
    (``engine.continuous``: vLLM's engine loop) gets a thread per call in flight instead: the threads only wait."""

    def __init__(self, engine: RolloutEngine, codec: ChatCodec) -> None:
        self.engine = engine
        self.codec = codec
        self.continuous = bool(getattr(engine, "continuous", False))
        self._thread = ThreadPoolExecutor(max_workers=CONTINUOUS_CALLS if self.continuous else 1,
                                          thread_name_prefix="pettingllms-engine")

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self.engine.generate, list(requests))
