"""The gateway: an OpenAI-compatible HTTP server over the run's policies, for agent programs (``core/program.py``).

A program's agents name themselves in each request's ``model``; the gateway routes the request to that agent's
policy (and LoRA adapter), samples with that agent's settings, and records the call: the exact prompt token ids as
the policy's chat template renders the messages, the sampled token ids and their log-probabilities. Training uses
those ids (nothing is re-tokenised).

- aiohttp, on 127.0.0.1 and a free port, in a thread of its own with its own event loop, so a program that calls
  it with a blocking client (``openai.OpenAI``) from ``async def run`` slows only itself;
- ``POST /v1/chat/completions``, ``POST /v1/responses`` (OpenAI's Responses API, the Agents SDK's default model
  class; translated to a chat completion and back, ``rollout/responses_api.py``) and ``GET /v1/models``. Bearer token: ``<secret>.<run id>``, a fresh secret per
  gateway and one key per program run (``key_for``), so every call is attributed to its run without the program's
  help. 401 for another key, 404 for an unknown ``model`` (listing the agents), 400 naming the field for a malformed
  request or one the gateway does not serve (``n`` > 1, ``tool_choice`` forcing a call, ``tools`` for a model whose
  template defines none), 400 for a prompt over ``training.max_prompt_length``; ``stream=true`` is answered as
  server-sent events, the whole message in one delta once generated;
- tools: a request's ``tools`` are rendered by the policy's chat template into the prompt, and the model's
  ``<tool_call>`` blocks come back as ``tool_calls`` (``rollout/tool_calls.py``); the program runs the tools and sends
  their results back as ``tool`` messages, which the template renders into the next call's prompt;
- sampling is the agent's (``agents.<role>.train_sampling`` in training, ``val_sampling`` in validation): a
  request's ``temperature``/``top_p``, penalties, ``logit_bias``, ``seed`` and ``response_format`` are ignored
  (logged once each); its ``max_tokens`` (or ``max_completion_tokens``) can only lower the agent's, which
  ``training.max_response_length`` caps; ``stop`` ends the completion and ``logprobs`` returns the sampled tokens'
  (``rollout/request_fields.py``);
- requests are batched per policy as they stream in: the first waits ``BATCH_WINDOW_S`` for others to join, and
  while a batch generates the next one gathers (no run waits for the slowest run of the step to ask).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pettingllms.core.part_clock import PartClock
from pettingllms.core.types import FINISH_ERROR, Completion, GenerationRequest, GenerationResult, SamplingParams
from pettingllms.rollout import responses_api
from pettingllms.rollout.policy_client import PolicyClient
from pettingllms.rollout.request_error import RequestError
from pettingllms.rollout.request_fields import (
    FieldError, IgnoredFields, cut_at_stop, logprobs_content, stop_strings, wants_logprobs,
)
from pettingllms.rollout.tool_calls import parse_tool_calls, tool_call_format

log = logging.getLogger(__name__)
BATCH_WINDOW_S = 0.01
GENERATE = "generate"


@dataclass(frozen=True)
class Route:
    """An agent as the gateway serves it."""

    policy: str
    adapter: str | None
    sampling: SamplingParams


@dataclass(frozen=True)
class Call:
    """One answered request of a program run."""

    run: str
    agent: str
    index: int  # the agent's calls in its run, in order
    order: int  # the run's calls, in the order they were asked
    prompt_ids: tuple[int, ...]
    completion: Completion
    sampling: SamplingParams


class _Batches:
    """One policy's requests, batched as they arrive (see the module docstring)."""

    def __init__(self, client: PolicyClient, clock: PartClock) -> None:
        self.client, self.clock = client, clock
        self.pending: list[tuple[GenerationRequest, asyncio.Future]] = []
        self.task: asyncio.Task | None = None

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((request, future))
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        await asyncio.sleep(BATCH_WINDOW_S)
        while self.pending:
            batch, self.pending = self.pending, []
            try:
                with self.clock.part(GENERATE):
                    results = await self.client.generate([request for request, _ in batch])
            except Exception as exc:  # every waiting request learns why
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)


class Gateway:
    """Start with ``start()``; ``open(routes)`` before a rollout sets who is served and how; ``key_for(run)`` gives
    a program run its key; ``calls(run)`` what it asked and got; ``close()`` at the end."""

    def __init__(self, clients: Mapping[str, PolicyClient], max_prompt_length: int, max_response_length: int) -> None:
        self.clients = dict(clients)
        self.max_prompt_length = max_prompt_length
        self.max_response_length = max_response_length
        self.clock = PartClock()
        self._secret = secrets.token_urlsafe(24)
        self._routes: dict[str, Route] = {}
        self._runs: set[str] = set()
        self._calls: dict[str, list[Call]] = defaultdict(list)
        self._issued: dict[tuple[str, str], int] = defaultdict(int)  # (run, agent) -> requests so far
        self._asked: dict[str, int] = defaultdict(int)  # run -> requests so far
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner = None
        self._batches: dict[str, _Batches] = {}
        self.base_url = ""
        self.requests = 0
        self.refused: dict[int, int] = defaultdict(int)  # HTTP status -> count
        self._ignored = IgnoredFields()  # request fields the agent's own settings override, logged once each

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> "Gateway":
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:  # reported by start(), in the caller's thread
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="pettingllms-gateway", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        return self

    async def _start_site(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=16 * 2**20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # aiohttp exposes the bound port only here
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._batches = {policy: _Batches(client, self.clock) for policy, client in self.clients.items()}

    def close(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop = self._thread = None

    # ------------------------------------------------------------------------------------------ runs
    def open(self, routes: Mapping[str, Route], runs: Iterable[str]) -> None:
        """Serve these agents (agent -> route) to these runs from now on; forget every earlier run and its calls (a
        run that outlived its rollout is refused with 401)."""
        unknown = sorted({r.policy for r in routes.values()} - set(self.clients))
        if unknown:
            raise ValueError(f"routes name policies {unknown} the gateway has no client for")
        with self._lock:
            self._routes = dict(routes)
            self._runs = set(runs)
            self._calls.clear()
            self._issued.clear()
            self._asked.clear()

    def key_for(self, run: str) -> str:
        return f"{self._secret}.{run}"

    def end(self, run: str) -> list[Call]:
        """Close ``run`` (its program returned, failed or timed out) and return its answered calls, in the order they
        were asked. A later request of that run is refused (401) and a call still being generated is not recorded:
        the program never read those answers, so the run's reward must not train them."""
        with self._lock:
            self._runs.discard(run)
            return sorted(self._calls.get(run, []), key=lambda c: c.order)

    def calls(self, run: str) -> list[Call]:
        """The run's answered calls, in the order they were asked."""
        with self._lock:
            return sorted(self._calls.get(run, []), key=lambda c: c.order)

    # ------------------------------------------------------------------------------------------ HTTP
    async def _models(self, request) -> Any:
        from aiohttp import web

        try:
            self._run_of(request)
        except RequestError as exc:
            return self._error(exc)
        now = int(time.time())
        return web.json_response({"object": "list", "data": [
            {"id": agent, "object": "model", "created": now, "owned_by": "pettingllms"} for agent in self._routes]})

    async def _chat(self, request) -> Any:
        from aiohttp import web

        answered = await self._answer(request, lambda body: body)
        if not isinstance(answered, tuple):
            return answered  # the error's response
        body, reply = answered
        if body.get("stream"):
            return await self._stream(request, reply, body)
        return web.json_response(reply)

    async def _responses(self, request) -> Any:
        """OpenAI's Responses API, translated to a chat completion and back (``rollout/responses_api.py``)."""
        from aiohttp import web

        answered = await self._answer(request, responses_api.chat_body)
        if not isinstance(answered, tuple):
            return answered
        body, reply = answered
        try:
            response = responses_api.response_object(reply, body)
        except Exception as exc:  # ours: the program gets the reason, the log the traceback
            log.exception("the gateway failed to answer a Responses request")
            return self._error(RequestError(500, f"the gateway failed: {type(exc).__name__}: {exc}", "server_error"))
        if not body.get("stream"):
            return web.json_response(response)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        for event in responses_api.stream_events(response):
            await stream.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        await stream.write_eof()
        return stream

    async def _answer(self, request, to_chat) -> Any:
        """(the request's body, the chat reply) for an authorised request whose body ``to_chat`` turns into a chat
        completion request; or the error's response."""
        from aiohttp import web

        try:
            run = self._run_of(request)
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
                raise RequestError(400, f"the request body is not JSON: {exc}") from exc
            return body, await self._complete(run, to_chat(body))
        except RequestError as exc:
            return self._error(exc)
        except web.HTTPException as exc:  # aiohttp's own refusal (a body over client_max_size: 413) keeps its status
            return self._error(RequestError(exc.status, exc.reason or exc.text or "refused", "invalid_request_error"))
        except Exception as exc:  # the engine's or ours: the program gets the reason, the log the traceback
            log.exception("the gateway failed to answer a request")
            return self._error(RequestError(500, f"the gateway failed: {type(exc).__name__}: {exc}", "server_error"))

    async def _stream(self, request, reply: dict[str, Any], body: dict[str, Any]) -> Any:
        """A completion as server-sent events, for clients that stream: the whole message in one delta once it is
        generated (the gateway batches whole completions; it does not stream tokens), then the finish reason, the
        usage when ``stream_options.include_usage`` asks for it, and ``[DONE]``."""
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        head = {key: reply[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        (choice,) = reply["choices"]
        delta = {key: value for key, value in choice["message"].items() if value is not None}
        if "tool_calls" in delta:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
        first = {"index": 0, "delta": delta, "finish_reason": None}
        if choice.get("logprobs") is not None:  # asked for: they come with the content they score
            first["logprobs"] = choice["logprobs"]
        chunks = [{**head, "choices": [first]},
                  {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
        if isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage"):
            chunks.append({**head, "choices": [], "usage": reply["usage"]})
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _error(self, exc: RequestError) -> Any:
        from aiohttp import web

        self.refused[exc.status] += 1
        return web.json_response({"error": {"message": str(exc), "type": exc.code, "code": exc.status}},
                                 status=exc.status)

    def _run_of(self, request) -> str:
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        secret, dot, run = key.partition(".")
        if scheme.lower() != "bearer" or not dot or not run or \
                not secrets.compare_digest(secret.encode(errors="replace"), self._secret.encode()):
            raise RequestError(401, "missing or wrong bearer token: use the api_key the run gave the program",
                               "authentication_error")
        with self._lock:
            if run not in self._runs:
                raise RequestError(401, f"program run {run!r} has ended (its rollout is over)", "authentication_error")
        return run

    async def _complete(self, run: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
        agent = body.get("model")
        route = self._routes.get(agent) if isinstance(agent, str) else None
        if route is None:
            raise RequestError(404, f"model {agent!r} is not an agent of this run; its agents: {list(self._routes)} "
                                    "(a program's agents name themselves in `model`)", "model_not_found")
        messages = _messages(body.get("messages"))
        if body.get("n") not in (None, 1):
            raise RequestError(400, f"`n`={body.get('n')!r} is not served: one completion per request")
        if body.get("stream") not in (None, False, True):
            raise RequestError(400, f"`stream`={body.get('stream')!r} must be true or false")
        try:
            stops, logprobs = stop_strings(body), wants_logprobs(body)
        except FieldError as exc:
            raise RequestError(400, str(exc)) from exc
        self._ignored.note(body, agent)
        client = self.clients[route.policy]
        tools = _tools(body, client.codec, route.policy)
        prompt_ids = tuple(client.codec.encode_chat(messages, tools) if tools else client.codec.encode_chat(messages))
        if len(prompt_ids) > self.max_prompt_length:
            raise RequestError(400, f"`messages`: the prompt is {len(prompt_ids)} tokens, over "
                                    f"training.max_prompt_length={self.max_prompt_length}")
        sampling = dataclasses.replace(route.sampling, max_tokens=self._max_tokens(body, route.sampling))
        with self._lock:
            index = self._issued[(run, agent)]  # in the order the requests came, concurrent ones included
            self._issued[(run, agent)] += 1
            order = self._asked[run]
            self._asked[run] += 1
            self.requests += 1
        result = await self._batches[route.policy].generate(GenerationRequest(
            request_id=f"{run}/{agent}/{index}", prompt_ids=prompt_ids, n=1, sampling=sampling,
            adapter=route.adapter, prefix_group=run))
        completion = cut_at_stop(result.completions[0], stops, client.codec.decode)  # unchanged without a stop
        with self._lock:
            if run not in self._runs:
                raise RequestError(401, f"program run {run!r} ended while this call was generated",
                                   "authentication_error")
            self._calls[run].append(Call(run, agent, index, order, prompt_ids, completion, sampling))
        if completion.finish_reason == FINISH_ERROR:  # recorded (its sample is masked); the program must not go on
            raise RequestError(500, f"the engine failed to generate this request of agent {agent!r} (the run's log "
                                    "says why)", "server_error")
        finish = "length" if completion.finish_reason == "length" else "stop"
        message: dict[str, Any] = {"role": "assistant", "content": completion.text}
        if tools and body.get("tool_choice") != "none":
            content, tool_calls = parse_tool_calls(completion.text, f"call-{run}-{agent}-{index}")
            if tool_calls:
                message, finish = {"role": "assistant", "content": content, "tool_calls": tool_calls}, "tool_calls"
        return {
            "id": f"chatcmpl-{run}-{agent}-{index}", "object": "chat.completion", "created": int(time.time()),
            "model": agent,
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": logprobs_content(completion, client.codec.decode) if logprobs else None}],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion.token_ids),
                      "total_tokens": len(prompt_ids) + len(completion.token_ids)},
        }

    def _max_tokens(self, body: dict, sampling: SamplingParams) -> int:
        limit = min(sampling.max_tokens, self.max_response_length)
        asked = next((body[key] for key in ("max_completion_tokens", "max_tokens") if body.get(key) is not None), None)
        if asked is None:
            return limit
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
            raise RequestError(400, f"`max_tokens`={asked!r} must be a positive integer")
        return min(asked, limit)


ROLES = frozenset({"system", "user", "assistant", "tool"})
# OpenAI's newer name for the system role: chat templates know only "system" (Qwen3's drops any other role unsaid)
ROLE_ALIASES = {"developer": "system"}


def _messages(value: Any) -> list[dict[str, Any]]:
    """The chat messages of a request: role and text content (a list of text parts is joined), an assistant's
    ``tool_calls`` and a tool reply's ``tool_call_id`` kept for the chat template."""
    if not isinstance(value, list) or not value:
        raise RequestError(400, "`messages` must be a non-empty list of {role, content} objects")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, f"`messages[{i}]` must be an object with a string `role`")
        role = ROLE_ALIASES.get(message["role"], message["role"])
        if role not in ROLES:
            raise RequestError(400, f"`messages[{i}].role`={message['role']!r} is not served; roles: "
                                    f"{sorted(ROLES | set(ROLE_ALIASES))}")
        content = message.get("content")
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            if any(not isinstance(p, str) for p in parts) or len(parts) != len(content):
                raise RequestError(400, f"`messages[{i}].content`: only text parts are served")
            content = "".join(parts)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise RequestError(400, f"`messages[{i}].content` must be a string or a list of text parts")
        kept: dict[str, Any] = {"role": role, "content": content}
        if message.get("tool_calls") is not None:
            kept["tool_calls"] = _tool_calls(message["tool_calls"], i)
        if isinstance(message.get("tool_call_id"), str):
            kept["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str) and role == "tool":
            kept["name"] = message["name"]
        out.append(kept)
    return out


def _tool_calls(value: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``, as the OpenAI client sends them back."""
    field_name = f"`messages[{i}].tool_calls`"
    if not isinstance(value, list):
        raise RequestError(400, f"{field_name} must be a list")
    calls = []
    for j, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                not isinstance(function.get("arguments", "{}"), (str, dict)):
            raise RequestError(400, f"{field_name}[{j}] must be {{id, type: function, function: {{name, arguments}}}}")
        calls.append({"id": call.get("id"), "type": "function",
                      "function": {"name": function["name"], "arguments": function.get("arguments", "{}")}})
    return calls


def _tools(body: dict, codec: Any, policy: str) -> list[dict[str, Any]] | None:
    """The request's ``tools`` (function schemas), checked, when the policy's chat template defines tools."""
    if body.get("functions") or body.get("function_call"):
        raise RequestError(400, "`functions`: the legacy function-calling fields are not served; send `tools`")
    tools = body.get("tools")
    if not tools:
        if body.get("tool_choice") not in (None, "auto", "none"):
            raise RequestError(400, f"`tool_choice`={body['tool_choice']!r} without `tools`: there is no tool to call")
        return None
    if not isinstance(tools, list):
        raise RequestError(400, "`tools` must be a list of {type: function, function: {name, parameters}} objects")
    for j, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(400, f"`tools[{j}]` must be {{type: function, function: {{name, parameters}}}}")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(400, f"`tool_choice`={choice!r} is not served: the model chooses whether to call a tool "
                                "(`auto`, or `none` to read its answer as text)")
    if tool_call_format(getattr(codec, "chat_template", None)) is None:
        raise RequestError(400, f"`tools`: the chat template of {policy}'s model defines no tool-call format the "
                                "gateway parses (Hermes-style <tool_call> blocks, as Qwen2.5 and Qwen3 write them)")
    return tools
