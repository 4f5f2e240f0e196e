"""The OpenAI-compatible client against a hostile server on 127.0.0.1: a huge body, a drip, malformed JSON, token ids
outside the vocabulary, more tokens than asked for, a bad /models reply, and every request a 500. Each is a failed
request counted under its cause, within the deadline and bounded memory; an evaluation made mostly of failures
exits non-zero, one line per cause."""

from __future__ import annotations

import json
import resource
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pettingllms.cli import main
from pettingllms.core import ConfigError
from pettingllms.core.types import FINISH_ERROR, GenerationRequest, SamplingParams
from pettingllms.rollout.openai_engine import OpenAICompletionsEngine

ASK = SamplingParams(temperature=0.0, max_tokens=4)


class Hostile:
    """A server whose /v1/completions misbehaves as ``mode`` says; /v1/models answers as ``models`` says."""

    def __init__(self, mode: str, models: str = "ok") -> None:
        self.mode, self.models = mode, models
        handler = self._handler()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: bytes, length: int | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                listing = {"ok": {"object": "list", "data": [{"id": "m"}]}, "bad": ["not", "a", "listing"],
                           "text": "hello"}[hostile.models]
                self._send(200, json.dumps(listing).encode() if hostile.models != "text" else b"hello")

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                mode = hostile.mode
                try:
                    if mode == "huge":  # 60 MB promised, streamed until the client hangs up
                        self.send_response(200)
                        self.send_header("Content-Length", str(60 * 2**20))
                        self.end_headers()
                        self.wfile.write(b'{"choices": [{"text": "')
                        for _ in range(60 * 16):
                            self.wfile.write(b"a" * 65536)
                    elif mode == "drip":  # a byte every 0.2 s: never a read timeout, never an end
                        self.send_response(200)
                        self.send_header("Content-Length", "100000")
                        self.end_headers()
                        for _ in range(100000):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(0.2)
                    elif mode == "500":
                        self._send(500, b'{"error": "down"}')
                    else:
                        self._send(200, ENCODED[mode])
                except (BrokenPipeError, ConnectionResetError):
                    pass

        return Handler


REPLIES = {
    "list": [1, 2, 3],
    "strings": {"choices": ["a"]},
    "ids_out_of_range": {"choices": [{"index": 0, "text": "x", "token_ids": [-5, 10**12], "finish_reason": "stop"}]},
    "too_many_tokens": {"choices": [{"index": 0, "text": "x", "token_ids": [1] * 2_000_000, "finish_reason": "length"}],
                        "usage": {"completion_tokens": 2_000_000}},
    "usage": {"choices": [{"index": 0, "text": "x", "token_ids": [1, 2], "finish_reason": "stop"}],
              "usage": {"completion_tokens": 2_000_000}},
}


ENCODED = {mode: json.dumps(reply).encode() for mode, reply in REPLIES.items()}  # ready to send at once


@pytest.fixture
def engine_for(tiny_codec):
    servers = []

    def build(mode: str, **options) -> OpenAICompletionsEngine:
        server = Hostile(mode)
        servers.append(server)
        options = {"retry_backoff_s": 0.01, "max_retries": 1, "timeout_s": 2.0, **options}
        return OpenAICompletionsEngine(server.url, "m", tiny_codec.tokenizer, tiny_codec.tokenizer.eos_token_id,
                                       **options)

    yield build
    for server in servers:
        server.close()


@pytest.mark.parametrize("mode, cause", [
    ("huge", "reply too large"), ("drip", "deadline passed"), ("list", "malformed reply"),
    ("strings", "malformed reply"), ("ids_out_of_range", "token id out of range"),
    ("too_many_tokens", "reply too large"), ("usage", "more tokens than asked for"), ("500", "HTTP 500"),
])
def test_each_hostile_reply_is_a_failed_request_counted_under_its_cause(engine_for, mode, cause):
    engine = engine_for(mode)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    (result,) = engine.generate([GenerationRequest("r", (1, 2, 3), 1, ASK)])
    elapsed = time.monotonic() - start
    assert [c.finish_reason for c in result.completions] == [FINISH_ERROR]
    assert engine.stats.failures == {cause: 1} and engine.stats.failed_requests == 1
    assert elapsed < 2 * 2.0 + 1, f"{mode}: {elapsed:.1f} s for a 2 s deadline (one retry at most)"
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mb < 200, f"{mode}: resident memory grew by {grown_mb:.0f} MB"


def test_a_bad_models_reply_is_a_clean_error(tiny_codec):
    for models in ("bad", "text"):
        server = Hostile("500", models=models)
        try:
            engine = OpenAICompletionsEngine(server.url, "m", tiny_codec.tokenizer, 0, timeout_s=2.0)
            with pytest.raises(ConfigError, match="/models"):
                engine.check_server()
        finally:
            server.close()


def test_an_eval_whose_requests_mostly_failed_exits_non_zero_naming_the_cause(tmp_path, capsys, monkeypatch):
    """The start-up probe passes (the server answers it), then every completion is a 500: the evaluation writes its
    summary and exits 2 with the cause."""
    server = Hostile("500")
    monkeypatch.setattr(OpenAICompletionsEngine, "check_server", lambda self: None)  # the probe would fail first
    try:
        code = main(["eval", "base_models.policy_0.path=tiny-random-smollm2", f"model.server_url={server.url}",
                     "model.served_name=m", "model.max_retries=0", "model.request_timeout_s=5",
                     "env.name=toy_targets", "env.max_val_problems=3", "env.max_turns=1", "specialization=L1",
                     "eval.max_tokens=4", f"eval.log_dir={tmp_path}"])
    finally:
        server.close()
    err = capsys.readouterr().err
    assert code == 2
    assert "requests to the server of policy_0 failed (more than model.max_failed_share=0.5)" in err
    assert "x HTTP 500: HTTP 500" in err
    assert list(tmp_path.glob("**/summary.json")), "the summary is written before the refusal"
