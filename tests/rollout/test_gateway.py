"""The agent-program gateway, driven by the real ``openai`` client (sync and async) over a real transformers engine:
routing by ``model``, the agent's sampling, the recorded token ids equal to what the template renders and the client
reads, and every refusal with its HTTP status and the field it names."""

from __future__ import annotations

import asyncio

import openai
import pytest

from pettingllms.core.types import SamplingParams
from pettingllms.models import HFChatCodec, load_model, resolve_model
from pettingllms.rollout.gateway import Gateway, Route
from pettingllms.rollout.hf_engine import HFEngine
from pettingllms.rollout.policy_client import LocalPolicyClient


@pytest.fixture(scope="module")
def gateway():
    path = resolve_model("tiny-random-smollm2")
    codec = HFChatCodec.from_pretrained(path)
    client = LocalPolicyClient(HFEngine(load_model(path), codec, seed=0), codec)
    server = Gateway({"policy_0": client}, max_prompt_length=256, max_response_length=12).start()
    server.open({"solver": Route("policy_0", None, SamplingParams(temperature=1.0, max_tokens=10)),
                 "checker": Route("policy_0", None, SamplingParams(temperature=0.7, max_tokens=64))},
                runs=["run-a", "run-b"])
    yield server, codec
    server.close()


def _client(server: Gateway, run: str = "run-a", key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key or server.key_for(run), max_retries=0)


def test_a_call_is_routed_recorded_with_its_exact_ids_and_sampled_with_the_agents_settings(gateway):
    server, codec = gateway
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    reply = _client(server).chat.completions.create(model="solver", messages=messages, temperature=0.0,
                                                     max_tokens=500)
    checker = _client(server).chat.completions.create(model="checker", messages=messages, max_tokens=3)
    assert [(c.agent, c.order) for c in server.calls("run-a")] == [("solver", 0), ("checker", 1)]  # as asked
    (solver_call,) = [c for c in server.calls("run-a") if c.agent == "solver"]
    (checker_call,) = [c for c in server.calls("run-a") if c.agent == "checker"]
    # The prompt the learner trains on is the chat template's rendering of the messages the program sent, and the
    # response ids are the engine's, which decode to the text the program read.
    assert solver_call.prompt_ids == tuple(codec.encode_chat(messages))
    assert codec.decode(solver_call.completion.token_ids) == reply.choices[0].message.content
    assert len(solver_call.completion.logprobs) == len(solver_call.completion.token_ids) > 0
    # The agent's sampling: the request's temperature is ignored; max_tokens only lowers the agent's limit.
    assert solver_call.sampling == SamplingParams(temperature=1.0, max_tokens=10)
    assert checker_call.sampling == SamplingParams(temperature=0.7, max_tokens=3)
    assert reply.usage.prompt_tokens == len(solver_call.prompt_ids)
    assert reply.usage.completion_tokens == len(solver_call.completion.token_ids) <= 10
    assert reply.model == "solver" and reply.choices[0].finish_reason in ("stop", "length")
    assert checker.model == "checker" and checker.usage.completion_tokens == len(checker_call.completion.token_ids) <= 3
    assert server.calls("run-b") == []  # calls are attributed to the run whose key made them


def test_the_async_client_and_many_concurrent_calls(gateway):
    server, _ = gateway

    async def many():
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.key_for("run-b"), max_retries=0)
        replies = await asyncio.gather(*(client.chat.completions.create(
            model="checker", messages=[{"role": "user", "content": f"Count to {i}."}]) for i in range(6)))
        await client.close()
        return replies

    replies = asyncio.run(many())
    calls = server.calls("run-b")
    assert len(replies) == len(calls) == 6
    assert sorted(c.index for c in calls) == list(range(6))
    # max_response_length (12) caps the agent's own 64
    assert all(c.sampling.max_tokens == 12 for c in calls)


def test_models_lists_the_agents(gateway):
    server, _ = gateway
    assert [m.id for m in _client(server).models.list().data] == ["solver", "checker"]


def test_refusals_name_what_is_wrong(gateway):
    server, _ = gateway
    client = _client(server)
    ok = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError, match=r"'critic' is not an agent of this run.*\['solver', 'checker'\]"):
        client.chat.completions.create(model="critic", messages=ok)
    with pytest.raises(openai.AuthenticationError, match="wrong bearer token"):
        _client(server, key="sk-guess.run-a").chat.completions.create(model="solver", messages=ok)
    with pytest.raises(openai.AuthenticationError, match="has ended"):
        _client(server, run="run-z").chat.completions.create(model="solver", messages=ok)
    with pytest.raises(openai.BadRequestError, match="`messages` must be a non-empty list"):
        client.chat.completions.create(model="solver", messages=[])
    with pytest.raises(openai.BadRequestError, match="`n`=2 is not served"):
        client.chat.completions.create(model="solver", messages=ok, n=2)
    with pytest.raises(openai.BadRequestError, match="`tools`"):
        client.chat.completions.create(model="solver", messages=ok, tools=[{"type": "function", "function": {
            "name": "add", "parameters": {"type": "object", "properties": {}}}}])
    with pytest.raises(openai.BadRequestError, match="over training.max_prompt_length=256"):
        client.chat.completions.create(model="solver", messages=[{"role": "user", "content": "word " * 400}])
    with pytest.raises(openai.BadRequestError, match="`max_tokens`=0 must be a positive integer"):
        client.chat.completions.create(model="solver", messages=ok, max_tokens=0)
    assert server.refused[404] >= 1 and server.refused[401] >= 2 and server.refused[400] >= 5


def test_a_streamed_request_gets_the_same_completion_as_server_sent_events(gateway):
    """Frameworks that stream (``stream=True``) read the whole message in one delta once it is generated, then the
    finish reason, the usage when asked, and [DONE]; the call is recorded like any."""
    server, codec = gateway
    before = len(server.calls("run-a"))
    stream = _client(server).chat.completions.create(model="solver", messages=[{"role": "user", "content": "Hi"}],
                                                     stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    (usage,) = [c.usage for c in chunks if c.usage is not None]
    (call,) = server.calls("run-a")[before:]
    assert text == codec.decode(call.completion.token_ids) and finishes in (["stop"], ["length"])
    assert usage.completion_tokens == len(call.completion.token_ids) and usage.prompt_tokens == len(call.prompt_ids)
    assert {c.model for c in chunks} == {"solver"}


def test_stop_strings_end_the_completion_and_logprobs_come_back_for_the_tokens_trained_on(gateway, caplog):
    """A user trial's program passed stop=[...] and logprobs=True and got neither (silently). The text stops before
    the first stop string; the recorded ids (what training learns from) end at the token that completes it."""
    server, codec = gateway
    client = _client(server, run="run-b")
    stops = [" ", "e", "a", "\n"]
    with caplog.at_level("WARNING", logger="pettingllms.rollout.request_fields"):
        for _ in range(2):
            reply = client.chat.completions.create(model="checker", messages=[{"role": "user", "content": "hi"}],
                                                   stop=stops, logprobs=True, presence_penalty=0.5, seed=3)
    assert caplog.text.count("the gateway ignores `presence_penalty`=0.5") == 1  # once per field, not per call
    assert "the gateway ignores `seed`=3" in caplog.text
    call = server.calls("run-b")[-1]
    text = reply.choices[0].message.content
    assert not any(stop in text for stop in stops)
    recorded = codec.decode(call.completion.token_ids)
    assert recorded.startswith(text) and call.completion.text == text
    # cut (the tiny model's tokens mostly start with a space): the last recorded token completes a stop string
    assert call.completion.finish_reason == "stop" and any(stop in recorded for stop in stops)
    assert not any(stop in codec.decode(call.completion.token_ids[:-1]) for stop in stops)
    content = reply.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(list(call.completion.logprobs))
    assert len(content) == len(call.completion.token_ids) == reply.usage.completion_tokens
    with pytest.raises(openai.BadRequestError, match="`top_logprobs`=2 is not served"):
        client.chat.completions.create(model="checker", messages=[{"role": "user", "content": "hi"}], logprobs=True,
                                       top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="`stop`=.* must be a non-empty string or a list of at most 4"):
        client.chat.completions.create(model="checker", messages=[{"role": "user", "content": "hi"}],
                                       stop=["a", "b", "c", "d", "e"])


def test_cut_at_stop_keeps_the_tokens_through_the_one_that_completes_the_stop_string(gateway):
    from pettingllms.core.types import Completion
    from pettingllms.rollout.request_fields import cut_at_stop

    _, codec = gateway
    ids = tuple(codec.tokenizer.encode("The answer is 42. Then more text follows", add_special_tokens=False))
    full = Completion(ids, tuple(-0.1 * i for i in range(len(ids))), codec.decode(ids), "length")
    cut = cut_at_stop(full, ["xyz", ". Then"], codec.decode)
    assert cut.text == "The answer is 42" and cut.finish_reason == "stop"
    assert ". Then" in codec.decode(cut.token_ids) and ". Then" not in codec.decode(cut.token_ids[:-1])
    assert cut.logprobs == full.logprobs[:len(cut.token_ids)]
    assert cut_at_stop(full, ["absent"], codec.decode) is full
