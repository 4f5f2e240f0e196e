"""One chat completion from an OpenAI-compatible server, for an env that consults a model itself (a game's opponent
served elsewhere: ``env.options.opponent=server``).

Bounded like eval's client (``rollout/openai_engine.py``), since a server is something the run does not control: a
total deadline (not only between bytes), a cap on the reply's size, no compressed replies, and a schema check; any
failure is a ``ChatError`` naming its cause, which the caller turns into a fallback it records.
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping, Sequence

MAX_REPLY_BYTES = 256 * 1024  # a short answer's JSON is a few KB


class ChatError(Exception):
    """The server did not give a usable answer (status, timeout, size, malformed JSON): the message says which."""


def chat_once(url: str, model: str, messages: Sequence[Mapping[str, str]], *, api_key: str | None = None,
              max_tokens: int = 32, temperature: float = 0.0, timeout_s: float = 60.0,
              max_bytes: int = MAX_REPLY_BYTES) -> str:
    """The text of one chat completion of ``messages`` by ``model`` at ``url`` (the API root, ``/v1`` included)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    body = {"model": model, "messages": list(messages), "max_tokens": max_tokens, "temperature": temperature, "n": 1}
    headers = {"Accept-Encoding": "identity", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    chunks, size = [], 0
    try:
        with httpx.Client(timeout=timeout_s) as client, client.stream(
                "POST", url.rstrip("/") + "/chat/completions", json=body, headers=headers) as response:
            for chunk in response.iter_raw():
                size += len(chunk)
                if size > max_bytes:
                    raise ChatError(f"the reply passed {max_bytes:,} bytes")
                if time.monotonic() > deadline:
                    raise ChatError(f"no complete reply within {timeout_s:g} s")
                chunks.append(chunk)
            status = response.status_code
    except httpx.HTTPError as exc:
        raise ChatError(f"{type(exc).__name__}: {exc}") from exc
    raw = b"".join(chunks)
    if status != 200:
        raise ChatError(f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}")
    try:
        data: Any = json.loads(raw)
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ChatError(f"not a chat completion ({type(exc).__name__}: {str(exc)[:100]})") from exc
    if not isinstance(content, str):
        raise ChatError(f"the message content is {type(content).__name__}, not text")
    return content
