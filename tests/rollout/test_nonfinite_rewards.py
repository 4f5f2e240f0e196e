"""A NaN or infinite reward never passes silently: by default it stops the rollout naming the env, agent, turn,
problem and output; with reward.non_finite=drop the sample leaves its group (the finite members keep their signal),
is never the branch continued, and is counted. Every rollout mode, scripted policies, no model."""

from __future__ import annotations

import math

import pytest
from nonfinite_support import NaNOnGarbageEnv

from pettingllms.algo.grpo import AdvantageConfig, score_samples
from pettingllms.core import EnvError, Problem
from pettingllms.envs.toy.env import TargetsEnv, TargetWriter, target_score
from pettingllms.trainer.metrics import episode_metrics, sample_metrics

# alice's target is "a": "bbbb" and "xyzw" hold none, so NaNOnGarbageEnv's team reward is NaN after them.
TEXTS = ["aaaa", "abab", "bbbb", "xyzw"]


def problems(n: int) -> list[Problem]:
    return [Problem(f"q{i}", {"prompt": f"task {i}"}) for i in range(n)]


def by_branch_or_episode(prompt: str, k: int, request) -> str:
    """Tree mode: candidate k writes TEXTS[k]. Independent/trajectory (n=1): episode e writes TEXTS[e]."""
    head = request.request_id.split("/")[0]  # p<slot> or p<slot>e<episode>
    return TEXTS[(k + (int(head.split("e")[1]) if "e" in head else 0)) % len(TEXTS)]


@pytest.mark.parametrize("mode", ["tree", "independent", "trajectory"])
def test_a_nan_team_reward_stops_the_rollout_naming_agent_turn_problem_and_output(make_executor, mode):
    executor, _ = make_executor(NaNOnGarbageEnv(max_turns=2), by_branch_or_episode, branching=4, mode=mode)
    with pytest.raises(EnvError) as caught:
        executor.run(problems(1), seeds=[0])
    message = str(caught.value)
    for part in ("team_reward=nan", "NaNOnGarbageEnv", "problem 'q0'", "turn 0", "agent 'alice'",
                 "reward.non_finite=drop"):
        assert part in message, message
    assert "output 'bbbb'" in message or "output 'xyzw'" in message, message
    assert "\n" not in message


class InfOnGarbageWriter(TargetWriter):
    """A local reward of -inf (a log of 0) when the answer holds none of the agent's target character."""

    def local_reward(self, state) -> float:
        score = target_score(state.answer(self.name), state.target(self.name))
        return math.log(score) if score > 0 else -math.inf


class InfLocalEnv(TargetsEnv):
    agent_class = f"{__name__}:InfOnGarbageWriter"


def test_an_infinite_local_reward_stops_the_rollout_quoting_a_long_output_cut_short(make_executor):
    long_garbage = "z" * 5000
    executor, _ = make_executor(InfLocalEnv(max_turns=1), lambda p, k, r: "aaaa" if k == 0 else long_garbage,
                                branching=2)
    with pytest.raises(EnvError, match=r"alice\.local_reward=-inf .*agent 'alice'") as caught:
        executor.run(problems(1), seeds=[0])
    message = str(caught.value)
    assert "(5000 chars)" in message and long_garbage not in message and len(message) < 700


def test_drop_leaves_the_sample_out_of_its_group_and_the_finite_members_keep_their_signal(make_executor):
    executor, _ = make_executor(NaNOnGarbageEnv(max_turns=1), by_branch_or_episode, branching=4,
                                non_finite="drop")
    result = executor.run(problems(1), seeds=[0])
    alice = [s for s in result.samples if s.agent == "alice"]
    assert [s.nonfinite_reward for s in alice] == [False, False, True, True]
    assert [s.reward for s in alice[2:]] == [0.0, 0.0]  # no NaN reaches a sample, a metric or a record
    assert not any(s.chosen for s in alice[2:])  # a dropped candidate is never the branch continued
    # alice "aaaa": local 1, team (1 + 0) / 2; "abab": local 0.5, team (0.5 + 0) / 2
    assert [s.reward for s in alice[:2]] == pytest.approx([1.5, 0.75])

    scored = score_samples(alice, AdvantageConfig(eps=1e-6))
    mean = (1.5 + 0.75) / 2
    std = math.sqrt(((1.5 - mean) ** 2 + (0.75 - mean) ** 2) / (2 - 1))  # unbiased, over the two finite members
    assert scored.advantages[:2] == pytest.approx([(1.5 - mean) / (std + 1e-6), (0.75 - mean) / (std + 1e-6)])
    assert scored.advantages[0] > 0 > scored.advantages[1]
    assert scored.in_loss == [True, True, False, False] and scored.advantages[2:] == [0.0, 0.0]

    (episode,) = result.episodes
    bob_dropped = sum(s.nonfinite_reward for s in result.samples if s.agent == "bob")  # "aaaa", "xyzw" hold no "b"
    assert bob_dropped == 2 and episode.nonfinite_rewards == 2 + bob_dropped
    assert episode_metrics(result.episodes)["episode/nonfinite_rewards"] == 4
    metrics = sample_metrics(result.samples)
    assert metrics["policy_0/alice/nonfinite_rewards"] == 2 and math.isfinite(metrics["policy_0/alice/reward_mean"])


def test_drop_in_validation_counts_and_keeps_the_metrics_finite(make_executor):
    executor, _ = make_executor(NaNOnGarbageEnv(max_turns=1), by_branch_or_episode, non_finite="drop")
    result = executor.run(problems(2), seeds=[0, 1], validation=True, n=4)  # episode e writes TEXTS[e]
    stuck = [e for e in result.episodes if e.nonfinite_rewards]
    assert sorted(e.episode for e in stuck) == ["p0e0", "p0e2", "p0e3", "p1e0", "p1e2", "p1e3"]
    assert all("failed to generate or had a non-finite reward" in e.error for e in stuck if not e.episode.endswith("e0"))
    metrics = episode_metrics(result.episodes, prefix="val/bench")
    assert metrics["val/bench/nonfinite_rewards"] == 6
    assert all(math.isfinite(v) for v in metrics.values())


def test_trajectory_mode_drops_every_sample_of_an_agent_whose_return_is_undefined(make_executor):
    executor, _ = make_executor(NaNOnGarbageEnv(max_turns=2), by_branch_or_episode, branching=4,
                                mode="trajectory", non_finite="drop")
    samples = executor.run(problems(1), seeds=[0]).samples
    dropped = {(s.episode, s.agent) for s in samples if s.nonfinite_reward}
    # alice writes no "a" in episodes 2 and 3; bob writes no "b" in episode 0 ("aaaa")
    assert dropped == {("p0e2", "alice"), ("p0e3", "alice"), ("p0e0", "bob")}
    assert all(s.reward == 0.0 for s in samples if s.nonfinite_reward)
    scored = score_samples(samples, AdvantageConfig(unit="episode"))
    for s, in_loss in zip(samples, scored.in_loss):
        assert not (in_loss and s.nonfinite_reward)
    assert any(in_loss for s, in_loss in zip(samples, scored.in_loss) if s.agent == "alice")


class FinalNaNEnv(TargetsEnv):
    """Team reward NaN once both agents of the parallel stage have acted: only the episode's final state has it."""

    def team_reward(self, state) -> float:
        return float("nan") if state.turn_steps >= 2 else super().team_reward(state)


def test_a_nan_team_reward_of_the_final_state_stops_or_is_dropped(make_executor):
    env = FinalNaNEnv(max_turns=1, parallel=True)
    executor, _ = make_executor(env, by_branch_or_episode, branching=2)
    with pytest.raises(EnvError, match=r"team_reward=nan \(FinalNaNEnv on problem 'q0', turn 0, at the end of "):
        executor.run(problems(1), seeds=[0])
    executor, _ = make_executor(env, by_branch_or_episode, branching=2, mode="trajectory", non_finite="drop")
    result = executor.run(problems(1), seeds=[0])
    assert all(e.team_reward == 0.0 and e.nonfinite_rewards == 1 and "final team reward" in e.error
               for e in result.episodes)
    assert all(s.nonfinite_reward for s in result.samples)  # no agent has a return to be scored with
