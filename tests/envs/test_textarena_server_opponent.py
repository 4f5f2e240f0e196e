"""``env.options.opponent=server`` for TextArena games: a model behind a real OpenAI-compatible server (the run's own
gateway serving a scripted policy) plays the seat the trained agent does not hold. It sees that seat's observation,
its answer is the move the library judges, the moves are in the state (a replay never asks again), a failed request
sends an empty move and is counted, and the env passes check-env."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("textarena", reason="the games extra")

from pettingllms.core import ConfigError, Problem  # noqa: E402
from pettingllms.core.checker import check_env  # noqa: E402
from pettingllms.envs.textarena_game.env import TextArenaEnv  # noqa: E402
from pettingllms.rollout.scripted import ScriptedEngine  # noqa: E402
from served_opponent import serving_rival  # noqa: E402

KEY_ENV = "PETTINGLLMS_TEST_TEXTARENA_OPPONENT_KEY"


def highest_free_cell(prompt: str, k: int, request) -> str:
    """A scripted opponent: the last available move the latest board lists."""
    moves = re.findall(r"Available Moves: (.*)", prompt)[-1]
    return re.findall(r"\[\d\]", moves)[-1]


@pytest.fixture
def served(monkeypatch):
    with serving_rival(highest_free_cell, monkeypatch, KEY_ENV) as gateway:
        yield gateway


def env_against(url: str) -> TextArenaEnv:
    return TextArenaEnv(game="TicTacToe-v0", opponent="server", opponent_url=url, opponent_model="rival",
                        opponent_key_env=KEY_ENV)


def test_the_served_model_plays_the_other_seat_from_its_observation(served):
    env = env_against(served.base_url)
    assert env.graph.agents == ("player",)
    first = env.reset(Problem("g", {"seed": 0}), 0)  # seat 0: player opens, nobody was asked
    assert first.seat == 0 and first.to_move == 0 and first.moves == () and served.calls("game") == []
    second = env.reset(Problem("g", {"seed": 1}), 0)  # seat 1: the served model opened
    (call,) = served.calls("game")
    assert "You are Player 0" in ScriptedEngine(highest_free_cell).codec.decode(call.prompt_ids)
    assert second.moves == ("[8]",) and second.to_move == 1 and env.acting_agents(second) == ("player",)
    moved = env.step(second, "player", "[4]")
    assert moved.state.moves == ("[8]", "[4]", "[7]") and moved.info == {"opponent_fallbacks": 0.0}
    asked = len(served.calls("game"))
    assert env.step(second, "player", "[4]").state == moved.state  # a replayed fork: same game
    assert len(served.calls("game")) == asked + 1  # ... asked again only for the fork's own next move


def test_the_trained_seat_gets_its_outcome_and_a_failed_request_is_counted(served):
    env = env_against(served.base_url)
    state = env.reset(Problem("g", {"seed": 0}), 0)
    for move in ("[0]", "[1]", "[2]"):  # the opponent answers [8], [7]: player completes the top row
        state = env.step(state, "player", move).state
    assert state.to_move == -1 and env.outcome(state) == {"player": 1.0} and env.success(state)
    offline = TextArenaEnv(game="TicTacToe-v0", opponent="server", opponent_url="http://127.0.0.1:9/v1",
                           opponent_model="rival", opponent_key_env=KEY_ENV, opponent_timeout=2)
    opened = offline.reset(Problem("g", {"seed": 1}), 0)
    # An empty move each time: the library asks the invalid mover again, and its second invalid move loses the game.
    assert opened.moves == ("", "") and opened.opponent_fallbacks == 2
    assert opened.to_move == -1 and offline.outcome(opened) == {"player": 1.0}


def test_the_env_passes_check_env_against_a_served_opponent(served):
    report = check_env(env_against(served.base_url), seed=0)
    assert report.ok, report.format()


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match="opponent_url"):
        TextArenaEnv(opponent="server")
    with pytest.raises(ConfigError, match="one of"):
        TextArenaEnv(opponent="mcts")  # OpenSpiel's bot; TextArena has none


def test_two_training_steps_against_a_served_opponent(served, tmp_path):
    from pettingllms.entry.train import run_training

    trainer, results = run_training("train", [
        "env.name=textarena", "env.options.game=TicTacToe-v0", "env.options.opponent=server",
        f"env.options.opponent_url={served.base_url}", "env.options.opponent_model=rival",
        f"env.options.opponent_key_env={KEY_ENV}", "base_models.policy_0.path=tiny-random-smollm2", "specialization=L0",
        "training.total_training_steps=2", "training.train_batch_size=2", "rollout.branching=2",
        "training.max_response_length=8", "env.max_turns=6", "training.max_prompt_length=2048", "training.val_freq=0",
        "training.val_before_train=false", "training.export_hf=false", "training.plot=false", "resources.use_ray=false",
        f"training.log_dir={tmp_path}"])
    assert len(results) == 2 and len(served.calls("game")) > 0
    assert results[-1].metrics["policy_0/player/info/opponent_fallbacks_mean"] == 0.0  # the server always answered
