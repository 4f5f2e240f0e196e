"""MathEnv: rewards, termination by agreement, the tool's code in the sandbox, L0, purity and the verifier."""

from __future__ import annotations

import asyncio
import os

import pytest

from pettingllms.envs.math.env import MathEnv, MathState, ReasonerAgent, ToolAgent, make_problem
from pettingllms.envs.math.verifier import MathVerifier
from pettingllms.core.checker import check_env
from pettingllms.core.registry import make_agents

FENCE = "```"


def tool_response(code: str) -> str:
    return f"**Code:**\n{FENCE}python\n{code}\n{FENCE}"


@pytest.fixture(scope="module")
def env() -> MathEnv:
    return MathEnv(max_turns=4, code_timeout_s=5)


@pytest.fixture(scope="module")
def agents(env):
    return make_agents(env)


def half_problem():
    return make_problem("p-half", "What is 1/2 + 1/4?", "\\frac{3}{4}")


def act(env, agents, state, agent, response):
    return env.step(state, agent, agents[agent].parse(response))


def test_check_env_passes(env, agents):
    report = check_env(env, agents=agents)
    assert report.ok, report.format()


def test_correct_boxed_answer_is_rewarded_and_wrong_is_not(env, agents):
    s0 = env.reset(half_problem(), 0)
    right = act(env, agents, s0, "reasoner", "1/2 + 1/4 = 0.75, so \\boxed{\\dfrac{3}{4}}").state
    wrong = act(env, agents, s0, "reasoner", "I think \\boxed{\\frac{2}{3}}").state
    equivalent = act(env, agents, s0, "reasoner", "\\boxed{0.75}").state
    assert agents["reasoner"].local_reward(right) == 1.0 and env.team_reward(right) == 1.0 and env.success(right)
    assert agents["reasoner"].local_reward(wrong) == 0.0 and env.team_reward(wrong) == 0.0
    assert agents["reasoner"].local_reward(equivalent) == 1.0  # math-verify equivalence, not string equality


@pytest.mark.parametrize("code, expected", [
    ("print(3/4)", 1.0),                       # correct
    ("print('\\\\boxed{3/4}')", 1.0),           # boxed in the output
    ("print(2/3)", 0.0),                       # wrong answer
    ("raise ValueError('boom')", -1.0),        # exception
    ("x = 3/4", -1.0),                         # no output
])
def test_tool_rewards(env, agents, code, expected):
    state = act(env, agents, env.reset(half_problem(), 0), "tool", tool_response(code)).state
    assert agents["tool"].local_reward(state) == expected, state.tool


def test_tool_without_code_gets_minus_one(env, agents):
    state = act(env, agents, env.reset(half_problem(), 0), "tool", "The answer is 3/4, no code.").state
    assert state.tool.status == "no code" and agents["tool"].local_reward(state) == -1.0


def test_tool_code_runs_in_the_sandbox_not_in_this_process(env, agents, monkeypatch):
    monkeypatch.setenv("PETTINGLLMS_TEST_SECRET", "leaked")
    code = "import os\nprint(os.environ.get('PETTINGLLMS_TEST_SECRET', 'scrubbed'))"
    state = act(env, agents, env.reset(half_problem(), 0), "tool", tool_response(code)).state
    assert state.tool.answer == "scrubbed"  # the sandbox's allow-listed environment
    assert os.environ["PETTINGLLMS_TEST_SECRET"] == "leaked"


def test_agreement_terminates_only_when_the_turn_is_complete(env, agents):
    s0 = env.reset(half_problem(), 0)
    # parallel stage: each agent is scored alone from the turn-start state; neither step ends the episode
    after_reasoner = act(env, agents, s0, "reasoner", "\\boxed{3/4}")
    assert not after_reasoner.terminated
    agreed = act(env, agents, after_reasoner.state, "tool", tool_response("print(0.75)"))
    assert agreed.terminated and agreed.state.agreed
    disagreed = act(env, agents, after_reasoner.state, "tool", tool_response("print(5)"))
    assert not disagreed.terminated
    # next turn: the reasoner alone agreeing with the tool's old answer does not end the turn early
    assert not act(env, agents, disagreed.state, "reasoner", "\\boxed{5}").terminated


def test_agreement_on_a_wrong_answer_terminates_without_success(env, agents):
    s1 = act(env, agents, env.reset(half_problem(), 0), "reasoner", "\\boxed{7}").state
    done = act(env, agents, s1, "tool", tool_response("print(7)"))
    assert done.terminated and not env.success(done.state) and env.team_reward(done.state) == 0.0


def test_later_turns_show_both_previous_answers(env, agents):
    s1 = act(env, agents, env.reset(half_problem(), 0), "reasoner", "maybe \\boxed{2/3}").state
    s2 = act(env, agents, s1, "tool", tool_response("print(0.75)")).state
    for role in ("reasoner", "tool"):
        text = agents[role].observe(s2, 1)[-1]["content"]
        assert "2/3" in text and "0.75" in text and "refine" in text
    assert "Previous attempts" not in agents["reasoner"].observe(env.reset(half_problem(), 0), 0)[-1]["content"]


def test_l0_single_reasoner_never_terminates_early_and_passes_check_env():
    env = MathEnv(max_turns=2)
    env.graph = env.graph.restricted_to(["reasoner"])
    agents = make_agents(env)
    assert list(agents) == ["reasoner"]
    state = env.reset(half_problem(), 0)
    for _ in range(2):
        transition = act(env, agents, state, "reasoner", "\\boxed{3/4}")
        assert not transition.terminated
        state = transition.state
    assert env.success(state)
    assert check_env(env, agents=agents).ok


def test_step_never_mutates_and_states_are_values(env, agents):
    s0 = env.reset(half_problem(), 0)
    before = repr(s0)
    a = act(env, agents, s0, "reasoner", "\\boxed{1}").state
    b = act(env, agents, s0, "reasoner", "\\boxed{3/4}").state
    assert repr(s0) == before and isinstance(a, MathState)
    assert a.reasoner.answer == "1" and b.reasoner.answer == "3/4"


def test_steps_work_from_worker_threads(env, agents):
    """math-verify's own (signal) timeouts fail in threads; ours must not, since the executor uses to_thread."""
    s0 = env.reset(half_problem(), 0)

    async def many():
        responses = ["\\boxed{0.75}", "\\boxed{\\frac{6}{8}}", "\\boxed{3/5}", "\\boxed{x}"]
        return await asyncio.gather(*(asyncio.to_thread(act, env, agents, s0, "reasoner", r) for r in responses))

    results = asyncio.run(many())
    assert [t.state.reasoner.correct for t in results] == [True, True, False, False]


def test_verifier_timeout_counts_as_not_equivalent_and_recovers():
    verifier = MathVerifier(workers=1, timeout_s=0.001)  # the worker cannot even start in time
    assert verifier.equivalent("\\frac{1}{2}", "0.5") is False
    assert verifier.timeouts == 1
    verifier.timeout_s = 60
    assert verifier.equivalent("\\frac{1}{2}", "0.5") is True
    verifier.close()


def test_reset_rejects_rows_without_an_answer(env):
    from pettingllms.core import Problem

    with pytest.raises(ValueError, match="answer"):
        env.reset(Problem("bad", {"question": "q"}), 0)


def test_parsers():
    reasoner, tool = ReasonerAgent("reasoner"), ToolAgent("tool")
    assert reasoner.parse("a \\boxed{1} then \\boxed{\\frac{1}{2}}").answer == "\\frac{1}{2}"
    assert reasoner.parse("Final answer: 12").answer == "12"
    assert ReasonerAgent("reasoner", strict_boxed=True).parse("Final answer: 12").answer is None
    assert tool.parse(f"{FENCE}python\nprint(1)\n{FENCE}\n{FENCE}python\nprint(2)\n{FENCE}").code == "print(2)\n"
    assert tool.parse("no code here").code is None


def test_tree_rollout_through_the_executor_scores_branches_and_stops_on_agreement(make_executor):
    env = MathEnv(max_turns=3)

    def script(prompt: str, k: int, request) -> str:
        if "Write a Python program" in prompt.rsplit("<user>", 1)[-1]:
            return tool_response("print(3/4)" if k == 0 else "print(1/0)")
        return "\\boxed{\\frac{3}{4}}" if k == 1 else "\\boxed{2}"

    executor, _ = make_executor(env, script, branching=2)
    result = executor.run([half_problem()], [0])
    (episode,) = result.episodes
    assert episode.terminated and episode.turns == 1 and episode.success
    by_agent = {a: sorted(s.reward for s in result.samples if s.agent == a) for a in ("reasoner", "tool")}
    assert by_agent["reasoner"] == [0.0, 2.0]  # alpha * team + local: a wrong and a right branch
    assert by_agent["tool"] == [-1.0, 1.0]  # the tool's own term; the team term comes from the previous reasoner
