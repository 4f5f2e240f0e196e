"""The conformance checker passes good envs and fails broken ones clearly."""

from __future__ import annotations

import importlib.util

import pytest
from nonfinite_support import NaNOnGarbageEnv

from pettingllms.envs.toy.env import TargetsEnv, TargetWriter, target_score
from pettingllms.cli import main
from pettingllms.core import Problem, Transition
from pettingllms.core.checker import check_env
from pettingllms.core.registry import ENVS, get_env_class


@pytest.mark.parametrize("name", ENVS.names())
def test_every_registered_env_passes(name):
    from pettingllms.entry.check_env import _missing_package, conformance_report

    if _missing_package(get_env_class(name)):  # verifiers: checked in its own lane (make test-verifiers)
        pytest.skip(f"{name} needs {_missing_package(get_env_class(name))!r}, not installed in this venv")
    report = conformance_report(get_env_class(name)(), name=name)  # an agent program gets its own checks
    assert report.ok, report.format()


class PlainAgent(TargetWriter):
    def observe(self, state, turn):
        return [{"role": "user", "content": str(state)}]

    def local_reward(self, state):
        return 0.0


class MutatingEnv(TargetsEnv):
    """Steps in place, like the reference's agents mutating env.state."""

    agent_class = f"{__name__}:PlainAgent"

    def reset(self, problem, seed):
        return {"answers": []}

    def step(self, state, agent, action):
        state["answers"].append(action)
        return Transition(state)

    def team_reward(self, state):
        return 0.0

    def success(self, state):
        return False


class RaisingParser(TargetWriter):
    def parse(self, response):
        return int(response)  # ValueError on most text


class BadParserEnv(TargetsEnv):
    agent_class = f"{__name__}:RaisingParser"


class SharedListEnv(TargetsEnv):
    """Pure (input untouched) but every branch shares one list: aliasing."""

    agent_class = MutatingEnv.agent_class

    SHARED: list = []

    def reset(self, problem, seed):
        return ("start", self.SHARED)

    def step(self, state, agent, action):
        return Transition((str(action), self.SHARED))

    def team_reward(self, state):
        return 0.0

    def success(self, state):
        return False


class NaNRewardEnv(TargetsEnv):
    def team_reward(self, state):
        return float("nan")


@pytest.mark.parametrize(
    "env,check,detail",
    [
        (MutatingEnv(), "step is pure and deterministic", "mutated its input state"),
        (BadParserEnv(), "parser survives garbage", "parse raised ValueError"),
        (SharedListEnv(), "no aliasing between branches", "share"),
        (NaNRewardEnv(), "rewards are finite", "team_reward returned nan"),
    ],
)
def test_broken_envs_fail_with_a_clear_reason(env, check, detail):
    report = check_env(env)
    assert not report.ok
    failures = [r for r in report.results if not r.ok and not r.detail.startswith("skipped")]
    assert failures[0].name == check
    assert detail in failures[0].detail


class OverlappingSplitsEnv(TargetsEnv):
    """Test tasks from seed 10,000 on: disjoint from the first few training tasks, not from the 100,000 a run reads
    (the Nim example of docs/self_play.md had this shape)."""

    def procedural_problems(self, split, count):
        start = 10_000 if split == "test" else 0
        return [Problem(f"task-{start + i}", {"prompt": f"Task {start + i}."}) for i in range(count)]


def test_a_test_split_inside_the_training_tasks_fails_naming_the_ids():
    report = check_env(OverlappingSplitsEnv())
    (failure,) = [r for r in report.results if not r.ok and not r.detail.startswith("skipped")]
    assert failure.name == "splits are disjoint"
    assert "50 of the first 50 'test' task ids are among the first 100,000 'train' ones (task-10000" in failure.detail


def test_cli_exit_codes(capsys):
    assert main(["check-env", "toy_targets"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["check-env", f"{__name__}:MutatingEnv"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "mutated its input state" in out
    assert main(["check-env", "no_such_env"]) == 1
    assert "unknown env 'no_such_env'" in capsys.readouterr().out
    assert main(["check-env", "--all"]) == 0
    if importlib.util.find_spec("verifiers") is None:  # an optional library's env is said to be skipped, not failed
        assert "check-env verifiers: SKIPPED (needs the 'verifiers' package, not installed here)" in capsys.readouterr().out


def adversarial_failure(env) -> str:
    report = check_env(env)
    assert not report.ok
    failures = [r for r in report.results if not r.ok and not r.detail.startswith("skipped")]
    assert failures[0].name == "adversarial outputs from reached states", report.format()
    return failures[0].detail


def test_a_reward_that_is_nan_on_garbage_fails_naming_the_agent_the_output_and_the_reward(capsys):
    # Its reset state's rewards are finite: only a state stepped with unparseable output shows the NaN.
    detail = adversarial_failure(NaNOnGarbageEnv())
    assert detail.startswith("team_reward returned nan (agent 'alice' at turn 0 of problem 'toy-0', output '')")
    assert "rewards must be finite numbers" in detail
    assert main(["check-env", f"{NaNOnGarbageEnv.__module__}:NaNOnGarbageEnv"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "team_reward returned nan" in out


class LateNaNEnv(TargetsEnv):
    """Finite everywhere except on a state two steps deep: alice's second-turn answer without an "a"."""

    def team_reward(self, state) -> float:
        if state.turn_steps >= 3 and target_score(state.answer("alice"), "a") == 0.0:
            return float("nan")
        return super().team_reward(state)


def test_rewards_are_checked_from_states_reached_after_several_turns():
    detail = adversarial_failure(LateNaNEnv())
    assert "team_reward returned nan (agent 'alice' at turn 1 of" in detail


class SurrogateEncodingParser(TargetWriter):
    def parse(self, response):
        return response.encode("utf-8").decode()  # lone surrogates (undecodable model bytes) cannot be encoded


class SurrogateEnv(TargetsEnv):
    agent_class = f"{__name__}:SurrogateEncodingParser"


def test_a_parser_that_fails_on_undecodable_bytes_fails():
    detail = adversarial_failure(SurrogateEnv())
    assert detail.startswith("alice.parse raised UnicodeEncodeError(") and "output 'caf\\udcc3" in detail


def test_check_env_says_how_to_import_a_short_name_that_is_not_registered(tmp_path, monkeypatch, capsys):
    ENVS.names()  # the built-in envs registered, then a copy: this test's registration is undone afterwards
    monkeypatch.setattr(ENVS, "_entries", dict(ENVS._entries))
    (tmp_path / "bazaar_envs.py").write_text("from pettingllms.core import register_env\n"
                                             "from pettingllms.envs.toy.env import TargetsEnv\n"
                                             "register_env('bazaar', TargetsEnv)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["check-env", "bazaar"]) == 1
    assert ("'bazaar' is not registered; if it is defined in your package, add --imports your.module (the module "
            "that calls register_env('bazaar', ...))") in capsys.readouterr().out
    assert main(["check-env", "--imports", "json", "bazaar"]) == 1
    assert "none of --imports json registered it: check the name given to register_env" in capsys.readouterr().out
    assert main(["check-env", "--imports", "bazaar_envs", "bazaar"]) == 0, capsys.readouterr().out


class NaNWhenBothGarbleEnv(TargetsEnv):
    """A parallel stage whose team reward is NaN only when both agents sent text without their target character (a
    0 / 0 over the parsed answers): one agent's garbage at a time never shows it."""

    def team_reward(self, state) -> float:
        answers = [state.answer(a) for a, _ in state.targets]
        if all(a is not None for a in answers) and all(
                target_score(state.answer(a), t) == 0.0 for a, t in state.targets):
            return float("nan")
        return super().team_reward(state)


def test_rewards_that_break_only_when_every_agent_sends_garbage_are_caught():
    report = check_env(NaNWhenBothGarbleEnv(parallel=True), seed=0)
    (result,) = [r for r in report.results if r.name == "every agent answering garbage at once"]
    assert not result.ok and "team_reward" in result.detail and "every agent answering" in result.detail
    adversarial = [r for r in report.results if r.name == "adversarial outputs from reached states"]
    assert adversarial and adversarial[0].ok  # the one-agent-at-a-time check passes it: the gap this closes


def test_each_named_check_runs_alone_on_a_context():
    """Checks are top-level functions over a CheckContext (as Gymnasium's are over an env): one can be run by itself."""
    from pettingllms.core.checker import (CheckContext, check_agents, check_no_aliasing_between_branches,
                                          check_problems, check_reset_determinism,
                                          check_step_is_pure_and_deterministic)

    for env, check, expected in ((MutatingEnv(), check_step_is_pure_and_deterministic, "mutated its input state"),
                                 (SharedListEnv(), check_no_aliasing_between_branches, "share"),
                                 (TargetsEnv(), check_step_is_pure_and_deterministic, None)):
        ctx = CheckContext(env)
        assert check_agents(ctx) is None and check_problems(ctx) is None and check_reset_determinism(ctx) is None
        detail = check(ctx)
        assert detail is None if expected is None else expected in detail


def test_the_check_list_names_every_check_once():
    import pettingllms.core.checker as checker

    names = [name for name, _ in checker.CHECKS]
    functions = [fn for _, fn in checker.CHECKS]
    assert len(set(names)) == len(names) and len(set(functions)) == len(functions)
    defined = {value for key, value in vars(checker).items() if key.startswith("check_") and key != "check_env"}
    assert defined == set(functions)  # a check written and never listed would never run


def _nim(**methods):
    """lenient_nim's two-seat game (every answer a legal move) with ``methods`` replaced."""
    from lenient_nim import LenientNim

    return type("BrokenNim", (LenientNim,), methods)()


def test_an_outcome_that_leaves_out_a_seat_fails_naming_it():
    broken = _nim(outcome=lambda self, state: {"player_0": 0.0 if state.winner is None else float(state.winner == 0)})
    report = check_env(broken)
    failure = next(r for r in report.results if not r.ok)
    assert failure.name == "every agent's result arrives"
    assert "leaves out ['player_1']" in failure.detail


@pytest.mark.parametrize("acting, detail", [
    (lambda self, s: () if s.winner is None and s.stones % 2 == 0 and s.to_move == 1 else
     ((f"player_{s.to_move}",) if s.winner is None else ()), "returned ()"),
    (lambda self, s: (("player_2",) if s.to_move == 1 else ("player_0",)) if s.winner is None else (),
     "names ['player_2']"),
])
def test_acting_agents_are_checked_on_the_states_an_episode_reaches_not_only_the_first(acting, detail):
    """Both are fine on the initial state (player_0 to move) and wrong once player_1 is."""
    report = check_env(_nim(acting_agents=acting))
    failure = next(r for r in report.results if not r.ok)
    assert failure.name == "acting agents are the env's"
    assert detail in failure.detail and "turn 1's state" in failure.detail


def test_check_env_refuses_an_option_the_env_does_not_know(capsys):
    assert main(["check-env", "openspiel", "--option", "gaem=tic_tac_toe"]) == 1
    assert "OpenSpielEnv has no option 'gaem'. Did you mean 'game'?" in capsys.readouterr().out
