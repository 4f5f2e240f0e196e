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

Bounds: nothing a server sends can exhaust this process or hang it. A reply is read in chunks, at most
``reply_limit(n, max_tokens)`` bytes (``BASE_REPLY_BYTES`` plus ``REPLY_BYTES_PER_TOKEN`` per token asked for) and
within ``timeout_s`` in total (not only between bytes: a server dripping a byte a second is cut at the deadline);
every reply is checked against what was asked (a JSON object; n choices, each with text, at most ``max_tokens``
token ids, each inside the vocabulary; logprobs finite, <= 0 and one per id; a known finish reason). A reply that
fails any of these is a failed request: its samples are marked failed and ``stats.failures`` counts it under its
cause, so an evaluation can refuse to report numbers made mostly of failures (``eval/runner.py``).
"""

from __future__ import annotations

import json
import logging
import math
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
BASE_REPLY_BYTES = 64 * 1024  # the envelope of a reply, and a /models listing
REPLY_BYTES_PER_TOKEN = 1024  # a token's text, id and logprob in JSON take well under this


def reply_limit(n: int, max_tokens: int) -> int:
    """The most bytes read of a reply to a request for ``n`` completions of ``max_tokens`` tokens."""
    return BASE_REPLY_BYTES + n * max_tokens * REPLY_BYTES_PER_TOKEN


class ServerError(Exception):
    """A request the server did not answer with usable completions (after retries). ``cause``: a short class of the
    problem, for counting (``EngineStats.failures``)."""

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(message)
        self.cause = cause or message.split(":")[0][:60]


@dataclass
class EngineStats:
    requests: int = 0
    failed_requests: int = 0
    exact_token_ids: int = 0  # completions whose ids came from the server
    retokenized: int = 0  # completions whose ids were re-tokenized from text
    failures: dict[str, int] = field(default_factory=dict)  # cause -> failed requests
    first_failure: dict[str, str] = field(default_factory=dict)  # cause -> the first message of that cause
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def failed(self, error: "ServerError") -> None:
        with self._lock:
            self.requests += 1
            self.failed_requests += 1
            self.failures[error.cause] = self.failures.get(error.cause, 0) + 1
            self.first_failure.setdefault(error.cause, str(error)[:300])

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "failed_requests": self.failed_requests,
                "exact_token_ids": self.exact_token_ids, "retokenized": self.retokenized,
                "failures": dict(self.failures)}


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
        self.timeout_s = timeout_s
        self.vocab_size = len(tokenizer) if tokenizer is not None and hasattr(tokenizer, "__len__") else None
        self.eos_token_id = int(eos_token_id)
        self.prompt_format = prompt_format
        self.vllm_extras = vllm_extras
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        headers["Accept-Encoding"] = "identity"  # what is read is what is counted: no compressed bombs
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
            status, raw = self._fetch("GET", "/models", None, BASE_REPLY_BYTES)
            listing = _json(raw, "/models") if status == 200 else None
        except httpx.HTTPError as exc:
            raise ConfigError(f"cannot reach the server at {self.base_url}: {type(exc).__name__}: {exc}. "
                              "Check model.server_url (it includes /v1) and that the server is up.") from exc
        except ServerError as exc:
            raise ConfigError(f"the server at {self.base_url} gave no usable /models reply: {exc}") from exc
        if status == 200:
            data = listing.get("data") if isinstance(listing, dict) else None
            if not isinstance(data, list):
                raise ConfigError(f"the server at {self.base_url} answered /models with {raw[:200]!r}, not an OpenAI "
                                  "model list ({\"data\": [{\"id\": ...}]}); is model.server_url right?")
            served = [m.get("id") for m in data if isinstance(m, Mapping)]
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
            self.stats.failed(exc)
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
        problem = ServerError("no attempt made")
        limit = reply_limit(int(body.get("n", 1)), int(body.get("max_tokens", 1)))
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            try:
                status, raw = self._fetch("POST", "/completions", body, limit)
            except httpx.HTTPError as exc:
                problem = ServerError(f"{type(exc).__name__}: {exc}", f"connection ({type(exc).__name__})")
                continue
            if status == 200:
                payload = _json(raw, "/completions")
                if not isinstance(payload, dict):
                    raise ServerError(f"the reply is JSON {type(payload).__name__}, not an object", "malformed reply")
                return payload
            problem = ServerError(f"HTTP {status}: {raw[:500].decode(errors='replace')}", f"HTTP {status}")
            if status not in _RETRY_STATUS:
                break
        raise problem

    def _fetch(self, method: str, path: str, body: Mapping[str, Any] | None, limit: int) -> tuple[int, bytes]:
        """(status, body bytes) of one HTTP exchange, read in chunks: at most ``limit`` bytes, within ``timeout_s``
        in total. Exceeding either is a ServerError; the connection is dropped, not read to its end."""
        deadline = time.monotonic() + self.timeout_s
        with self.client.stream(method, path, json=body) as response:
            chunks, size = [], 0
            for chunk in response.iter_raw():  # as each read returns: a drip is seen byte by byte
                size += len(chunk)
                if size > limit:
                    raise ServerError(f"the reply passed {limit:,} bytes, more than the completions asked for can take "
                                      f"(model.request_timeout_s and the request's max_tokens bound it); stopped "
                                      f"reading", "reply too large")
                if time.monotonic() > deadline:
                    raise ServerError(f"no complete reply within model.request_timeout_s={self.timeout_s:g} s "
                                      f"({size:,} bytes had arrived)", "deadline passed")
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)

    def _parse(self, payload: Mapping[str, Any], request: GenerationRequest) -> list[Completion]:
        choices = payload.get("choices")
        if not isinstance(choices, list) or len(choices) != request.n:
            count = len(choices) if isinstance(choices, list) else "no"
            raise ServerError(f"expected {request.n} choices, got {count}", "malformed reply")
        if not all(isinstance(c, Mapping) for c in choices):
            raise ServerError("every choice must be a JSON object", "malformed reply")
        usage = payload.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, Mapping) else None
        if isinstance(tokens, int) and tokens > request.n * request.sampling.max_tokens:
            raise ServerError(f"usage.completion_tokens={tokens} for {request.n} x max_tokens="
                              f"{request.sampling.max_tokens}", "more tokens than asked for")
        choices = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c.get("index", 0), int) else 0)
        return [self._completion(choice, request.sampling.max_tokens) for choice in choices]

    def _completion(self, choice: Mapping[str, Any], max_tokens: int) -> Completion:
        text = choice.get("text") or ""
        if not isinstance(text, str):
            raise ServerError(f"choices[].text is {type(text).__name__}, not a string", "malformed reply")
        finish = _FINISH.get(choice.get("finish_reason"), FINISH_ERROR)
        logprobs = choice.get("logprobs") or {}
        if not isinstance(logprobs, Mapping):
            raise ServerError(f"choices[].logprobs is {type(logprobs).__name__}, not an object", "malformed reply")
        ids = server_token_ids(choice)
        if ids is not None:
            self._check_ids(ids, max_tokens)
            self.stats.add(exact_token_ids=1)
            values = logprobs.get("token_logprobs") or []
            aligned = (isinstance(values, list) and len(values) == len(ids)
                       and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v <= 0
                               for v in values))
            return Completion(tuple(ids), tuple(float(v) for v in values) if aligned else (), text, finish)
        self.stats.add(retokenized=1)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if finish == FINISH_STOP and (not ids or ids[-1] != self.eos_token_id):
            ids.append(self.eos_token_id)
        self._check_ids(ids, max_tokens + 1)  # the appended eos
        return Completion(tuple(ids), (), text, finish)

    def _check_ids(self, ids: Sequence[int], max_tokens: int) -> None:
        if len(ids) > max_tokens:
            raise ServerError(f"{len(ids)} completion tokens for max_tokens={max_tokens}", "more tokens than asked for")
        bad = next((i for i in ids if i < 0 or (self.vocab_size is not None and i >= self.vocab_size)), None)
        if bad is not None:
            raise ServerError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})",
                              "token id out of range")


def _json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ServerError(f"{what} answered with invalid JSON ({exc}): {raw[:120]!r}", "invalid JSON") from exc


def server_token_ids(choice: Mapping[str, Any]) -> list[int] | None:
    """The response's exact token ids if the server returned them (see the module docstring), else None."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return [int(i) for i in ids]
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if isinstance(tokens, list) and tokens:
        matches = [_TOKEN_ID.match(t) if isinstance(t, str) else None for t in tokens]
        if all(matches):
            return [int(m.group(1)) for m in matches]
    return None

