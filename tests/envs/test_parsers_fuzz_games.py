"""Every game parser and env.step survives arbitrary text: thousands of random and adversarial responses."""

from __future__ import annotations

import math
import random
import time

import pytest

from pettingllms.envs.games_common.agents import PlanAgent, ToolAgent
from pettingllms.envs.games_common.base import PLAN, TOOL
from pettingllms.envs.games_common.runner import EchoRunner
from pettingllms.envs.games_common.parsing import (
    extract_code,
    parse_moves,
    parse_sudoku_answer,
    text_after_actions_marker,
    text_after_last,
)
from pettingllms.envs.plan_path.env import PlanPathEnv
from pettingllms.envs.sokoban.env import SokobanEnv
from pettingllms.envs.sudoku.env import SudokuEnv
from pettingllms.core.checker import GARBAGE_RESPONSES, random_responses

ADVERSARIAL = (
    "####",
    "#### ####",
    "####\n####\n#### U",
    "#### [",
    "#### ]",
    "#### [[0, 0, 1], [0, 1,",
    "#### [[[[[[1]]]]]]",
    "#### (((( 1, 2, 3 ))))",
    "#### " + "U" * 100_000,
    "#### " + "[1, 2, 3], " * 20_000,
    "#### " + "1 2 3 4\n" * 5_000,
    "**Actions List**: " * 2_000,
    "**Actions List**: [" + "'Up', " * 10_000,
    "```python\n" * 3_000,
    "```python\nprint(1)\n```" * 500,
    "```\n```",
    "```python\n```",
    "[" * 10_000 + "]" * 3,
    "(" * 5_000 + ")" * 5_000,
    "#### 99999999999999999999 -1 0 1e9",
    "#### [[-1, -1, -1], [4, 4, 4], [0, 0, 0]]",
    "#### [[0,0,1],[0,0,2],[0,0,3],[0,0,4]]",
    "####\x00\x01\x02",
    "#### \ud800\udfff lone surrogates",
    "#### ＵＰ　ＤＯＷＮ ↑ ↓ ← →",
    "#### U,,,,,,D;;;;L\t\tR",
    "#### 1234\n4321\n2143\n3412",
    "#### 1 2 3 4 5 6 7 8 9\n" * 9,
)
NON_STRING_ACTIONS = (None, 0, 1.5, math.nan, ["U", "D"], ("R",), b"#### U", {"a": 1}, object())


def corpus(n_random: int) -> list[str]:
    rng = random.Random(7)
    markers = ("#### ", "**Actions List**: ")
    mixed = [rng.choice(markers) + text for text in random_responses(n_random, 3)]
    return list(GARBAGE_RESPONSES) + list(ADVERSARIAL) + random_responses(n_random, 1) + mixed


TEXTS = corpus(1500)  # ~3,000 responses


def test_text_parsers_never_raise():
    for text in TEXTS:
        extract_code(text)
        text_after_last(text, "####")
        text_after_actions_marker(text)
        for segment in (text, text_after_last(text, "####")):
            parse_moves(segment)
            for size in (4, 9):
                fills = parse_sudoku_answer(segment, size)
                assert fills is None or all(isinstance(f, tuple) and len(f) == 3 for f in fills)
    for value in NON_STRING_ACTIONS:
        assert parse_moves(value) is None and parse_sudoku_answer(value, 4) is None and extract_code(value) is None


def test_agent_parsers_never_raise():
    tool, plan = ToolAgent(TOOL), PlanAgent(PLAN)
    for text in TEXTS:
        code = tool.parse(text)
        answer = plan.parse(text)
        assert code is None or isinstance(code, str)
        assert answer is None or isinstance(answer, str)


@pytest.mark.parametrize("env_cls", [SokobanEnv, SudokuEnv, PlanPathEnv])
def test_env_step_never_raises_and_keeps_rewards_finite(env_cls):
    runner = EchoRunner()  # the "program output" is the text itself, so stdout parsing is fuzzed too
    env = env_cls(runner=runner)
    tool, plan = ToolAgent(TOOL), PlanAgent(PLAN)
    s0 = env.reset(env.example_problems(1)[0], 0)
    started = time.perf_counter()
    for text in TEXTS:
        for agent, action in ((TOOL, text), (TOOL, tool.parse(text)), (PLAN, plan.parse(text)), (PLAN, text)):
            t = env.step(s0, agent, action)
            reward = t.state.tool.sim_reward if agent == TOOL else t.state.plan_reward
            assert math.isfinite(reward) and math.isfinite(env.team_reward(t.state))
            assert isinstance(t.terminated, bool) and isinstance(t.truncated, bool)
    for value in NON_STRING_ACTIONS:
        env.step(s0, TOOL, value)
        env.step(s0, PLAN, value)
    assert runner.calls >= sum(bool(text.strip()) for text in TEXTS)  # every non-blank text "ran"
    assert time.perf_counter() - started < 30, "parsing must stay fast on adversarial input"


def test_the_prompt_survives_adversarial_tool_output():
    env = SokobanEnv(runner=EchoRunner())
    s0 = env.reset(env.example_problems(1)[0], 0)
    for text in ADVERSARIAL:
        state = env.step(s0, TOOL, text).state
        content = PlanAgent(PLAN).observe(state, 0)[-1]["content"]
        assert isinstance(content, str) and len(content) < 12_000  # code and output are shown cut
