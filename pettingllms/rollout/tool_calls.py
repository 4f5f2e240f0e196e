"""Tool calls through the agent-program gateway: what a request's ``tools`` and a model's answer become.

A chat template that defines tools renders the request's tool schemas into the prompt itself (the gateway passes
them to ``apply_chat_template``), so the prompt ids the learner trains on are exactly what the model read. What the
model writes back is parsed here into OpenAI ``tool_calls``. One format is parsed: the Hermes style that Qwen2.5,
Qwen3 and many others use, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call, text
around them kept as the message's content. A block that is not such JSON (a small model's slip, or one cut by
``max_tokens``) is left as text: the program sees what the model wrote, and the sample trains on exactly it.
"""

from __future__ import annotations

import json
import re
from typing import Any

HERMES = "hermes"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def tool_call_format(chat_template: str | None) -> str | None:
    """The tool-call format a chat template uses, or None when it defines no tools (or one not parsed here)."""
    if chat_template and "tools" in chat_template and "<tool_call>" in chat_template:
        return HERMES
    return None


def parse_tool_calls(text: str, id_prefix: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a completion's text: each well-formed ``<tool_call>`` block becomes
    ``{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}``; the rest of the text, stripped,
    is the content (None when nothing is left and there were calls)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1))
        if call is None:
            continue  # not a call: it stays in the text
        kept.append(text[position:match.start()])
        position = match.end()
        name, arguments = call
        calls.append({"id": f"{id_prefix}-{len(calls)}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    kept.append(text[position:])
    content = "".join(kept).strip()
    return (content or None) if calls else text, calls


def _call(block: str) -> tuple[str, Any] | None:
    try:
        payload = json.loads(block)
    except ValueError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return payload["name"], arguments
