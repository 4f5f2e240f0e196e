"""``OpenAICompletionsEngine``: the RolloutEngine protocol over an OpenAI-compatible ``/v1/completions`` server.

For evaluating a model served elsewhere (vLLM, sglang, any server speaking the legacy completions API). It is
**eval-only**: training needs the sampling policy's exact token ids and log-probabilities for every response,
which only some servers return, and weight updates never reach a remote server.

One request per ``GenerationRequest``, all of a batch in flight together (``max_concurrency``):

    POST <base_url>/completions
    {"model": <served name>, "prompt": <prompt token ids, or the decoded prompt text>, "n": n,
     "temperature": T, "top_p": p, "max_tokens": m, "logprobs": 1,
     # vllm_extras (vLLM and sglang accept them; strict servers reject unknown fields):
     "top_k": k or -1, "return_token_ids": true, "return_tokens_as_token_ids": true}

Sampling settings are always sent explicitly (``top_k=-1`` means off), so no server-side default (a model's
generation_config, for example) changes them silently; a strict server cannot take ``top_k``, so there a
request with top-k is refused rather than sampled differently.

Response token ids, best source first:
1. ``choices[i].token_ids`` (vLLM ``return_token_ids``);
2. ``logprobs.tokens`` spelled ``token_id:<id>`` (vLLM ``return_tokens_as_token_ids``, per request or as the
   server flag ``--return-tokens-as-token-ids``);
3. otherwise the text is re-tokenized with the local tokenizer, and a ``stop`` finish gets the tokenizer's eos
   id appended (the HF engine records the eos token it stopped on). Such ids are approximate.
``stats`` counts which source was used. Log-probabilities are kept only when they align with exact ids.

Failures: connection errors, 429 and 5xx are retried ``max_retries`` times with backoff; a request that still
fails, or gets another 4xx, yields ``finish_reason="error"`` completions (masked everywhere downstream) and is
logged. ``check_server`` surfaces a wrong URL, model name or unsupported field before an evaluation starts.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import httpx

from pettingllms.core.choices import PromptFormat
from pettingllms.core.errors import ConfigError
from pettingllms.core.types import (
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_STOP,
    Completion,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from pettingllms.rollout.local_engine import failed_completions

logger = logging.getLogger(__name__)

PROMPT_FORMATS = PromptFormat.values()
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
_FINISH = {"stop": FINISH_STOP, "length": FINISH_LENGTH}


class ServerError(Exception):
    """A request the server did not answer with completions (after retries)."""


@dataclass
class EngineStats:
    requests: int = 0
    failed_requests: int = 0
    exact_token_ids: int = 0  # completions whose ids came from the server
    retokenized: int = 0  # completions whose ids were re-tokenized from text
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "failed_requests": self.failed_requests,
                "exact_token_ids": self.exact_token_ids, "retokenized": self.retokenized}


class OpenAICompletionsEngine:
    """RolloutEngine over an OpenAI-compatible completions server.

    base_url: the API root, e.g. ``http://host:8000/v1`` (``/completions`` is appended).
    model: the served model name.
    tokenizer: the served model's Hugging Face tokenizer (same vocabulary): decodes prompts in ``text`` mode and
        re-tokenizes responses when the server returns no ids.
    eos_token_id: appended to re-tokenized responses that finished with ``stop``.
    transport: an ``httpx`` transport (tests); default: real HTTP.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer,
        eos_token_id: int,
        *,
        api_key: str | None = None,
        prompt_format: str = "ids",
        vllm_extras: bool = True,
        timeout_s: float = 600.0,
        max_concurrency: int = 32,
        max_retries: int = 2,
        retry_backoff_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not re.match(r"^https?://", base_url or ""):
            raise ConfigError(f"model.server_url must start with http:// or https://, got {base_url!r}")
        if prompt_format not in PROMPT_FORMATS:
            raise ConfigError(f"model.prompt_format must be one of {PROMPT_FORMATS}, got {prompt_format!r}")
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ConfigError(
                f"server settings need max_concurrency >= 1, max_retries >= 0 and a positive timeout; got "
                f"{max_concurrency}, {max_retries}, {timeout_s}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_id = int(eos_token_id)
        self.prompt_format = prompt_format
        self.vllm_extras = vllm_extras
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s, limits=limits,
                                   transport=transport)
        self.stats = EngineStats()

    # ---- the RolloutEngine protocol ----

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Completions for every request, in request order; all requests are in flight together."""
        requests = list(requests)
        if len(requests) <= 1:
            return [self._generate_one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
            return list(pool.map(self._generate_one, requests))

    def close(self) -> None:
        self.client.close()

    # ---- start-up check ----

    def check_server(self) -> None:
        """Fail early, naming the problem: unreachable server, unknown model name, or a refused request."""
        try:
            response = self.client.get("/models")
        except httpx.HTTPError as exc:
            raise ConfigError(f"cannot reach the server at {self.base_url}: {type(exc).__name__}: {exc}. "
                              "Check model.server_url (it includes /v1) and that the server is up.") from exc
        if response.status_code == 200:
            served = [m.get("id") for m in response.json().get("data", []) if isinstance(m, Mapping)]
            if served and self.model not in served:
                raise ConfigError(f"the server at {self.base_url} serves {served}, not {self.model!r}; "
                                  "set model.served_name to one of them")
        probe = GenerationRequest("probe", (self.eos_token_id,), 1, SamplingParams(temperature=0.0, max_tokens=1))
        try:
            self._post(self._body(probe))
        except ServerError as exc:
            hint = " With a strict OpenAI server set model.vllm_extras=false." if self.vllm_extras else ""
            raise ConfigError(f"the server at {self.base_url} refused a one-token probe request: {exc}.{hint}") from exc

    # ---- one request ----

    def _generate_one(self, request: GenerationRequest) -> GenerationResult:
        try:
            if not self.vllm_extras and request.sampling.top_k > 0:
                raise ServerError(f"top_k={request.sampling.top_k} needs model.vllm_extras=true (the OpenAI "
                                  "completions API has no top_k)")
            completions = self._parse(self._post(self._body(request)), request)
            self.stats.add(requests=1)
        except ServerError as exc:
            logger.error("request %s failed: %s; its %d samples are marked failed", request.request_id, exc, request.n)
            self.stats.add(requests=1, failed_requests=1)
            completions = failed_completions(request.n)
        return GenerationResult(request.request_id, tuple(completions))

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        s = request.sampling
        if request.adapter is not None:
            raise ConfigError(f"request {request.request_id} asks for LoRA adapter {request.adapter!r}; the server "
                              "client serves one model (evaluate adapters locally, or serve them as their own model)")
        prompt: Any = list(request.prompt_ids)
        if self.prompt_format == "text":
            prompt = self.tokenizer.decode(prompt, skip_special_tokens=False)
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "n": request.n, "temperature": s.temperature,
                                "top_p": s.top_p, "max_tokens": s.max_tokens, "logprobs": 1, "stream": False}
        if self.vllm_extras:
            body.update(top_k=s.top_k if s.top_k > 0 else -1, return_token_ids=True, return_tokens_as_token_ids=True)
        return body

    def _post(self, body: Mapping[str, Any]) -> dict[str, Any]:
        problem = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            try:
                response = self.client.post("/completions", json=body)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code == 200:
                try:
                    return response.json()
                except ValueError as exc:
                    raise ServerError(f"the server answered with invalid JSON: {exc}") from exc
            problem = f"HTTP {response.status_code}: {response.text[:500]}"
            if response.status_code not in _RETRY_STATUS:
                break
        raise ServerError(problem)

    def _parse(self, payload: Mapping[str, Any], request: GenerationRequest) -> list[Completion]:
        choices = payload.get("choices")
        if not isinstance(choices, list) or len(choices) != request.n:
            count = len(choices) if isinstance(choices, list) else "no"
            raise ServerError(f"expected {request.n} choices, got {count}")
        choices = sorted(choices, key=lambda c: c.get("index", 0))
        return [self._completion(choice) for choice in choices]

    def _completion(self, choice: Mapping[str, Any]) -> Completion:
        text = choice.get("text") or ""
        finish = _FINISH.get(choice.get("finish_reason"), FINISH_ERROR)
        logprobs = choice.get("logprobs") or {}
        ids = server_token_ids(choice)
        if ids is not None:
            self.stats.add(exact_token_ids=1)
            values = logprobs.get("token_logprobs") or []
            aligned = len(values) == len(ids) and all(isinstance(v, (int, float)) for v in values)
            return Completion(tuple(ids), tuple(float(v) for v in values) if aligned else (), text, finish)
        self.stats.add(retokenized=1)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if finish == FINISH_STOP and (not ids or ids[-1] != self.eos_token_id):
            ids.append(self.eos_token_id)
        return Completion(tuple(ids), (), text, finish)


def server_token_ids(choice: Mapping[str, Any]) -> list[int] | None:
    """The response's exact token ids if the server returned them (see the module docstring), else None."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        return [int(i) for i in ids]
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if isinstance(tokens, list) and tokens:
        matches = [_TOKEN_ID.match(t) if isinstance(t, str) else None for t in tokens]
        if all(matches):
            return [int(m.group(1)) for m in matches]
    return None

