"""The rollout's timing/generate_s and timing/env_s: wall time inside engine calls and inside env calls, as the
executor sees them, with concurrent episodes' env steps counted once."""

from __future__ import annotations

import threading
import time

from pettingllms.core import Problem
from pettingllms.envs.toy.env import TargetsEnv

SLOW = 0.05  # seconds of each slow env call


class SlowStepEnv(TargetsEnv):
    """Every step takes SLOW seconds (a sandboxed program, say); the executor runs them in threads."""

    def step(self, state, agent, action):
        time.sleep(SLOW)
        return super().step(state, agent, action)


class SlowScoringEnv(TargetsEnv):
    """reset and team_reward take SLOW seconds each and count their calls (both run on the executor's thread)."""

    def __init__(self, **options):
        super().__init__(**options)
        self.calls = 0
        self._lock = threading.Lock()

    def _slow(self):
        with self._lock:
            self.calls += 1
        time.sleep(SLOW)

    def reset(self, problem, seed):
        self._slow()
        return super().reset(problem, seed)

    def team_reward(self, state):
        self._slow()
        return super().team_reward(state)


def problems(n: int) -> list[Problem]:
    return [Problem(f"q{i}", {"prompt": f"task {i}"}) for i in range(n)]


def test_concurrent_env_steps_count_once_so_generation_and_env_fit_in_the_rollout(make_executor):
    env = SlowStepEnv(max_turns=2, threshold=2.0)  # never terminates: every turn runs
    executor, _ = make_executor(env, lambda prompt, k, request: "abab", branching=2)
    timings = executor.run(problems(4), seeds=[0, 1, 2, 3]).timings
    # 4 episodes step their candidates at the same time: summed per episode, env_s was about 4x the wall time.
    assert timings["env_s"] + timings["generate_s"] <= timings["rollout_s"]
    assert timings["env_s"] >= 2 * 2 * SLOW  # turns x agents: at least one slow step after another
    assert timings["generate_s"] > 0 and timings["generate_calls"] == 4  # one flush per (turn, agent)


def test_reset_and_reward_computation_count_as_env_time(make_executor):
    env = SlowScoringEnv(max_turns=1, threshold=2.0)
    executor, _ = make_executor(env, lambda prompt, k, request: "abab", branching=2)
    timings = executor.run(problems(2), seeds=[0, 1]).timings
    # These calls run one after another on the executor's thread, so their seconds add up inside env_s.
    assert env.calls >= 2 + 2 * 2 * 2  # resets, then a reward per candidate (2 problems x 2 agents x K=2)
    assert timings["env_s"] >= env.calls * SLOW
    assert timings["env_s"] + timings["generate_s"] <= timings["rollout_s"]
