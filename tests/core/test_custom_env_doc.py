"""Runs the worked example in docs/custom_env.md: a user's env works by name with no platform edit."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pettingllms.cli import main
from pettingllms.core import Problem, SamplingParams
from pettingllms.core.checker import check_env
from pettingllms.core.env import make_agents
from pettingllms.core.registry import get_env_class
from pettingllms.rollout.executor import AgentSpec, Executor, RolloutConfig
from pettingllms.rollout.policy_client import LocalPolicyClient
from pettingllms.rollout.scripted import ScriptedEngine

DOC = Path(__file__).resolve().parents[2] / "docs" / "custom_env.md"


def install_example(tmp_path, monkeypatch):
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)[0]
    package = tmp_path / "my_envs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "guess.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("my_envs")]:
        del sys.modules[name]


def test_doc_example_passes_check_env_and_rolls_out(tmp_path, monkeypatch, capsys):
    install_example(tmp_path, monkeypatch)
    assert main(["check-env", "my_envs.guess:GuessEnv"]) == 0, capsys.readouterr().out

    env = get_env_class("my_envs.guess:GuessEnv")(max_turns=3)
    assert check_env(env).ok
    assert get_env_class("guess") is type(env)  # the module's register_env ran on import

    def script(prompt, k, request):
        if "Guess my number" in prompt:
            return str(k + 1)  # K=9 candidates cover every number: one of them is right
        guess = re.search(r"The guess is (\d+)", prompt).group(1)
        secret = re.search(r"The secret is (\d+)", prompt).group(1)
        return "yes" if guess == secret else "no"

    engine = ScriptedEngine(script)
    sampling = SamplingParams(max_tokens=50)
    specs = {n: AgentSpec(a, "p", sampling, sampling) for n, a in make_agents(env).items()}
    executor = Executor(env, specs, {"p": LocalPolicyClient(engine, engine.codec)},
                        RolloutConfig(branching=9, max_prompt_length=10_000))
    result = executor.run([Problem("g0"), Problem("g1")], seeds=[3, 4])
    assert all(e.success and e.terminated and e.turns == 1 for e in result.episodes)
    guesser_rewards = [s.reward for s in result.samples if s.agent == "guesser" and s.group[0] == 0]
    assert sorted(guesser_rewards) == [0.0] * 8 + [1.0]
