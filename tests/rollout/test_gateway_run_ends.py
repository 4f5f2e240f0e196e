"""The gateway's edges, over a scripted engine: an engine that failed a request is a 500, never an empty answer; a
run's calls end with it (a thread its program left running is refused and never trained on); a program's timeout
holds even when its blocking call runs in a thread; the roles a chat template knows; the fields clients send."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest

from pettingllms.core.types import SamplingParams
from pettingllms.rollout.gateway import Gateway, Route
from pettingllms.rollout.local_engine import failed_completions
from pettingllms.rollout.policy_client import LocalPolicyClient
from pettingllms.rollout.program import run_bounded
from pettingllms.rollout.scripted import CharCodec, ScriptedEngine


class FailingWhenAsked(ScriptedEngine):
    """Answers "ok", except that a prompt containing FAIL comes back as the engines report a failed request."""

    def _answer(self, request):
        result = super()._answer(request)
        if "FAIL" in self.codec.decode(request.prompt_ids):
            return type(result)(request.request_id, tuple(failed_completions(request.n)))
        return result


@pytest.fixture()
def gateway():
    codec = CharCodec()
    server = Gateway({"policy_0": LocalPolicyClient(FailingWhenAsked(lambda prompt, k, r: "ok", codec), codec)},
                     max_prompt_length=4096, max_response_length=16).start()
    server.open({"solver": Route("policy_0", None, SamplingParams(max_tokens=8))}, runs=["run-a", "run-b"])
    yield server
    server.close()


def client(server: Gateway, run: str = "run-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=server.key_for(run), max_retries=0)


def test_a_request_the_engine_failed_is_a_500_and_its_masked_call_is_recorded(gateway):
    with pytest.raises(openai.InternalServerError, match="the engine failed to generate"):
        client(gateway).chat.completions.create(model="solver", messages=[{"role": "user", "content": "FAIL"}])
    (call,) = gateway.calls("run-a")
    assert call.completion.finish_reason == "error"  # its sample is masked out of the loss
    reply = client(gateway).chat.completions.create(model="solver", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "ok"


def test_a_run_that_ended_refuses_its_calls_and_keeps_only_those_answered_before(gateway):
    client(gateway).chat.completions.create(model="solver", messages=[{"role": "user", "content": "before"}])
    (answered,) = gateway.end("run-a")
    assert "before" in CharCodec().decode(answered.prompt_ids)
    with pytest.raises(openai.AuthenticationError, match="has ended"):  # a thread the program left running
        client(gateway).chat.completions.create(model="solver", messages=[{"role": "user", "content": "AFTER"}])
    assert gateway.calls("run-a") == [answered]
    assert client(gateway, "run-b").chat.completions.create(  # the other runs go on
        model="solver", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content == "ok"


def test_a_program_blocked_in_a_thread_still_ends_at_its_timeout():
    """asyncio.run waits for to_thread's threads without a limit; a run must not outlast env.options.timeout."""
    release = threading.Event()

    async def program():
        await asyncio.to_thread(release.wait, 30)

    started = time.perf_counter()
    with pytest.raises(asyncio.TimeoutError):
        run_bounded(program(), 0.5)
    assert time.perf_counter() - started < 5
    release.set()  # lets the left thread end
    assert run_bounded(asyncio.sleep(0, result=7), 5) == 7  # and an ordinary program's value comes back


def test_developer_is_served_as_system_and_an_unknown_role_is_refused(gateway):
    client(gateway).chat.completions.create(model="solver", messages=[
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    (call,) = gateway.calls("run-a")
    assert CharCodec().decode(call.prompt_ids).startswith("<system>: Be brief.")
    with pytest.raises(openai.BadRequestError, match=r"`messages\[0\].role`='wizard' is not served"):
        client(gateway).chat.completions.create(model="solver", messages=[{"role": "wizard", "content": "hi"}])


def test_a_null_max_completion_tokens_leaves_max_tokens_in_force_and_odd_bodies_and_keys_get_their_status(gateway):
    client(gateway).chat.completions.create(model="solver", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=3, extra_body={"max_completion_tokens": None})
    assert gateway.calls("run-a")[-1].sampling.max_tokens == 3
    headers = {"Authorization": f"Bearer {gateway.key_for('run-a')}"}
    too_big = httpx.post(f"{gateway.base_url}/chat/completions", headers=headers,
                         content=b'{"model": "solver", "messages": [], "pad": "' + b"x" * (17 * 2**20) + b'"}')
    assert too_big.status_code == 413
    odd_key = httpx.post(f"{gateway.base_url}/chat/completions", headers={"Authorization": "Bearer sk-é.run-a".encode()},
                         json={"model": "solver", "messages": [{"role": "user", "content": "hi"}]})
    assert odd_key.status_code == 401


def test_streamed_logprobs_tool_choice_without_tools_and_the_responses_apis_fields(gateway, caplog):
    import json
    import logging

    headers = {"Authorization": f"Bearer {gateway.key_for('run-a')}"}
    hi = [{"role": "user", "content": "hi"}]
    streamed = httpx.post(f"{gateway.base_url}/chat/completions", headers=headers,
                          json={"model": "solver", "messages": hi, "stream": True, "logprobs": True})
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert "logprobs" in chunks[0]["choices"][0]  # with the content they score, as when not streamed
    with pytest.raises(openai.BadRequestError, match="`tool_choice`='required' without `tools`"):
        client(gateway).chat.completions.create(model="solver", messages=hi, tool_choice="required")
    odd = httpx.post(f"{gateway.base_url}/responses", headers=headers,
                     json={"model": "solver", "input": "hi", "stream": "yes"})
    assert odd.status_code == 400 and "`stream`='yes' must be true or false" in odd.text
    with caplog.at_level(logging.WARNING):
        client(gateway).responses.create(model="solver", input="hi", temperature=0.3)
    assert "ignores `temperature`=0.3" in caplog.text
