"""Agents played by a model behind an OpenAI-compatible server (``agents.<role>.server.url``), in training and in
evaluation: a fixed opponent (or teammate) in any env, beside agents that train.

The agent's prompts are rendered by its policy's chat template (``agents.<role>.policy``: its tokenizer) and sent to
the server's ``/v1/completions`` as token ids or text (``prompt_format``) by the bounded client of
``rollout/openai_engine.py`` (a total deadline per request, a reply size cap, every reply checked); a request that
still fails after its retries is a failed generation, as for any engine. Each server is checked (its model listed)
before anything runs. Such an agent never trains (``trainable=false`` is required), so its token ids and
log-probabilities only need to be good enough to play.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pettingllms.assembly.plan import RunPlan
from pettingllms.rollout.policy_client import LocalPolicyClient, PolicyClient
from pettingllms.runtime.serving import served_engine


@dataclass
class ServedAgents:
    clients: dict[str, PolicyClient]  # "server:<role>" -> a client over the server
    engines: dict[str, Any]  # the same names -> their OpenAICompletionsEngine (stats, close)
    described: dict[str, dict[str, Any]]

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()


def served_agents(run_plan: RunPlan, clients: Mapping[str, PolicyClient]) -> ServedAgents:
    """A client for every served agent of ``run_plan``, its prompts encoded by ``clients[agent's policy].codec``."""
    out = ServedAgents({}, {}, {})
    try:
        for name, (policy, server) in run_plan.servers.items():
            codec = clients[policy].codec
            model = server.model or run_plan.policies[policy].model.path
            engine = served_engine(server.url, model, codec, api_key_env=server.api_key_env,
                                   prompt_format=server.prompt_format, vllm_extras=server.vllm_extras,
                                   timeout_s=server.timeout_s, max_retries=server.max_retries)
            out.engines[name] = engine
            engine.check_server()
            out.clients[name] = LocalPolicyClient(engine, codec)
            out.described[name] = {"server_url": server.url, "model": model, "engine": "openai",
                                   "chat_template_of": policy}
    except BaseException:
        out.close()
        raise
    return out
