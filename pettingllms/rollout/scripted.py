"""A scripted policy: a real engine implementation driven by a Python function instead of a model.

Used by tests, the conformance checker's smoke run and benchmarks of the executor itself. Tokens are
characters (``ord``), so token ids are exact and decoding is lossless.
"""

from __future__ import annotations

from typing import Callable, Sequence

from pettingllms.core.types import (
    FINISH_LENGTH,
    FINISH_STOP,
    Completion,
    GenerationRequest,
    GenerationResult,
    Message,
)

Script = Callable[[str, int, GenerationRequest], str]
"""(prompt text, sample index within the request, request) -> response text."""


class CharCodec:
    """Chat codec with one token per character. The template is ``<role>: content\\n`` per message."""

    eos_token_ids = frozenset({0})

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        text = "".join(f"<{m['role']}>: {m['content']}\n" for m in messages) + "<assistant>: "
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids if t not in self.eos_token_ids)


class ScriptedEngine:
    """Answers each request by calling ``script`` once per sample. Records every call for inspection."""

    def __init__(self, script: Script, codec: CharCodec | None = None) -> None:
        self.script = script
        self.codec = codec or CharCodec()
        self.calls: list[list[GenerationRequest]] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.calls.append(list(requests))
        return [self._answer(request) for request in requests]

    def _answer(self, request: GenerationRequest) -> GenerationResult:
        prompt = self.codec.decode(request.prompt_ids)
        completions = []
        for k in range(request.n):
            text = self.script(prompt, k, request)
            ids = [ord(c) for c in text][: request.sampling.max_tokens]
            finish = FINISH_LENGTH if len(ids) < len(text) else FINISH_STOP
            ids_t = tuple(ids)
            completions.append(Completion(ids_t, (), self.codec.decode(ids_t), finish))  # a script has no logprobs
        return GenerationResult(request.request_id, tuple(completions))
