"""Tool calls through the agent-program gateway, with the real ``openai`` client and the Qwen3 chat template (the tiny
Qwen3-1.7B replica's, which defines tools): the request's tools rendered into the prompt the learner trains on, the
model's ``<tool_call>`` blocks returned as ``tool_calls``, the tool's result rendered into the next prompt, and the
refusals. The engine answers from a script over the real tokenizer, so what the model "writes" is chosen by the test
while every id is the tokenizer's."""

from __future__ import annotations

import json

import openai
import pytest

from pettingllms.core.types import Completion, GenerationResult, SamplingParams
from pettingllms.models import HFChatCodec, resolve_model
from pettingllms.rollout.gateway import Gateway, Route
from pettingllms.rollout.policy_client import LocalPolicyClient
from pettingllms.rollout.tool_calls import parse_tool_calls, tool_call_format

VAULT_TOOL = {"type": "function", "function": {
    "name": "open_vault", "description": "Try a code on the vault.",
    "parameters": {"type": "object", "properties": {"code": {"type": "integer"}}, "required": ["code"]}}}
CALL = '<tool_call>\n{"name": "open_vault", "arguments": {"code": 42}}\n</tool_call>'


class TextEngine:
    """Answers every request with ``reply(prompt text)``, tokenised by the policy's own tokenizer."""

    def __init__(self, codec: HFChatCodec, reply) -> None:
        self.codec, self.reply = codec, reply

    def generate(self, requests):
        results = []
        for request in requests:
            text = self.reply(self.codec.tokenizer.decode(list(request.prompt_ids)))
            ids = tuple(self.codec.tokenizer.encode(text, add_special_tokens=False))[: request.sampling.max_tokens]
            results.append(GenerationResult(request.request_id, (Completion(ids, (0.0,) * len(ids),
                                                                             self.codec.decode(ids)),)))
        return results


def _reply(prompt: str) -> str:
    if "<tool_response>" in prompt:
        return "The vault is open."
    if "garbled" in prompt:
        return "<tool_call>\n{not json}\n</tool_call>"
    return "Let me try.\n" + CALL


@pytest.fixture(scope="module")
def served():
    qwen = HFChatCodec.from_pretrained(resolve_model("tiny-replica-qwen3-1.7b"))
    smol = HFChatCodec.from_pretrained(resolve_model("tiny-random-smollm2"))
    server = Gateway({"qwen": LocalPolicyClient(TextEngine(qwen, _reply), qwen),
                      "smol": LocalPolicyClient(TextEngine(smol, _reply), smol)},
                     max_prompt_length=2048, max_response_length=64).start()
    server.open({"solver": Route("qwen", None, SamplingParams(temperature=1.0, max_tokens=64)),
                 "plain": Route("smol", None, SamplingParams(temperature=1.0, max_tokens=64))}, runs=["run"])
    yield server, qwen
    server.close()


def _client(server: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=server.key_for("run"), max_retries=0)


def test_a_tool_call_round_trip_trains_on_exactly_what_was_rendered_and_written(served):
    server, codec = served
    messages = [{"role": "user", "content": "Open the vault."}]
    first = _client(server).chat.completions.create(model="solver", messages=messages, tools=[VAULT_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me try."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "open_vault"
    assert json.loads(call.function.arguments) == {"code": 42}
    (recorded,) = server.calls("run")
    assert recorded.prompt_ids == tuple(codec.encode_chat(messages, [VAULT_TOOL]))
    assert '"name": "open_vault"' in codec.tokenizer.decode(list(recorded.prompt_ids))  # the schema, in the prompt
    assert codec.decode(recorded.completion.token_ids) == "Let me try.\n" + CALL  # trained on what it wrote

    follow_up = messages + [choice.message.model_dump(exclude_none=True),
                            {"role": "tool", "tool_call_id": call.id, "content": "opened"}]
    second = _client(server).chat.completions.create(model="solver", messages=follow_up, tools=[VAULT_TOOL])
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == "The vault is open."
    assert not second.choices[0].message.tool_calls
    recorded = server.calls("run")[1]
    rendered = codec.tokenizer.decode(list(recorded.prompt_ids))
    assert "<tool_response>\nopened\n</tool_response>" in rendered and CALL in rendered
    sent = follow_up[:1] + [{"role": "assistant", "content": "Let me try.", "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "open_vault", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "opened"}]
    assert recorded.prompt_ids == tuple(codec.encode_chat(sent, [VAULT_TOOL]))


def test_a_block_that_is_not_a_call_stays_text_and_tool_choice_none_reads_text(served):
    server, _ = served
    garbled = _client(server).chat.completions.create(
        model="solver", messages=[{"role": "user", "content": "garbled"}], tools=[VAULT_TOOL])
    assert garbled.choices[0].finish_reason == "stop" and not garbled.choices[0].message.tool_calls
    assert "{not json}" in garbled.choices[0].message.content
    text = _client(server).chat.completions.create(
        model="solver", messages=[{"role": "user", "content": "hi"}], tools=[VAULT_TOOL], tool_choice="none")
    assert not text.choices[0].message.tool_calls and CALL in text.choices[0].message.content


@pytest.mark.parametrize("extra, status, field", [
    ({"tools": [VAULT_TOOL], "model": "plain"}, 400, "chat template of smol's model defines no tool-call format"),
    ({"tools": [VAULT_TOOL], "tool_choice": "required"}, 400, "`tool_choice`='required' is not served"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, 400, "`tools[0]`"),
    ({"functions": [{"name": "f"}]}, 400, "`functions`"),
])
def test_tool_requests_it_cannot_serve_are_refused_naming_the_field(served, extra, status, field):
    server, _ = served
    body = {"model": "solver", "messages": [{"role": "user", "content": "x"}], **extra}
    with pytest.raises(openai.APIStatusError) as raised:
        _client(server).post("/chat/completions", body=body, cast_to=object)
    assert raised.value.status_code == status and field in str(raised.value)


def test_parsing():
    content, calls = parse_tool_calls('a <tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call> b '
                                      '<tool_call>{"name": "g", "parameters": {}}</tool_call>', "call-1")
    assert content == "a  b"
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("call-1-0", "f", {"x": 1}), ("call-1-1", "g", {})]
    assert parse_tool_calls(CALL, "c") [0] is None
    unclosed = "<tool_call>\n{\"name\": \"f\", \"argu"  # cut by max_tokens
    assert parse_tool_calls(unclosed, "c") == (unclosed, [])
    assert tool_call_format("{% for tool in tools %}<tool_call>{% endfor %}") == "hermes"
    assert tool_call_format("{{ messages }}") is None and tool_call_format(None) is None


@pytest.mark.parametrize("streamed", [False, True])
def test_an_openai_agents_sdk_agent_uses_a_function_tool_through_the_gateway(served, streamed):
    """An unmodified Agents SDK program, with ``Runner.run`` or the streaming ``Runner.run_streamed``: its agent calls
    a ``function_tool``, the SDK runs it, the model reads the result and answers; both calls are recorded."""
    pytest.importorskip("agents")
    import asyncio

    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    server, codec = served
    tried: list[int] = []

    @function_tool
    def open_vault(code: int) -> str:
        """Try a code on the vault."""
        tried.append(code)
        return "opened"

    async def program() -> str:
        set_tracing_disabled(True)
        client = AsyncOpenAI(base_url=server.base_url, api_key=server.key_for("run"), max_retries=0)
        agent = Agent(name="solver", tools=[open_vault],
                      model=OpenAIChatCompletionsModel(model="solver", openai_client=client))
        offline = RunConfig(tracing_disabled=True)
        try:
            if streamed:
                result = Runner.run_streamed(agent, "Open the vault.", run_config=offline)
                async for _ in result.stream_events():
                    pass
            else:
                result = await Runner.run(agent, "Open the vault.", run_config=offline)
        finally:
            await client.close()
        return str(result.final_output)

    before = len(server.calls("run"))
    assert asyncio.run(program()) == "The vault is open."
    assert tried == [42]  # the SDK ran the tool with the arguments the model wrote
    calls = server.calls("run")[before:]
    assert len(calls) == 2
    assert "<tool_response>\nopened\n</tool_response>" in codec.tokenizer.decode(list(calls[1].prompt_ids))


def test_a_streamed_tool_call(served):
    server, _ = served
    chunks = list(_client(server).chat.completions.create(
        model="solver", messages=[{"role": "user", "content": "Open the vault."}], tools=[VAULT_TOOL], stream=True))
    calls = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])]
    assert [(call.index, call.function.name, json.loads(call.function.arguments)) for call in calls] == \
        [(0, "open_vault", {"code": 42})]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


# ------------------------------------------------------------------------------------------- the Responses API
RESPONSES_TOOL = {"type": "function", "name": "open_vault", "description": "Try a code on the vault.",
                  "parameters": VAULT_TOOL["function"]["parameters"]}


def test_the_responses_api_round_trip_with_a_function_call_through_the_openai_client(served):
    server, codec = served
    client = _client(server)
    before = len(server.calls("run"))
    first = client.responses.create(model="solver", instructions="You open vaults.", input="Open the vault.",
                                    tools=[RESPONSES_TOOL])
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("open_vault", {"code": 42})
    assert first.status == "completed" and first.output_text == "Let me try."
    second = client.responses.create(model="solver", instructions="You open vaults.", tools=[RESPONSES_TOOL], input=[
        {"role": "user", "content": "Open the vault."},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "opened"}])
    assert second.output_text == "The vault is open." and second.usage.output_tokens > 0
    calls = server.calls("run")[before:]
    assert len(calls) == 2
    rendered = codec.tokenizer.decode(list(calls[1].prompt_ids))
    assert "You open vaults." in rendered and "<tool_response>\nopened\n</tool_response>" in rendered
    # the same conversation as chat messages renders to the same ids: one template, whichever API asked
    chat = codec.encode_chat([
        {"role": "system", "content": "You open vaults."}, {"role": "user", "content": "Open the vault."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": "open_vault", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "opened"}], [VAULT_TOOL])
    assert tuple(chat) == calls[1].prompt_ids


def test_a_streamed_response_ends_with_the_whole_response():
    from pettingllms.rollout.responses_api import response_object, stream_events

    reply = {"id": "chatcmpl-r-a-0", "created": 1, "model": "solver", "usage": {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, "choices": [{"finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": "Let me try.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "open_vault", "arguments": "{\"code\": 42}"}}]}}]}
    events = stream_events(response_object(reply, {"model": "solver"}))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == \
        ["message", "function_call"]
    assert events[-1]["response"]["output"][1]["call_id"] == "c1"


@pytest.mark.parametrize("streamed", [False, True])
def test_an_agents_sdk_program_with_the_default_responses_model_runs_through_the_gateway(served, streamed):
    """The SDK's defaults: ``Agent(model=<agent name>)`` over the default client, which speaks the Responses API."""
    pytest.importorskip("agents")
    import asyncio

    from agents import (Agent, RunConfig, Runner, function_tool, set_default_openai_client, set_default_openai_api,
                        set_tracing_disabled)
    from openai import AsyncOpenAI

    server, _ = served
    tried: list[int] = []

    @function_tool
    def open_vault(code: int) -> str:
        """Try a code on the vault."""
        tried.append(code)
        return "opened"

    async def program() -> str:
        set_tracing_disabled(True)
        client = AsyncOpenAI(base_url=server.base_url, api_key=server.key_for("run"), max_retries=0)
        set_default_openai_client(client, use_for_tracing=False)
        set_default_openai_api("responses")
        agent = Agent(name="solver", tools=[open_vault], model="solver")
        try:
            if streamed:
                result = Runner.run_streamed(agent, "Open the vault.", run_config=RunConfig(tracing_disabled=True))
                async for _ in result.stream_events():
                    pass
            else:
                result = await Runner.run(agent, "Open the vault.", run_config=RunConfig(tracing_disabled=True))
        finally:
            await client.close()
        return str(result.final_output)

    before = len(server.calls("run"))
    assert asyncio.run(program()) == "The vault is open."
    assert tried == [42]
    assert len(server.calls("run")) - before == 2


@pytest.mark.parametrize("extra, field", [
    ({"previous_response_id": "resp-1"}, "previous_response_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input_image"),
    ({"tools": [{"type": "web_search"}]}, "web_search"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
])
def test_responses_requests_it_cannot_serve_are_refused_naming_the_field(served, extra, field):
    server, _ = served
    with pytest.raises(openai.BadRequestError, match=field):
        _client(server).responses.create(**{"model": "solver", "input": "Open the vault.", **extra})
