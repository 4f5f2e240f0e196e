"""Metric keys: everything per agent is ``<policy>/<agent>/...``; team outcomes are ``episode/...``."""

from __future__ import annotations

import pytest

from pettingllms.core import EpisodeRecord, Sample
from pettingllms.trainer.metrics import episode_metrics, sample_metrics


def sample(policy, agent, episode, turn, branch, reward, chosen, failed=False):
    return Sample(policy=policy, agent=agent, turn=turn, group=(0, turn, agent), episode=episode, problem_id="p",
                  branch=branch, prompt_ids=(1, 2, 3), response_ids=(4,) * (branch + 1), response_logprobs=(),
                  reward=reward, local_reward=reward, chosen=chosen, failed=failed)  # the executor's: team + local


SAMPLES = [
    # episode e0: alice (policy_0) acts at turns 0 and 1, bob (policy_1) at turn 0; two branches per node
    sample("policy_0", "alice", "e0", 0, 0, 1.0, chosen=True),
    sample("policy_0", "alice", "e0", 0, 1, 0.0, chosen=False),
    sample("policy_0", "alice", "e0", 1, 0, 0.0, chosen=False),
    sample("policy_0", "alice", "e0", 1, 1, 2.0, chosen=True),
    sample("policy_1", "bob", "e0", 0, 0, 0.5, chosen=True),
    sample("policy_1", "bob", "e0", 0, 1, 3.0, chosen=False, failed=True),  # failed: never counted
    # episode e1: only alice acts
    sample("policy_0", "alice", "e1", 0, 0, 0.0, chosen=False),
    sample("policy_0", "alice", "e1", 0, 1, 1.0, chosen=True),
]


def test_per_agent_keys_are_namespaced_by_policy_and_agent():
    metrics = sample_metrics(SAMPLES)
    pairs = {(s.policy, s.agent) for s in SAMPLES}
    for key in metrics:
        policy, agent, *rest = key.split("/")
        assert (policy, agent) in pairs and rest, key
    assert {"policy_0/alice/turn_1/reward_mean", "policy_1/bob/response_length_mean"} <= set(metrics)


def test_episode_return_follows_the_chosen_branches():
    metrics = sample_metrics(SAMPLES)
    # alice: e0 = 1.0 + 2.0, e1 = 1.0 -> mean 2.0; bob: e0 = 0.5, e1 = 0 (did not act) -> mean 0.25
    assert metrics["policy_0/alice/episode_return_mean"] == pytest.approx(2.0)
    assert metrics["policy_1/bob/episode_return_mean"] == pytest.approx(0.25)
    assert metrics["policy_1/bob/reward_mean"] == pytest.approx(0.5)  # the failed sample is left out
    assert metrics["policy_1/bob/failed_ratio"] == pytest.approx(0.5)


def test_episode_metrics_are_team_level_only():
    episodes = [EpisodeRecord("e0", "p", 2, True, False, True, 1.0, {"alice": 3.0, "bob": 0.5}),
                EpisodeRecord("e1", "p", 1, False, True, False, 0.0, {"alice": 1.0})]
    metrics = episode_metrics(episodes, prefix="val/bench")
    assert set(metrics) == {f"val/bench/{m}" for m in
                            ("success_rate", "turns_mean", "team_reward_mean", "terminated_ratio", "error_ratio",
                             "nonfinite_rewards")}
    assert metrics["val/bench/success_rate"] == 0.5 and metrics["val/bench/turns_mean"] == 1.5


def test_an_agent_whose_every_reward_was_dropped_has_no_reward_mean_not_a_measured_zero(capsys):
    """reward.non_finite=drop left all of b's rewards out: the step line averaged its 0.0 in (reward 0.500 beside a
    team reward of 1.0)."""
    from pettingllms.trainer.progress import StepProgress

    rows = [sample("policy_0", "a", "e0", 0, 0, 1.0, chosen=True),
            Sample(policy="policy_0", agent="b", turn=0, group=(0, 0, "b"), episode="e0", problem_id="p", branch=0,
                   prompt_ids=(1,), response_ids=(2,), response_logprobs=(), reward=0.0, chosen=True,
                   nonfinite_reward=True)]
    metrics = sample_metrics(rows)
    assert "policy_0/b/reward_mean" not in metrics and "policy_0/b/turn_0/reward_mean" not in metrics
    assert metrics["policy_0/b/nonfinite_rewards"] == 1.0 and metrics["policy_0/a/reward_mean"] == 1.0
    with StepProgress(total=1, done=0) as progress:
        progress.advance(1, metrics)
    assert "step 1/1 | reward 1.000" in capsys.readouterr().out  # a's mean alone
