"""Every sample records the temperature its response was sampled with (the learner divides its logits by it)."""

from __future__ import annotations

from pettingllms.core import Problem, SamplingParams
from pettingllms.core.registry import make_agents
from pettingllms.envs.toy.env import TargetsEnv
from pettingllms.rollout.executor import AgentSpec, Executor
from settings_support import executor_config
from pettingllms.rollout.policy_client import LocalPolicyClient
from pettingllms.rollout.scripted import ScriptedEngine


def test_samples_carry_their_agents_sampling_temperature_in_training_and_validation():
    env = TargetsEnv(max_turns=2, threshold=2.0)
    engine = ScriptedEngine(lambda prompt, k, request: "ab"[k % 2] * 3)
    train = {"alice": SamplingParams(temperature=0.7, max_tokens=50),
             "bob": SamplingParams(temperature=1.3, max_tokens=50)}
    validation = SamplingParams(temperature=0.0, max_tokens=50)
    specs = {name: AgentSpec(agent, "policy_0", train[name], validation) for name, agent in make_agents(env).items()}
    executor = Executor(env, specs, {"policy_0": LocalPolicyClient(engine, engine.codec)},
                        executor_config(branching=2, max_prompt_length=10_000, max_response_length=10_000))
    problems = [Problem("q0", {"prompt": "task"})]
    samples = executor.run(problems, seeds=[0]).samples
    assert {s.agent for s in samples} == {"alice", "bob"}
    assert all(s.temperature == train[s.agent].temperature for s in samples)
    validated = executor.run(problems, seeds=[0], validation=True).samples
    assert validated and all(s.temperature == 0.0 for s in validated)
