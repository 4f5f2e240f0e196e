"""Shared fixtures: a scripted two-agent setup that needs no model."""

from __future__ import annotations

import os
from typing import Callable

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def make_executor() -> Callable:
    """Build an Executor over the toy env with one scripted policy per entry of ``scripts``."""
    from pettingllms.core import SamplingParams
    from pettingllms.core.registry import make_agents
    from pettingllms.rollout.executor import AgentSpec, Executor
    from settings_support import executor_config
    from pettingllms.rollout.policy_client import LocalPolicyClient
    from pettingllms.rollout.scripted import ScriptedEngine

    def build(env, script, policies=None, adapters=None, **rollout):
        agents = make_agents(env)
        policies = policies or {name: "policy_0" for name in agents}
        engines = {p: ScriptedEngine(script) for p in set(policies.values())}
        sampling = SamplingParams(max_tokens=10_000)
        specs = {
            name: AgentSpec(agent, policies[name], sampling, sampling, (adapters or {}).get(name))
            for name, agent in agents.items()
        }
        clients = {p: LocalPolicyClient(e, e.codec) for p, e in engines.items()}
        rollout.setdefault("max_prompt_length", 100_000)
        rollout.setdefault("max_response_length", 100_000)
        return Executor(env, specs, clients, executor_config(**rollout)), engines

    return build


@pytest.fixture
def run_shell() -> Callable:
    """Run a shell command in its own session; on timeout stop that whole session (the command's Ray instance,
    sandbox workers, ...) so nothing it started outlives the test. Returns (returncode, stdout, stderr)."""
    import signal
    import subprocess

    def run(command: str, cwd, env, timeout: float) -> tuple[int, str, str]:
        proc = subprocess.Popen(command, shell=True, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:  # timeout, or pytest-timeout interrupting this test
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)  # the session this command started, and only it
                    proc.wait(timeout=30)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            raise
        return proc.returncode, out, err

    return run
