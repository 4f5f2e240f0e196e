"""The OpenAI-compatible client engine against a real local HTTP server that wraps HFEngine on the tiny model."""

from __future__ import annotations

import pytest

from completions_server import CompletionsServer
from pettingllms.core import ConfigError
from pettingllms.core.types import FINISH_ERROR, FINISH_LENGTH, GenerationRequest, SamplingParams
from pettingllms.rollout.engine import RolloutEngine
from pettingllms.rollout.openai_engine import OpenAICompletionsEngine, server_token_ids

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def prompts(tiny_codec):
    texts = ["What is 2 + 3?", "Write a haiku about the sea.", "Name a prime number above ten."]
    return [tuple(tiny_codec.encode_chat([{"role": "user", "content": t}])) for t in texts]


def client(server, tiny_codec, **options) -> OpenAICompletionsEngine:
    options.setdefault("retry_backoff_s", 0.01)
    return OpenAICompletionsEngine(server.url, server.name, tiny_codec.tokenizer,
                                   tiny_codec.tokenizer.eos_token_id, **options)


def test_greedy_ids_logprobs_and_text_equal_the_local_engine(tiny_engine, tiny_codec, prompts):
    requests = [GenerationRequest(f"r{i}", p, 1, GREEDY) for i, p in enumerate(prompts)]
    local = [tiny_engine.generate([r])[0] for r in requests]  # one request per call, as the server runs them
    with CompletionsServer(tiny_engine, tiny_codec.tokenizer) as server:
        engine = client(server, tiny_codec)
        assert isinstance(engine, RolloutEngine)
        remote = engine.generate(requests)
        engine.close()
    assert [r.request_id for r in remote] == [r.request_id for r in requests]
    for want, got in zip(local, remote):
        (w,), (g,) = want.completions, got.completions
        assert g.token_ids == w.token_ids and g.text == w.text and g.finish_reason == w.finish_reason
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-6)
    assert engine.stats.as_dict() == {"requests": 3, "failed_requests": 0, "exact_token_ids": 3, "retokenized": 0,
                                      "failures": {}}
    # Exact prompt ids on the wire. The client sends the requests concurrently, so the server may see them in any
    # order (reading bodies[0] as the first request's body made this test fail now and then).
    assert sorted(tuple(b["prompt"]) for b in server.bodies) == sorted(tuple(p) for p in prompts)
    body = server.bodies[0]
    assert (body["temperature"], body["top_p"], body["top_k"], body["max_tokens"]) == (0.0, 1.0, -1, 12)


def test_n_samples_per_request_with_sampling(tiny_engine, tiny_codec, prompts):
    sampled = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, max_tokens=8)
    with CompletionsServer(tiny_engine, tiny_codec.tokenizer) as server:
        (result,) = client(server, tiny_codec).generate([GenerationRequest("s", prompts[1], 4, sampled)])
    assert len(result.completions) == 4
    assert all(len(c.token_ids) == len(c.logprobs) > 0 for c in result.completions)
    assert len({c.token_ids for c in result.completions}) > 1  # a random model at T=1 does not repeat itself
    assert (server.bodies[0]["n"], server.bodies[0]["top_k"], server.bodies[0]["top_p"]) == (4, 20, 0.9)


def test_server_without_token_ids_is_retokenized(tiny_engine, tiny_codec, prompts):
    with CompletionsServer(tiny_engine, tiny_codec.tokenizer, token_ids=False) as server:
        engine = client(server, tiny_codec)
        (result,) = engine.generate([GenerationRequest("t", prompts[0], 1, GREEDY)])
    (c,) = result.completions
    assert c.token_ids == tuple(tiny_codec.tokenizer.encode(c.text, add_special_tokens=False)) + (
        () if c.finish_reason == FINISH_LENGTH else (tiny_codec.tokenizer.eos_token_id,))
    assert c.logprobs == ()  # re-tokenized ids have no server log-probabilities
    assert engine.stats.retokenized == 1 and engine.stats.exact_token_ids == 0


def test_text_prompts_for_strict_servers(tiny_engine, tiny_codec, prompts):
    with CompletionsServer(tiny_engine, tiny_codec.tokenizer, strict=True) as server:
        strict = client(server, tiny_codec, prompt_format="text", vllm_extras=False)
        strict.check_server()
        (result,) = strict.generate([GenerationRequest("x", prompts[2], 1, GREEDY)])
        assert isinstance(server.bodies[-1]["prompt"], str) and "top_k" not in server.bodies[-1]
        assert not result.completions[0].failed
        (refused,) = strict.generate([GenerationRequest("y", prompts[2], 1, SamplingParams(1.0, 1.0, 5, 4))])
        assert refused.completions[0].finish_reason == FINISH_ERROR  # top-k cannot be honoured: never ignored
        with pytest.raises(ConfigError, match="vllm_extras=false"):
            client(server, tiny_codec).check_server()  # the extras are refused with 400


def test_retries_then_succeeds(tiny_engine, tiny_codec, prompts):
    with CompletionsServer(tiny_engine, tiny_codec.tokenizer, fail_first=2) as server:
        (result,) = client(server, tiny_codec, max_retries=2).generate([GenerationRequest("r", prompts[0], 1, GREEDY)])
    assert not result.completions[0].failed and len(server.bodies) == 3


def test_persistent_failure_marks_samples_failed(tiny_engine, tiny_codec, prompts):
    with CompletionsServer(tiny_engine, tiny_codec.tokenizer, fail_first=10) as server:
        engine = client(server, tiny_codec, max_retries=1)
        (result,) = engine.generate([GenerationRequest("f", prompts[0], 3, GREEDY)])
    assert [c.finish_reason for c in result.completions] == [FINISH_ERROR] * 3
    assert all(c.failed for c in result.completions) and engine.stats.failed_requests == 1


def test_start_up_checks_name_the_problem(tiny_engine, tiny_codec):
    with CompletionsServer(tiny_engine, tiny_codec.tokenizer, name="served") as server:
        with pytest.raises(ConfigError, match="serves \\['served'\\], not 'other'"):
            OpenAICompletionsEngine(server.url, "other", tiny_codec.tokenizer, 2).check_server()
        url = server.url
    with pytest.raises(ConfigError, match="cannot reach"):
        OpenAICompletionsEngine(url, "served", tiny_codec.tokenizer, 2, timeout_s=2).check_server()
    with pytest.raises(ConfigError, match="http"):
        OpenAICompletionsEngine("localhost:8000", "m", tiny_codec.tokenizer, 2)


def test_token_id_sources():
    assert server_token_ids({"token_ids": [5, 6]}) == [5, 6]
    assert server_token_ids({"logprobs": {"tokens": ["token_id:7", "token_id:8"]}}) == [7, 8]
    assert server_token_ids({"logprobs": {"tokens": ["token_id:7", "hello"]}}) is None
    assert server_token_ids({"text": "x"}) is None
