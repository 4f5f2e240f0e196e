"""Competitive games in the executor: the env decides who acts, every seat gets its outcome whichever seat moved
last, and in tree mode the outcome reaches the moves that caused it through playouts (hand-computed trees)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from pettingllms.algo.grpo import AdvantageConfig, score_samples
from pettingllms.core import AgentGraph, EnvError, Problem, Transition
from pettingllms.core.env import Agent, Env
from pettingllms.trainer.metrics import sample_metrics

# The trap: "first" moves A or B, then "second" answers x or y. A then y: second wins; A then x: first wins; B: a
# draw whatever the answer. Every immediate reward is 0; the right first move (B, against a second that answers A
# with y) shows only through the reply.
PAYOFF = {("A", "x"): 1.0, ("A", "y"): -1.0, ("B", "x"): 0.0, ("B", "y"): 0.0}


@dataclass(frozen=True)
class TrapState:
    moves: tuple[str, ...] = ()
    invalid: int = 0  # invalid moves so far: the seat to move must resubmit


class Seat(Agent):
    known_options = ()

    def observe(self, state: TrapState, turn: int) -> list:
        return [{"role": "user", "content": f"seat {self.name}; moves so far: {','.join(state.moves) or '-'}; "
                                            f"invalid: {state.invalid}"}]

    def parse(self, response: str) -> Any:
        return response.strip()


class TrapGame(Env):
    graph = AgentGraph.sequential(["first", "second"])  # the roles; who acts comes from acting_agents
    agent_classes = {"first": "test_games:Seat", "second": "test_games:Seat"}
    known_options = ()

    def __init__(self, max_turns: int = 6, **options: Any) -> None:
        super().__init__(max_turns=max_turns, **options)

    def reset(self, problem: Problem, seed: int) -> TrapState:
        return TrapState()

    def acting_agents(self, state: TrapState) -> tuple[str, ...]:
        return ("first",) if not state.moves else ("second",)

    def step(self, state: TrapState, agent: str, action: Any) -> Transition:
        legal = ("A", "B") if agent == "first" else ("x", "y")
        if action not in legal:  # the same seat moves again (acting_agents reads the state)
            return Transition(replace(state, invalid=state.invalid + 1))
        moves = state.moves + (action,)
        return Transition(TrapState(moves, state.invalid), terminated=len(moves) == 2)

    def team_reward(self, state: TrapState) -> float:
        return 0.0

    def success(self, state: TrapState) -> bool:
        return len(state.moves) == 2

    def outcome(self, state: TrapState) -> dict[str, float]:
        value = PAYOFF[state.moves] if len(state.moves) == 2 else 0.0
        return {"first": value, "second": -value}


class LocalOnlyTrap(TrapGame):
    """The same game wrapped as docs/custom_env.md taught before outcomes: each seat's result from local_reward."""


LocalOnlyTrap.outcome = Env.outcome  # a wrapper written without one


class ResultSeat(Seat):
    def local_reward(self, state: TrapState) -> float:
        value = PAYOFF[state.moves] if len(state.moves) == 2 else 0.0
        return value if self.name == "first" else -value


def tricky_second(prompt: str, k: int, request) -> str:
    """``first`` offers its k-th move; ``second`` punishes A with y and answers B with x."""
    if "seat first" in prompt:
        return ["A", "B"][k % 2]
    return "y" if "moves so far: A" in prompt else "x"


def groups(samples) -> dict[tuple, list]:
    out: dict[tuple, list] = {}
    for s in samples:
        out.setdefault(s.group, []).append(s)
    return out


def test_tree_mode_values_the_first_move_by_the_reply_it_invites(make_executor):
    executor, engines = make_executor(TrapGame(), tricky_second, branching=2, mode="tree", playouts=1)
    result = executor.run([Problem("trap")], [0])
    first = [s for s in result.samples if s.agent == "first"]
    # A's playout: second answers y, first loses (-1); B's: a draw (0). Immediate rewards are all 0.
    assert [(s.response_text, s.reward) for s in first] == [("A", -1.0), ("B", 0.0)]
    scored = score_samples(result.samples, AdvantageConfig(norm_by_std=True))
    advantages = {(s.agent, s.response_text, s.turn): a for s, a in zip(result.samples, scored.advantages)}
    # (r - mean) / (std + eps) with the unbiased std of [-1, 0]: mean -0.5, std 0.70711
    assert advantages[("first", "A", 0)] == pytest.approx(-0.70711, abs=1e-4)
    assert advantages[("first", "B", 0)] == pytest.approx(0.70711, abs=1e-4)
    assert [s.chosen for s in first] == [False, True]  # greedy continues the better move
    (record,) = result.episodes
    assert record.outcomes == {"first": 0.0, "second": -0.0} and record.turns == 2
    # the seat is in the group key: (problem slot, turn, agent)
    assert sorted(groups(result.samples)) == [(0, 0, "first"), (0, 1, "second")]


def test_without_playouts_the_first_moves_group_has_no_signal(make_executor):
    executor, _ = make_executor(TrapGame(), tricky_second, branching=2, mode="tree", playouts=0)
    result = executor.run([Problem("trap")], [0])
    assert [s.reward for s in result.samples if s.agent == "first"] == [0.0, 0.0]
    assert score_samples(result.samples, AdvantageConfig()).metrics["groups_zero_std"] == 2.0


def test_the_loser_who_did_not_move_last_gets_its_outcome_in_trajectory_and_independent_modes(make_executor):
    def always_a(prompt, k, request):
        return "A" if "seat first" in prompt else "y"

    for mode in ("trajectory", "independent"):
        executor, _ = make_executor(TrapGame(), always_a, branching=2, mode=mode)
        result = executor.run([Problem("trap")], [0])
        rewards = {(s.agent, s.episode): s.reward for s in result.samples}
        assert set(rewards.values()) == {-1.0, 1.0}, mode
        assert all(r == -1.0 for (agent, _), r in rewards.items() if agent == "first"), mode  # second moved last
        assert all(e.outcomes == {"first": -1.0, "second": 1.0} for e in result.episodes)


def test_an_env_that_would_lose_the_losers_result_is_refused_naming_the_agent(make_executor):
    env = LocalOnlyTrap()
    env.agent_classes = {"first": "test_games:ResultSeat", "second": "test_games:ResultSeat"}

    def always_a(prompt, k, request):
        return "A" if "seat first" in prompt else "y"

    executor, _ = make_executor(env, always_a, branching=2, mode="trajectory")
    with pytest.raises(EnvError, match=r"agent 'first''s local_reward is -1.0 on the final state .* agent 'second' "
                                       r"moved last.*LocalOnlyTrap.outcome\(state\)"):
        executor.run([Problem("trap")], [0])


@pytest.mark.parametrize("mode", ["tree", "trajectory", "independent"])
def test_an_outcome_that_leaves_out_a_seat_is_refused_naming_it(make_executor, mode):
    """Read as 0, the missing seat's lost games would train it as draws."""
    class OneSided(TrapGame):
        def outcome(self, state):
            return {"first": PAYOFF[state.moves] if len(state.moves) == 2 else 0.0}

    executor, _ = make_executor(OneSided(), tricky_second, branching=2, mode=mode, playouts=1)
    with pytest.raises(EnvError, match=r"OneSided.outcome .* leaves out \['second'\]: an outcome names every acting"):
        executor.run([Problem("trap")], [0])


class EitherSeatAlone(TrapGame):
    """A graph-ordered game (no acting_agents) whose outcome names both seats; with env.agents=[first] the run
    plays only ``first``, which moves twice."""

    def step(self, state, agent, action):
        moves = state.moves + (str(action),)
        return Transition(TrapState(moves), terminated=len(moves) == 2)

    def outcome(self, state):
        won = 1.0 if state.moves[:1] == ("A",) else -1.0
        return {"first": won, "second": -won}


EitherSeatAlone.acting_agents = Env.acting_agents


def test_the_outcome_of_a_seat_env_agents_left_out_is_read_and_dropped(make_executor):
    env = EitherSeatAlone()
    env.graph = env.graph.restricted_to(["first"])  # as the plan applies env.agents=[first]
    assert env.graph.agents == ("first",) and env.graph.left_out == ("second",)
    executor, _ = make_executor(env, lambda prompt, k, request: "A", branching=1, mode="trajectory")
    result = executor.run([Problem("trap")], [0], n=1)
    assert result.episodes[0].outcomes == {"first": 1.0}
    assert {s.agent for s in result.samples} == {"first"} and all(s.reward == 1.0 for s in result.samples)


def test_the_env_decides_who_acts_and_idle_seats_generate_nothing(make_executor):
    """An invalid move makes the same seat move again; only the seat to move is asked; a turn is a decision."""
    answers = iter(["Z", "Q", "B", "x"])  # first errs twice, then B; second answers x

    def script(prompt, k, request):
        return next(answers)

    executor, engines = make_executor(TrapGame(), script, branching=1, mode="independent")
    result = executor.run([Problem("trap")], [0], n=1)
    asked = [r.request_id.rsplit("/", 1)[1] for call in engines["policy_0"].calls for r in call]
    assert asked == ["first", "first", "first", "second"]
    assert [(s.turn, s.agent) for s in result.samples] == [(0, "first"), (1, "first"), (2, "first"), (3, "second")]
    assert result.episodes[0].turns == 4 and result.episodes[0].outcomes == {"first": 0.0, "second": -0.0}


def test_an_acting_agent_the_run_does_not_have_is_an_error(make_executor):
    class Broken(TrapGame):
        def acting_agents(self, state):
            return ("third",)

    executor, _ = make_executor(Broken(), tricky_second, branching=2)
    with pytest.raises(EnvError, match=r"acting_agents .* names \['third'\]"):
        executor.run([Problem("trap")], [0])


def test_a_trajectory_return_counts_once_per_episode_in_episode_return_mean(make_executor):
    def errs_then_a(prompt, k, request):  # first acts twice: an invalid move, then A
        return ("Z" if "invalid: 0" in prompt else "A") if "seat first" in prompt else "y"

    executor, _ = make_executor(TrapGame(), errs_then_a, branching=2, mode="trajectory")
    metrics = sample_metrics(executor.run([Problem("trap")], [0]).samples)
    assert metrics["policy_0/first/episode_return_mean"] == -1.0
    assert metrics["policy_0/second/episode_return_mean"] == 1.0


@pytest.mark.parametrize("mode", ["tree", "independent"])
def test_a_games_result_counts_once_in_an_episodes_return_whatever_the_mode(make_executor, mode):
    """first errs, then plays A and loses to y: two moves, each valued -1 (tree: the playouts' mean; independent:
    the episode's result on every move). Its return is the game's result, -1, once: not -2, outside the game's range
    (the transcript's rewards and the samples' both carry the outcome on every move)."""
    def errs_then_a(prompt, k, request):
        return ("Z" if "invalid: 0" in prompt else "A") if "seat first" in prompt else "y"

    executor, _ = make_executor(TrapGame(), errs_then_a, branching=2 if mode == "tree" else 1, mode=mode,
                                playouts=1)
    result = executor.run([Problem("trap")], [0])
    (record,) = result.episodes
    assert [s.reward for s in result.samples if s.agent == "first" and s.chosen] == [-1.0, -1.0]
    assert record.outcomes == {"first": -1.0, "second": 1.0}
    assert record.agent_rewards == {"first": -1.0, "second": 1.0}
    metrics = sample_metrics(result.samples, {record.episode: record.outcomes})
    assert metrics["policy_0/first/episode_return_mean"] == -1.0
    assert metrics["policy_0/second/episode_return_mean"] == 1.0


def test_seat_results_count_wins_draws_and_losses_per_seat(make_executor):
    from pettingllms.trainer.metrics import episode_metrics

    executor, _ = make_executor(TrapGame(), lambda p, k, r: ("A" if "seat first" in p else "y"),
                                branching=2, mode="independent")
    metrics = episode_metrics(executor.run([Problem("trap")], [0]).episodes)
    assert metrics["episode/first/loss_rate"] == 1.0 and metrics["episode/first/win_rate"] == 0.0
    assert metrics["episode/second/win_rate"] == 1.0 and metrics["episode/second/outcome_mean"] == 1.0
    assert metrics["episode/first/draw_rate"] == 0.0


def test_the_signal_watch_names_playouts_when_a_games_groups_stay_flat():
    from pettingllms.trainer.signal_watch import SignalWatch

    watch = SignalWatch(env_has_outcome=True, playouts=0, mode="tree")
    flat = {"policy_0/grpo/groups": 10.0, "policy_0/grpo/groups_zero_std": 9.0}
    assert watch.check(1, flat, ["policy_0"]) == [] and watch.check(2, flat, ["policy_0"]) == []
    (warning,) = watch.check(3, flat, ["policy_0"])
    assert "9 of 10 GRPO groups" in warning and "rollout.playouts >= 1" in warning
    assert watch.check(4, flat, ["policy_0"]) == []  # once per run
    other = SignalWatch()
    other.check(1, flat, ["policy_0"])
    other.check(2, {**flat, "policy_0/grpo/groups_zero_std": 2.0}, ["policy_0"])  # a step with signal resets it
    assert other.check(3, flat, ["policy_0"]) == [] and other.check(4, flat, ["policy_0"]) == []
    # a game that already has an outcome and playouts is not told to add an outcome
    played = SignalWatch(env_has_outcome=True, playouts=1, mode="tree")
    (warning,) = [w for step in (1, 2, 3) for w in played.check(step, flat, ["policy_0"])]
    assert "give the env an outcome" not in warning and "always wins, loses or draws" in warning
    assert "give the env an outcome" in SignalWatch()._cause()


def test_a_finite_reward_so_large_that_the_groups_variance_overflows_is_refused_like_a_nan(make_executor):
    from pettingllms.envs.toy.env import TargetsEnv

    class Huge(TargetsEnv):
        def team_reward(self, state):
            return 1e308

    executor, _ = make_executor(Huge(max_turns=1), lambda p, k, r: "a", branching=2)
    with pytest.raises(EnvError, match=r"non-finite or overflowing reward team_reward=1e\+308"):
        executor.run([Problem("p")], [0])
    executor, _ = make_executor(Huge(max_turns=1), lambda p, k, r: "a", branching=2, non_finite="drop")
    result = executor.run([Problem("p")], [0])
    assert all(s.nonfinite_reward for s in result.samples)


class CreditedSeat(Seat):
    """Credited on its own move (1.0 for any first move), then the reply changes its reading (0.3): by design, as
    a tester's caught bug that the coder fixes; not a lost result."""

    def local_reward(self, state: TrapState) -> float:
        if self.name != "first" or not state.moves:
            return 0.0
        return 1.0 if len(state.moves) == 1 else 0.3


def test_a_local_reward_that_changes_after_the_agent_was_credited_is_not_refused(make_executor):
    env = LocalOnlyTrap()
    env.agent_classes = {"first": "test_games:CreditedSeat", "second": "test_games:CreditedSeat"}
    executor, _ = make_executor(env, lambda p, k, r: "A" if "seat first" in p else "y", branching=2,
                                mode="trajectory")
    result = executor.run([Problem("trap")], [0])
    assert {s.reward for s in result.samples if s.agent == "first"} == {1.0}
