"""Trajectory mode (the peers' multi-turn GRPO, a baseline): K independent episodes per problem, one group per
(problem, agent) over every turn of the K episodes, every sample scored with its episode's return."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict

import pytest

from pettingllms.algo.grpo import AdvantageConfig, score_samples
from pettingllms.core import Problem
from pettingllms.envs.toy.env import TargetsEnv
from pettingllms.rollout.executor import WHOLE_EPISODE

TEXTS = ["aaaa", "abab", "bbbb", "xyzw"]


def problems(n: int) -> list[Problem]:
    return [Problem(f"q{i}", {"prompt": f"task {i}"}) for i in range(n)]


def by_episode(prompt: str, k: int, request) -> str:
    """Episode e always writes TEXTS[e] (the id ends in ...e<e>/t<turn>/<agent>): episodes differ, turns repeat."""
    episode = int(request.request_id.split("/")[0].split("e")[-1])
    return TEXTS[episode % len(TEXTS)]


def test_one_group_per_problem_and_agent_over_all_turns_of_the_k_episodes(make_executor):
    env = TargetsEnv(max_turns=3, threshold=2.0)  # never solved: every episode runs 3 turns
    executor, _ = make_executor(env, by_episode, branching=4, mode="trajectory")
    result = executor.run(problems(3), seeds=[0, 1, 2])
    sizes = Counter(s.group for s in result.samples)
    assert set(sizes) == {(slot, WHOLE_EPISODE, agent) for slot in range(3) for agent in ("alice", "bob")}
    assert set(sizes.values()) == {4 * 3}  # K episodes x 3 turns, one sample each
    for slot in range(3):  # no group mixes problems
        assert {s.problem_id for s in result.samples if s.group[0] == slot} == {f"q{slot}"}
    assert len(result.episodes) == 3 * 4


def test_every_sample_carries_its_episodes_return(make_executor):
    env = TargetsEnv(max_turns=2, threshold=2.0)
    executor, _ = make_executor(env, by_episode, branching=4, mode="trajectory", alpha=0.5)
    result = executor.run(problems(1), seeds=[0])
    records = {e.episode: e for e in result.episodes}
    local = defaultdict(float)
    for s in result.samples:
        local[(s.episode, s.agent)] += s.local_reward
    for s in result.samples:
        expected = 0.5 * records[s.episode].team_reward + local[(s.episode, s.agent)]
        assert s.reward == pytest.approx(expected)
    by_episode_reward = {(s.episode, s.agent): s.reward for s in result.samples}
    assert len(set(by_episode_reward.values())) > 1  # different episodes, different returns


def test_samples_are_made_final_and_nothing_can_regroup_or_rescore_them(make_executor):
    env = TargetsEnv(max_turns=2, threshold=2.0)
    executor, _ = make_executor(env, by_episode, branching=2, mode="trajectory")
    samples = executor.run(problems(1), seeds=[0]).samples
    for sample in samples:
        for name, value in (("group", (0, sample.turn, sample.agent)), ("reward", 123.0), ("nonfinite_reward", True)):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(sample, name, value)
        assert sample.group == (0, WHOLE_EPISODE, sample.agent) and sample.reward != 123.0
    changed = dataclasses.replace(samples[0], reward=123.0)  # the way to a changed copy
    assert changed.reward == 123.0 and samples[0].reward != 123.0


@pytest.mark.parametrize("mode, unit", [("tree", "sample"), ("independent", "sample"), ("trajectory", "episode")])
def test_the_group_statistics_count_what_the_rollout_mode_makes(mode, unit):
    from pettingllms.assembly.plan import plan
    from pettingllms.entry.train import load_config

    run_plan = plan(load_config("train", ["env.name=toy_targets", f"rollout.mode={mode}"]), check_memory=False)
    assert run_plan.executor_config.mode == mode
    assert run_plan.advantage_config.unit == run_plan.executor_config.advantage_unit == unit


def test_group_statistics_count_each_episode_once_and_failed_samples_never(make_executor):
    env = TargetsEnv(max_turns=2, threshold=2.0)
    executor, _ = make_executor(env, by_episode, branching=4, mode="trajectory")
    samples = executor.run(problems(2), seeds=[0, 1]).samples
    samples[0] = dataclasses.replace(samples[0], failed=True)  # a failed generation: out of the statistics and the loss
    scored = score_samples(samples, AdvantageConfig(unit="episode", eps=0.0))
    for slot in range(2):
        for agent in ("alice", "bob"):
            members = [i for i, s in enumerate(samples) if s.group == (slot, WHOLE_EPISODE, agent) and not s.failed]
            returns = {samples[i].episode: samples[i].reward for i in members}  # one value per episode
            mean = sum(returns.values()) / len(returns)
            std = math.sqrt(sum((r - mean) ** 2 for r in returns.values()) / (len(returns) - 1))
            for i in members:
                assert scored.advantages[i] == pytest.approx((samples[i].reward - mean) / std)
    assert scored.in_loss[0] is False and scored.advantages[0] == 0.0
    with pytest.raises(ValueError, match="unit must be"):
        AdvantageConfig(unit="turn")


def test_the_trainer_runs_trajectory_grpo(tmp_path):
    import json

    from pettingllms.entry.train import run_training

    trainer, _ = run_training("train", [
        "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=2",
        "rollout.mode=trajectory", "rollout.branching=3", "training.train_batch_size=2",
        "training.total_training_steps=2", "training.max_response_length=5", "training.val_freq=0",
        "training.export_hf=false", "training.plot=false", "training.resume=none", "resources.use_ray=false",
        "+agents.alice.train_sampling.max_tokens=5", "+agents.bob.train_sampling.max_tokens=5",
        f"training.log_dir={tmp_path}",
    ])
    rows = [json.loads(line) for line in (trainer.run_dir / "summary.log").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["policy_0/grpo/groups"] == 2 * 2 for r in rows)  # problems x agents, whatever the turns
