"""A small OpenAI-compatible ``/v1/completions`` server over ``HFEngine``, for testing the real HTTP client.

It speaks the JSON a vLLM server speaks for the fields the client sends: ``prompt`` as token ids or text, ``n``,
``temperature``, ``top_p``, ``top_k`` (-1 = off), ``max_tokens``, ``logprobs``; and vLLM's extras
``return_token_ids`` / ``return_tokens_as_token_ids``. ``GET /v1/models`` lists the served name.

Knobs to imitate other servers: ``token_ids=False`` ignores the extras (the client must re-tokenize),
``strict=True`` refuses unknown fields with 400 (like the OpenAI API), ``fail_first=N`` answers the first N
completion requests with 503.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pettingllms.core.types import FINISH_LENGTH, GenerationRequest, SamplingParams

OPENAI_FIELDS = {"model", "prompt", "n", "temperature", "top_p", "max_tokens", "logprobs", "stream"}


class CompletionsServer:
    def __init__(self, engine, tokenizer, name: str = "tiny", *, token_ids: bool = True, strict: bool = False,
                 fail_first: int = 0) -> None:
        self.engine, self.tokenizer, self.name = engine, tokenizer, name
        self.token_ids, self.strict, self.fail_first = token_ids, strict, fail_first
        self.bodies: list[dict[str, Any]] = []  # every completion request received
        self._lock = threading.Lock()  # one generate at a time: the engine is not thread-safe
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "CompletionsServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ---- request handling ----

    def complete(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.bodies.append(body)
            if self.fail_first > 0:
                self.fail_first -= 1
                return 503, {"error": "warming up"}
        unknown = sorted(set(body) - OPENAI_FIELDS)
        if self.strict and unknown:
            return 400, {"error": f"unknown fields {unknown}"}
        if body.get("model") != self.name:
            return 404, {"error": f"model {body.get('model')!r} not found"}
        prompt = body["prompt"]
        ids = prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt, add_special_tokens=False)
        top_k = int(body.get("top_k", -1))
        sampling = SamplingParams(float(body["temperature"]), float(body["top_p"]), max(top_k, 0),
                                  int(body["max_tokens"]))
        with self._lock:
            (result,) = self.engine.generate([GenerationRequest("http", tuple(ids), int(body.get("n", 1)), sampling)])
        extras = self.token_ids and not self.strict
        choices = []
        for index, c in enumerate(result.completions):
            choice = {"index": index, "text": c.text,
                      "finish_reason": "length" if c.finish_reason == FINISH_LENGTH else "stop"}
            if body.get("logprobs") is not None:
                tokens = ([f"token_id:{t}" for t in c.token_ids] if extras and body.get("return_tokens_as_token_ids")
                          else [self.tokenizer.decode([t]) for t in c.token_ids])
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(c.logprobs)}
            if extras and body.get("return_token_ids"):
                choice["token_ids"] = list(c.token_ids)
            choices.append(choice)
        return 200, {"id": "cmpl-test", "object": "text_completion", "model": self.name, "choices": choices}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.name, "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                if self.path.rstrip("/") != "/v1/completions":
                    self._send(404, {"error": "not found"})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send(*server.complete(body))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:  # keep test output quiet
                pass

        return Handler
