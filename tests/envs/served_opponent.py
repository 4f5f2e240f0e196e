"""The run's own gateway as a game opponent's server, for the ``env.options.opponent=server`` tests of both game
adapters: model ``rival`` (a scripted policy) served to one run, ``game``, its key in an environment variable."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from pettingllms.core.types import SamplingParams
from pettingllms.rollout.gateway import Gateway, Route
from pettingllms.rollout.policy_client import LocalPolicyClient
from pettingllms.rollout.scripted import Script, ScriptedEngine


@contextmanager
def serving_rival(script: Script, monkeypatch, key_env: str) -> Iterator[Gateway]:
    engine = ScriptedEngine(script)
    gateway = Gateway({"rival": LocalPolicyClient(engine, engine.codec)}, max_prompt_length=100_000,
                      max_response_length=64).start()
    try:
        gateway.open({"rival": Route("rival", None, SamplingParams(temperature=0.0, max_tokens=32))}, runs=["game"])
        monkeypatch.setenv(key_env, gateway.key_for("game"))
        yield gateway
    finally:
        gateway.close()
