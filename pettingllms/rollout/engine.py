"""The rollout engine protocol: what the executor needs from a policy's inference engine.

Implementations: ``HFEngine`` (transformers, the CPU default) and ``VLLMEngine`` (GPU). Both return the
engine's exact token ids and the sampling policy's log-probabilities; nothing is re-tokenized downstream.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from pettingllms.core.types import GenerationRequest, GenerationResult, Message


@runtime_checkable
class ChatCodec(Protocol):
    """Turns chat messages into the exact prompt token ids, and token ids back into text."""

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        """Prompt ids with the model's chat template and the generation prompt appended."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Response text, special tokens removed."""
        ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions for a batch of requests, in order. One call may hold many requests."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        ...
