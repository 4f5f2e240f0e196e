"""Fuzz: every math and code parser, and env.step on every agent, survive thousands of random and adversarial
responses without an exception and within a time bound."""

from __future__ import annotations

import time

import pytest

from pettingllms.envs.common import parsing
from pettingllms.envs.code.env import CodeEnv
from pettingllms.envs.math.env import MathEnv
from pettingllms.core.checker import GARBAGE_RESPONSES, random_responses
from pettingllms.core.registry import make_agents

FENCE = "```"
ADVERSARIAL = (
    "\\boxed{" * 20_000,
    "\\boxed{" + "{" * 50_000 + "1",
    "}" * 50_000 + "\\boxed{1}",
    "\\boxed{}" * 10_000,
    "\\fbox{" * 10_000 + "}",
    FENCE * 30_000,
    f"{FENCE}python\n" * 10_000,
    f"{FENCE}python\nprint(1)\n{FENCE}" * 500,
    "**Test Input:**\n" * 20_000,
    "**Test Input:**\n```\n1\n```\n**Test Output:**\n```\n",
    "**Test Input:**\n```\n1\n```\n" * 5_000,
    "Test Input Test Output " * 10_000,
    "\n" * 300_000,
    " " * 300_000 + "Test",
    "Answer: " * 20_000,
    "1," * 100_000,
    "\x00" * 1000,
    "\ud800 lone surrogate \udfff",
    f"{FENCE}python\nprint('\ud800')\n{FENCE}",
    "**Test Input:**\n```\n\ud800\n```\n**Test Output:**\n```\n\udfff\n```",
    "العربية עברית 中文 한국어 \u202e\u200b\ufeff",
    f"{FENCE}python\nprint('{'x' * 100_000}')\n{FENCE}",
)
PARSERS = {
    "code_blocks": lambda t: parsing.code_blocks(t),
    "last_python_block": parsing.last_python_block,
    "last_boxed": parsing.last_boxed,
    "final_answer": parsing.final_answer,
    "parse_test_pairs": lambda t: parsing.parse_test_pairs(t, 5),
}


def corpus(n_random: int) -> list:
    return [*GARBAGE_RESPONSES, *ADVERSARIAL, *random_responses(n_random, seed=7), None, 42, b"bytes"]


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_text_parsers_never_raise_and_stay_fast(name):
    parser = PARSERS[name]
    for text in corpus(3000):
        start = time.perf_counter()
        parser(text)
        assert time.perf_counter() - start < 1.0, f"{name} too slow on {str(text)[:40]!r}"


@pytest.mark.parametrize("env_cls", [MathEnv, CodeEnv])
def test_agent_parsers_and_env_step_never_raise(env_cls):
    env = env_cls(sandbox_workers=2)
    agents = make_agents(env)
    s0 = env.reset(env_cls.example_problems(1)[0], 0)
    for role, agent in agents.items():
        actions = [agent.parse(text) for text in corpus(3000)]
        for action in actions:
            transition = env.step(s0, role, action)
            assert isinstance(transition.terminated, bool)
            assert isinstance(agent.local_reward(transition.state), float)
            agent.observe(transition.state, 1)  # later-turn prompts render any state
    env.runner.close()


def test_the_fuzz_corpus_reaches_the_sandbox_and_the_test_parser():
    """Guard against a corpus too tame to exercise anything: some items must yield code and test pairs."""
    texts = corpus(3000)
    assert sum(parsing.last_python_block(t) is not None for t in texts) >= 5
    assert sum(bool(parsing.parse_test_pairs(t, 5)) for t in texts) >= 2
