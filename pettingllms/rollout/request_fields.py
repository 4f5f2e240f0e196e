"""The OpenAI request fields the gateway serves beyond messages and max_tokens, and those it ignores (said once).

- ``stop`` (a string or up to 4): the completion ends where a stop string first appears, as OpenAI and vLLM end it.
  The engine generates on, and the gateway cuts: the text the program reads stops before the stop string; the
  token ids (and log-probabilities) it records, and training learns from, end at the token that completes it. A
  prefix of a sampled response is itself a sample, so this is on-policy.
- ``logprobs: true``: the sampled tokens' log-probabilities (the engine's raw ones, the rollout check's), in OpenAI's
  ``choices[0].logprobs.content`` form; ``top_logprobs`` > 0 is refused (the engines return the sampled token's).
- Sampling fields (``temperature``, ``top_p``, penalties, ``logit_bias``, ``seed``) and ``response_format`` are
  ignored: an agent samples with its run's settings, so the policy trains on what it sampled. Each is logged once
  per gateway, naming the agent's setting that decides instead.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

from pettingllms.core.types import FINISH_STOP, Completion

log = logging.getLogger(__name__)
MAX_STOPS = 4  # OpenAI's limit
IGNORED = {
    "temperature": "the agent's train_sampling/val_sampling temperature samples",
    "top_p": "the agent's train_sampling/val_sampling top_p samples",
    "presence_penalty": "no penalty is applied: the agent's sampling settings sample",
    "frequency_penalty": "no penalty is applied: the agent's sampling settings sample",
    "logit_bias": "no bias is applied: the agent's sampling settings sample",
    "seed": "the run seeds its engines",
    "response_format": "the response is not constrained to a format",
}


class FieldError(ValueError):
    """A field the gateway cannot serve as asked: the request is answered 400 with this message."""


def stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    """The request's ``stop`` strings (none for null); FieldError for another type, an empty string or more than 4."""
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise FieldError(f"`stop`={value!r} must be a non-empty string or a list of at most {MAX_STOPS} of them")
    return tuple(stops)


def wants_logprobs(body: dict[str, Any]) -> bool:
    """Whether the request asks for the sampled tokens' log-probabilities; FieldError for ``top_logprobs`` > 0."""
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise FieldError(f"`top_logprobs`={top!r} is not served: the engines return the sampled token's "
                         "log-probability only (`logprobs: true`)")
    return body.get("logprobs") is True


def cut_at_stop(completion: Completion, stops: Sequence[str], decode: Callable[[Sequence[int]], str]) -> Completion:
    """``completion`` ended where the first of ``stops`` first appears in its text: the text before it, the token ids
    and log-probabilities through the first token whose decoded prefix holds it; unchanged when none appears."""
    hits = [(completion.text.find(stop), stop) for stop in stops if stop in completion.text]
    if not hits:
        return completion
    at, stop = min(hits)
    ids = completion.token_ids
    low, high = 1, len(ids)  # the fewest tokens whose text holds the stop string (more tokens only add text)
    while low < high:
        middle = (low + high) // 2
        if stop in decode(ids[:middle]):
            high = middle
        else:
            low = middle + 1
    return dataclasses.replace(completion, token_ids=ids[:low], logprobs=completion.logprobs[:low],
                               text=completion.text[:at], finish_reason=FINISH_STOP)


def logprobs_content(completion: Completion, decode: Callable[[Sequence[int]], str]) -> dict[str, Any]:
    """OpenAI's ``choices[0].logprobs`` for the sampled tokens (empty where the engine reported none)."""
    content = []
    for token, logprob in zip(completion.token_ids, completion.logprobs):
        text = decode([token])
        content.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": content}


class IgnoredFields:
    """Logs each ignored field the first time a request sets it (``IGNORED``)."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def note(self, body: dict[str, Any], agent: str) -> None:
        for field, instead in IGNORED.items():
            value = body.get(field)
            if value is None or field in self._said or (field == "response_format" and _plain_text(value)):
                continue
            self._said.add(field)
            log.warning("the gateway ignores `%s`=%r (agent %r): %s (logged once per field)", field, value, agent,
                        instead)


def _plain_text(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "text"
