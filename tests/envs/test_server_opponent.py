"""``env.options.opponent=server``: an OpenSpiel game's opponent is a model behind a real OpenAI-compatible server
(here the run's own gateway, serving a scripted policy and the tiny random model): it sees the seat's prompt, its
legal answer is played, an answer naming no legal move falls back to a uniform legal move and is counted; the env
still passes check-env, and a run trains against it."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("pyspiel", reason="the games extra")

from pettingllms.core import ConfigError, Problem  # noqa: E402
from pettingllms.core.checker import check_env  # noqa: E402
from pettingllms.envs.openspiel_game.env import OpenSpielEnv  # noqa: E402
from pettingllms.rollout.scripted import ScriptedEngine  # noqa: E402
from served_opponent import serving_rival  # noqa: E402

KEY_ENV = "PETTINGLLMS_TEST_OPPONENT_KEY"


def last_legal_move(prompt: str, k: int, request) -> str:
    """A scripted opponent: the last legal move the prompt lists (so it differs from the random fallback's habits)."""
    moves = re.findall(r"Legal moves: (.*)", prompt)[-1].split(", ")
    return moves[-1]


@pytest.fixture
def served(monkeypatch):
    with serving_rival(last_legal_move, monkeypatch, KEY_ENV) as gateway:
        yield gateway


def env_against(url: str, **options) -> OpenSpielEnv:
    return OpenSpielEnv(game="tic_tac_toe", opponent="server", opponent_url=url, opponent_model="rival",
                        opponent_key_env=KEY_ENV, one_shot=True, **options)


def test_the_served_model_answers_from_the_seats_prompt_and_its_legal_move_is_played(served):
    env = env_against(served.base_url)
    second = Problem("g", {"seed": 1})  # seat 1: the opponent opens
    state = env.reset(second, 0)
    (call,) = served.calls("game")
    prompt = ScriptedEngine(last_legal_move).codec.decode(call.prompt_ids)
    assert "You are player 0" in prompt and "Legal moves:" in prompt  # the seat's prompt, worked example first
    assert prompt.index("Legal moves:") < prompt.rindex("You are player 0")
    assert state.history == (8,) and state.opponent_fallbacks == 0  # the last legal move of an empty board: (2,2)
    moved = env.step(state, "player", state.legal[0])
    assert moved.info["opponent_fallbacks"] == 0.0 and len(moved.state.history) == 3


def test_an_answer_naming_no_legal_move_or_a_failed_request_falls_back_and_is_counted(served, monkeypatch, caplog):
    env = env_against(served.base_url)
    monkeypatch.setenv(KEY_ENV, "wrong-key")  # every request refused (401)
    state = env.reset(Problem("g", {"seed": 1}), 0)
    assert state.opponent_fallbacks == 1 and len(state.history) == 1
    assert "the request failed: HTTP 401" in caplog.text and caplog.text.count("logged once") == 1
    moved = env.step(state, "player", state.legal[0])
    assert moved.info["opponent_fallbacks"] == 2.0
    # the fallback is the uniform move the position's seed draws: the same game replays identically
    again = env.reset(Problem("g", {"seed": 1}), 0)
    assert again.history == state.history


def test_check_env_passes_against_a_served_opponent_and_a_missing_url_is_refused(served):
    report = check_env(env_against(served.base_url), seed=0)
    assert report.ok, report.format()
    with pytest.raises(ConfigError, match="opponent=server needs env.options.opponent_url"):
        OpenSpielEnv(game="tic_tac_toe", opponent="server")


def test_two_training_steps_against_a_served_opponent(served, tmp_path):
    from pettingllms.entry.train import run_training

    url = served.base_url
    trainer, results = run_training("train", [
        "env.name=openspiel", "env.options.game=tic_tac_toe", "env.options.opponent=server",
        f"env.options.opponent_url={url}", "env.options.opponent_model=rival", f"env.options.opponent_key_env={KEY_ENV}",
        "base_models.policy_0.path=tiny-random-smollm2", "specialization=L0", "training.total_training_steps=2",
        "training.train_batch_size=2", "rollout.branching=2", "training.max_response_length=8", "env.max_turns=6",
        "training.max_prompt_length=2048", "training.val_freq=0", "training.val_before_train=false",
        "training.export_hf=false", "training.plot=false", "resources.use_ray=false", f"training.log_dir={tmp_path}"])
    assert len(results) == 2 and len(served.calls("game")) > 0
    assert results[-1].metrics["policy_0/player/info/opponent_fallbacks_mean"] == 0.0  # the script is always legal
