"""How the executor reaches a policy: an async batched ``generate`` plus the policy's chat codec."""

from __future__ import annotations

import asyncio
from typing import Protocol, Sequence, runtime_checkable

from pettingllms.core.types import GenerationRequest, GenerationResult
from pettingllms.rollout.engine import ChatCodec, RolloutEngine


@runtime_checkable
class PolicyClient(Protocol):
    codec: ChatCodec

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        ...


class LocalPolicyClient:
    """An engine in this process. The blocking call runs in a thread so other policies can generate meanwhile."""

    def __init__(self, engine: RolloutEngine, codec: ChatCodec) -> None:
        self.engine = engine
        self.codec = codec

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return await asyncio.to_thread(self.engine.generate, list(requests))
