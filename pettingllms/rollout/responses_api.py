"""OpenAI's Responses API (``POST /v1/responses``) on the gateway, by translation to and from a chat completion.

The OpenAI Agents SDK's default model class (``OpenAIResponsesModel``) speaks this API, so a program written with
the SDK's defaults runs through the gateway unchanged. A request becomes the chat-completions body the gateway
already serves (``chat_body``), so routing, the agent's sampling, the chat template, tools and the recorded token
ids are the same code; the chat reply becomes a ``response`` object (``response_object``), or its server-sent events
(``stream_events``).

Served: ``input`` as a string or a list of items (messages with text parts, ``function_call`` and
``function_call_output`` items; ``reasoning`` items are dropped, as the model's reasoning is part of its text),
``instructions`` (a system message first), function ``tools`` and ``tool_choice`` ``auto``/``none``,
``max_output_tokens``. Refused with 400, naming the field: ``previous_response_id`` and ``conversation`` (the gateway
keeps no state: send the whole conversation, as the SDK does by default), non-text content parts, hosted tools
(web search, file search, ...), a forced ``tool_choice``. Sampling fields are the agent's, as for chat completions.
``text.format`` (structured output) is not enforced, as chat completions' ``response_format`` is not: the model's
text comes back as it wrote it, and a program that parses it sees what the model learned to write.
"""

from __future__ import annotations

import json
from typing import Any

from pettingllms.rollout.request_error import RequestError

TEXT_PARTS = ("input_text", "output_text", "text")


def chat_body(body: Any) -> dict[str, Any]:
    """The chat-completions body of a Responses request."""
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    for stateful in ("previous_response_id", "conversation"):
        if body.get(stateful):
            raise RequestError(400, f"`{stateful}` is not served: the gateway keeps no conversation state; send the "
                                    "whole conversation in `input` (the Agents SDK does by default)")
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError(400, "`instructions` must be a string")
        messages.append({"role": "system", "content": instructions})
    messages += _input_messages(body.get("input"))
    if body.get("stream") not in (None, False, True):
        raise RequestError(400, f"`stream`={body.get('stream')!r} must be true or false")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "stream": bool(body.get("stream"))}
    # the sampling fields the gateway ignores travel on, so that it logs them as it does for chat requests
    chat.update({key: body[key] for key in ("temperature", "top_p", "seed") if body.get(key) is not None})
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    tools = body.get("tools")
    if tools:
        chat["tools"] = _chat_tools(tools)
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = body["tool_choice"]
    return chat


def _input_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise RequestError(400, "`input` must be a string or a non-empty list of items")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"`input[{i}]`"
        if not isinstance(item, dict):
            raise RequestError(400, f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise RequestError(400, f"{where}.role must be user, assistant, system or developer, got {role!r}")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            name, arguments, call_id = item.get("name"), item.get("arguments", "{}"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(arguments, str) or not isinstance(call_id, str):
                raise RequestError(400, f"{where}: a function_call needs string `name`, `arguments` and `call_id`")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if out and out[-1]["role"] == "assistant":  # one assistant turn: its text, then every call it made
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise RequestError(400, f"{where}: a function_call_output needs a string `call_id`")
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"),
                                                                                  f"{where}.output")})
        elif kind == "reasoning":
            continue  # the model's reasoning is in its text already
        else:
            raise RequestError(400, f"{where}.type={kind!r} is not served (messages, function_call and "
                                    "function_call_output items are)")
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(400, f"{where}[{j}]: only text parts are served, got {kind!r}")
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(400, f"{where} must be a string or a list of text parts")


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise RequestError(400, "`tools` must be a list of {type: function, name, parameters} objects")
    out = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise RequestError(400, f"`tools[{j}]`: only function tools are served, got {kind!r} (hosted tools run "
                                    "on OpenAI's servers)")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise RequestError(400, f"`tools[{j}]` needs a `name`")
        # in the chat API's order (name, description, parameters): templates render the schema as JSON text
        function: dict[str, Any] = {"name": tool["name"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def response_object(reply: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` of a chat reply (``Gateway._complete``'s)."""
    (choice,) = reply["choices"]
    message = choice["message"]
    ident = reply["id"].replace("chatcmpl-", "resp-", 1)
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append({"type": "message", "id": f"msg-{ident}", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for call in message.get("tool_calls") or []:
        arguments = call["function"]["arguments"]
        output.append({"type": "function_call", "id": f"fc-{call['id']}", "call_id": call["id"],
                       "name": call["function"]["name"],
                       "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                       "status": "completed"})
    if not output:  # an empty answer is still one message, as the API writes it
        output.append({"type": "message", "id": f"msg-{ident}", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": "", "annotations": []}]})
    usage = reply["usage"]
    cut = choice["finish_reason"] == "length"
    return {
        "id": ident, "object": "response", "created_at": reply["created"], "model": reply["model"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None, "instructions": body.get("instructions"), "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
        "max_output_tokens": body.get("max_output_tokens"), "temperature": None, "top_p": None,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                  "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def stream_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a streamed response, once it is generated (the gateway batches whole completions): created,
    then each output item added, its text as one delta, and done, then completed with the whole response."""
    events: list[dict[str, Any]] = [{"type": "response.created",
                                     "response": {**response, "status": "in_progress", "output": []}}]
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress", "content": []}})
            part = item["content"][0]
            events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "part": {**part, "text": ""}})
            events.append({"type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "delta": part["text"], "logprobs": []})
            events.append({"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "text": part["text"], "logprobs": []})
            events.append({"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "part": part})
        else:
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress"}})
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": index, "arguments": item["arguments"], "name": item["name"]})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    done = "response.completed" if response["status"] == "completed" else "response.incomplete"
    events.append({"type": done, "response": response})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]
