"""CodeEnv: golden solutions pass, the coder's pass rate, the tester's validity and catch terms, termination,
sandbox failures as errors, and the conformance checker."""

from __future__ import annotations

import pytest

from pettingllms.envs.code.env import CodeEnv, CodeState, CoderAgent, TesterAgent
from pettingllms.core import InfrastructureError, Problem
from pettingllms.core.checker import check_env
from pettingllms.core.registry import make_agents
from pettingllms.data.code_sources import humaneval_rows, read_humaneval

FENCE = "```"
SUM_QUESTION = "Read two integers a and b on one line and print a + b."
SUM_GOLDEN = "a, b = map(int, input().split())\nprint(a + b)\n"
BUGGY_SUM = "a, b = map(int, input().split())\nprint(a + b if a < 5 else a - b)\n"


def code(source: str) -> str:
    return f"**Code:**\n{FENCE}python\n{source}\n{FENCE}"


def written_tests(*pairs: tuple[str, str]) -> str:
    return "\n".join(f"**Test Input:**\n{FENCE}\n{i}\n{FENCE}\n**Test Output:**\n{FENCE}\n{o}\n{FENCE}" for i, o in pairs)


def sum_problem(golden: str | None = SUM_GOLDEN) -> Problem:
    return Problem("sum", {"question": SUM_QUESTION, "solution": golden, "test_input": ["1 2\n", "7 3\n", "-4 4\n"],
                           "test_output": ["3\n", "10\n", "0\n"]})


@pytest.fixture(scope="module")
def env() -> CodeEnv:
    return CodeEnv(max_turns=5, timeout_s=5, sandbox_workers=2)


@pytest.fixture(scope="module")
def agents(env):
    return make_agents(env)


def act(env, agents, state, agent, response):
    return env.step(state, agent, agents[agent].parse(response))


def test_check_env_passes(env, agents):
    report = check_env(env, agents=agents)
    assert report.ok, report.format()


@pytest.fixture(scope="module")
def humaneval_problems():
    rows, skipped = humaneval_rows(read_humaneval()[:4], workers=2)
    assert len(rows) == 4 and not skipped
    return [Problem(row["id"], row) for row in rows]


def test_golden_solution_passes_ground_truth_on_humaneval(env, agents, humaneval_problems):
    for problem in humaneval_problems:
        state = act(env, agents, env.reset(problem, 0), "coder", code(problem.data["solution"])).state
        assert state.code.total >= 3 and state.code.pass_rate == 1.0, problem.problem_id
        assert env.success(state) and agents["coder"].local_reward(state) == 1.0 == env.team_reward(state)


def test_wrong_program_scores_its_pass_rate(env, agents, humaneval_problems):
    problem = humaneval_problems[0]
    wrong = problem.data["solution"].replace("return False", "return True", 1)
    assert wrong != problem.data["solution"]
    state = act(env, agents, env.reset(problem, 0), "coder", code(wrong)).state
    assert 0.0 < state.code.pass_rate < 1.0 and not env.success(state)


def test_coder_pass_rate_and_missing_code(env, agents):
    s0 = env.reset(sum_problem(), 0)
    buggy = act(env, agents, s0, "coder", code(BUGGY_SUM)).state
    assert agents["coder"].local_reward(buggy) == pytest.approx(2 / 3)
    nothing = act(env, agents, s0, "coder", "I would write a program but I will not.").state
    assert agents["coder"].local_reward(nothing) == 0.0 and env.team_reward(nothing) == 0.0


def test_tester_reward_varies_with_test_validity(env, agents):
    s0 = env.reset(sum_problem(), 0)
    rewards = {}
    for label, pairs in {
        "all valid": [("2 2", "4"), ("0 0", "0")],
        "half valid": [("2 2", "4"), ("0 0", "1")],
        "none valid": [("2 2", "5"), ("1 1", "3")],
        "crashing input": [("x y", "0")],  # the golden solution crashes: not a valid test
    }.items():
        state = act(env, agents, s0, "tester", written_tests(*pairs)).state
        rewards[label] = agents["tester"].local_reward(state)
    assert rewards == {"all valid": 1.0, "half valid": 0.5, "none valid": 0.0, "crashing input": 0.0}
    unparsable = act(env, agents, s0, "tester", "tests: 1 2 -> 3").state
    assert agents["tester"].local_reward(unparsable) == 0.0


def test_tester_earns_the_catch_term_only_with_a_valid_test_that_fails_the_program(env, agents):
    with_bug = act(env, agents, env.reset(sum_problem(), 0), "coder", code(BUGGY_SUM)).state
    exposing = act(env, agents, with_bug, "tester", written_tests(("9 1", "10"))).state  # valid, fails the bug
    missing = act(env, agents, with_bug, "tester", written_tests(("1 1", "2"))).state  # valid, bug not hit
    wrong_test = act(env, agents, with_bug, "tester", written_tests(("9 1", "8"))).state  # the bug's output, invalid
    assert agents["tester"].local_reward(exposing) == 2.0
    assert agents["tester"].local_reward(missing) == 1.0
    assert agents["tester"].local_reward(wrong_test) == 0.0
    assert exposing.mismatches and exposing.mismatches[0].actual.strip() == "8"


def test_terminates_when_the_program_passes_the_valid_generated_tests(env, agents):
    s0 = env.reset(sum_problem(), 0)
    after_coder = act(env, agents, s0, "coder", code(SUM_GOLDEN))
    assert not after_coder.terminated  # the tester has not acted this turn
    done = act(env, agents, after_coder.state, "tester", written_tests(("2 3", "5")))
    assert done.terminated and done.state.aligned and env.success(done.state)
    invalid_only = act(env, agents, after_coder.state, "tester", written_tests(("2 3", "6")))
    assert not invalid_only.terminated  # no valid test: nothing to agree on
    buggy = act(env, agents, s0, "coder", code(BUGGY_SUM)).state
    assert not act(env, agents, buggy, "tester", written_tests(("9 1", "10"))).terminated


def test_without_golden_solution_tests_count_for_termination_but_not_reward(env, agents):
    s0 = env.reset(sum_problem(golden=None), 0)
    s1 = act(env, agents, s0, "coder", code(SUM_GOLDEN)).state
    done = act(env, agents, s1, "tester", written_tests(("2 3", "5")))
    assert done.terminated and agents["tester"].local_reward(done.state) == 0.0


def test_later_turns_show_mismatches(env, agents):
    s1 = act(env, agents, env.reset(sum_problem(), 0), "coder", code(BUGGY_SUM)).state
    s2 = act(env, agents, s1, "tester", written_tests(("9 1", "10"))).state
    for role in ("coder", "tester"):
        text = agents[role].observe(s2, 1)[-1]["content"]
        assert "Mismatches" in text and "9 1" in text and BUGGY_SUM.strip().splitlines()[-1] in text


def test_sandbox_failure_is_an_error_not_a_reward(agents, monkeypatch):
    env = CodeEnv(sandbox_workers=1)

    def broken(*args, **kwargs):
        raise InfrastructureError("bwrap cannot mount")

    monkeypatch.setattr(env.runner, "run_many", broken)
    with pytest.raises(InfrastructureError):
        act(env, agents, env.reset(sum_problem(), 0), "coder", code(SUM_GOLDEN))


def test_sandbox_concurrency_is_bounded_by_the_option():
    env = CodeEnv(sandbox_workers=3)
    assert env.runner._get_pool().max_workers == 3
    env.runner.close()


def test_states_are_immutable_values(env, agents):
    s0 = env.reset(sum_problem(), 0)
    before = repr(s0)
    act(env, agents, s0, "coder", code(SUM_GOLDEN))
    act(env, agents, s0, "tester", written_tests(("2 2", "4")))
    assert repr(s0) == before and isinstance(s0, CodeState)


def test_parsers():
    coder, tester = CoderAgent("coder"), TesterAgent("tester", max_tests=2)
    assert coder.parse(f"{FENCE}python\nprint(1)\n{FENCE} and {FENCE}python\nprint(2)\n{FENCE}").code == "print(2)\n"
    assert coder.parse(f"{FENCE}python\nprint(3)").code == "print(3)"  # cut off by max_tokens
    assert coder.parse("print(4)").code is None
    pairs = tester.parse(written_tests(("1", "2"), ("3", "4"), ("5", "6"))).tests
    assert pairs == (("1\n", "2\n"), ("3\n", "4\n"))


def test_tree_rollout_through_the_executor(make_executor):
    env = CodeEnv(max_turns=3, sandbox_workers=2)

    def script(prompt: str, k: int, request) -> str:
        if "Write up to" in prompt.rsplit("<user>", 1)[-1]:
            return written_tests(("2 3", "5")) if k == 0 else written_tests(("2 3", "6"))
        return code(SUM_GOLDEN if k == 0 else BUGGY_SUM)

    executor, _ = make_executor(env, script, branching=2)
    result = executor.run([sum_problem()], [0])
    (episode,) = result.episodes
    assert episode.terminated and episode.turns == 1 and episode.success
    coder = sorted(s.reward for s in result.samples if s.agent == "coder")
    tester = sorted(s.reward for s in result.samples if s.agent == "tester")
    assert coder == [pytest.approx(4 / 3), 2.0] and tester == [0.0, 1.0]


UID_CHECK = "import os\nprint(os.getuid() >= {base})\n"


def test_golden_solutions_run_apart_from_the_models_programs(env, agents):
    """A golden solution runs under a uid of the reference range, a model's program under one of the models' range:
    never beside one another under one uid (and in pools of their own)."""
    import os

    from pettingllms.sandbox.uids import REFERENCE_UID_BASE

    if os.geteuid() != 0:
        pytest.skip("only a root runner gives programs private uids")
    reports_reference = UID_CHECK.format(base=REFERENCE_UID_BASE)
    problem = Problem("uids", {"question": "q", "solution": reports_reference, "test_input": ["\n"],
                               "test_output": ["True\n"]})
    s0 = env.reset(problem, 0)
    tested = act(env, agents, s0, "tester", written_tests(("", "True"))).state
    assert tested.tests.valid == (True,), "the golden solution did not run in the reference uid range"
    coded = act(env, agents, s0, "coder", code(reports_reference)).state
    assert coded.code.passed == 0, "a model's program ran in the reference uid range"
    assert env.runner._get_pool() is not env.reference_runner._get_pool()
