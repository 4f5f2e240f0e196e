"""The library games (``env.name=openspiel``, ``env.name=textarena``), played as the libraries really behave: their
turn rules, chance, invalid moves, and TextArena's global random generator and accumulating observation wrapper."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest

pyspiel = pytest.importorskip("pyspiel", reason="the games extra: pip install -e '.[games]'")
textarena = pytest.importorskip("textarena", reason="the games extra: pip install -e '.[games]'")

from pettingllms.cli import main  # noqa: E402
from pettingllms.core import ConfigError, Problem  # noqa: E402
from pettingllms.core.checker import check_env  # noqa: E402
from pettingllms.envs.openspiel_game.env import OpenSpielEnv, match_move  # noqa: E402
from pettingllms.envs.textarena_game import env as arena_module  # noqa: E402
from pettingllms.envs.textarena_game.env import TextArenaEnv  # noqa: E402


@pytest.mark.parametrize("args", [
    ["openspiel", "--option", "game=tic_tac_toe"], ["openspiel", "--option", "game=kuhn_poker"],
    ["openspiel", "env.options.game=tic_tac_toe", "env.options.opponent=random"],
    ["textarena", "--option", "game=TicTacToe-v0"], ["textarena", "--option", "game=KuhnPoker-v0"],
    ["textarena", "--option", "game=TicTacToe-v0", "--option", "opponent=random"],
    ["textarena", "--option", "game=KuhnPoker-v0", "--option", "opponent=random"],
])
def test_check_env_passes_for_each_librarys_games(args, capsys):
    assert main(["check-env", *args]) == 0, capsys.readouterr().out


def test_check_env_options_are_typed_and_a_wrong_game_is_named(capsys):
    assert main(["check-env", "openspiel", "--option", "game=tic_tac_to"]) == 1
    assert "did you mean tic_tac_toe" in capsys.readouterr().out
    assert main(["check-env", "openspiel", "--option", "nokey"]) == 2
    assert "give KEY=VALUE" in capsys.readouterr().err


def test_an_openspiel_game_follows_the_librarys_turns_and_returns():
    env = OpenSpielEnv(game="tic_tac_toe")
    state = env.reset(Problem("p", {"seed": 0}), 0)
    for agent, move in [("player_0", "x(1,1)"), ("player_1", "o(0,0)"), ("player_0", "I play x(0,1)"),
                        ("player_1", "o(2,2)")]:
        assert env.acting_agents(state) == (agent,)
        step = env.step(state, agent, move)
        assert not step.terminated
        state = step.state
    step = env.step(state, "player_0", "x(2,1)")  # the middle column
    assert step.terminated and env.outcome(step.state) == {"player_0": 1.0, "player_1": -1.0}
    assert env.success(step.state)


def test_an_invalid_move_is_retried_by_the_same_seat_and_the_second_forfeits():
    env = OpenSpielEnv(game="tic_tac_toe", max_invalid=2)
    state = env.reset(Problem("p", {"seed": 0}), 0)
    once = env.step(state, "player_0", "the middle please")
    assert not once.terminated and env.acting_agents(once.state) == ("player_0",)
    assert "not one of the legal moves" in once.state.prompt
    twice = env.step(once.state, "player_0", "hmm")
    assert twice.terminated and env.outcome(twice.state) == {"player_0": -1.0, "player_1": 1.0}
    with pytest.raises(ValueError, match="the seat to move is 'player_0'"):
        env.step(state, "player_1", "o(0,0)")


def test_kuhn_poker_deals_from_the_seed_and_a_fixed_opponent_alternates_seats():
    env = OpenSpielEnv(game="kuhn_poker")
    deals = {env.reset(Problem("p", {"seed": s}), 0).history[:2] for s in range(12)}
    assert len(deals) > 1 and env.reset(Problem("p", {"seed": 3}), 0) == env.reset(Problem("p", {"seed": 3}), 0)
    versus = OpenSpielEnv(game="tic_tac_toe", opponent="random")
    assert list(versus.graph.agents) == ["player"]
    first, second = (versus.reset(Problem("p", {"seed": s}), 0) for s in (0, 1))
    assert first.seat == 0 and first.history == ()  # player 0 moves first: nothing played yet
    assert second.seat == 1 and len(second.history) == 1  # the random opponent opened
    assert "o(" in second.prompt and versus.acting_agents(second) == ("player",)


def test_a_state_string_of_digits_comes_with_its_key():
    """Kuhn Poker's observation is ``<card><chips per player>`` (``211``): the prompt says so, with the deck's size."""
    for game, cards in (("kuhn_poker", 3), ("kuhn_poker(players=3)", 4)):
        env = OpenSpielEnv(game=game)
        prompt = env.reset(Problem("p", {"seed": 1}), 0).prompt
        state_line = prompt.splitlines()[2]
        assert state_line.isdigit() and len(state_line) == 1 + env.players
        assert f"your card (0 is the lowest of the {cards} cards, {cards - 1} the highest" in prompt
    assert "reads" not in OpenSpielEnv(game="tic_tac_toe").reset(Problem("p", {"seed": 1}), 0).prompt


def test_match_move_reads_the_whole_answer_or_the_last_legal_move_written():
    legal = ("Pass", "Bet")
    assert match_move(" bet ", legal) == "Bet"
    assert match_move("I would Pass, no wait: Bet", legal) == "Bet"
    assert match_move("fold", legal) is None
    assert match_move("x(1,1)x(1,2)", ("x(1,1)", "x(1,2)")) == "x(1,2)"
    # a move inside a word is not written (a 3-player Kuhn Poker run took 'Beta' for Bet)
    assert match_move("Beta\n\n211", legal) is None and match_move("Alphabet", legal) is None
    assert match_move("Bet, not Beta", legal) == "Bet" and match_move("I Pass.", legal) == "Pass"


def test_where_two_legal_moves_differ_only_in_case_the_case_decides():
    """Chess: ``bxc5`` (the pawn takes) and ``Bxc5`` (the bishop takes) are both legal; the first listed used to win."""
    legal = ("a3", "bxc5", "Bxc5", "Nf3")
    assert match_move("Bxc5", legal) == "Bxc5" and match_move("bxc5", legal) == "bxc5"
    assert match_move("I take with the bishop: Bxc5.", legal) == "Bxc5"
    assert match_move("BXC5", legal) is None  # names both: refused as invalid, never one chosen for it
    assert match_move("nf3", legal) == "Nf3" and match_move("then NF3", legal) == "Nf3"  # no twin: case aside
    env = OpenSpielEnv(game="chess")
    state = env.reset(Problem("p", {"seed": 0}), 0)
    for move in "b4 Nf6 d3 a6 Be3 h6 Bd4 c5".split():
        state = env.step(state, env.acting_agents(state)[0], move).state
    white = env.acting_agents(state)[0]

    def fifth_rank(answer):  # the FEN's ranks run from the 8th down
        return env._replay(env.step(state, white, answer).state.history).to_string().split()[0].split("/")[3]

    assert "B" in fifth_rank("Bxc5") and "B" not in fifth_rank("bxc5")  # the bishop took, or the pawn did


def test_a_forfeit_is_the_forfeiters_worst_outcome_in_the_game():
    """A fixed -1 let a Leduc seat facing a -9 fold lose less by answering garbage twice."""
    env = OpenSpielEnv(game="leduc_poker", max_invalid=2)
    state = env.reset(Problem("p", {"seed": 0}), 0)
    seat = env.acting_agents(state)[0]
    forfeited = env.step(env.step(state, seat, "blah").state, seat, "blah").state
    assert env.outcome(forfeited)[seat] == env.game.min_utility() == -13
    assert sum(env.outcome(forfeited).values()) == 0  # zero-sum: the other seat wins what it loses
    assert OpenSpielEnv(game="tic_tac_toe")._forfeit_returns(0) == [-1.0, 1.0]
    assert OpenSpielEnv(game="kuhn_poker(players=3)")._forfeit_returns(1) == [1.0, -2.0, 1.0]


@pytest.mark.parametrize("mode", ["tree", "independent", "trajectory"])
def test_a_game_its_fixed_opponent_ends_inside_reset_is_an_episode_with_its_result_and_no_samples(make_executor,
                                                                                                      mode):
    """Pig to 5 against the random opponent: for problem seed 1 the opponent wins before the trained seat moves
    (the rollout raised 'acting_agents returned []' and the run stopped)."""
    env = OpenSpielEnv(game="pig(winscore=5)", opponent="random")
    assert env.acting_agents(env.reset(Problem("p1", {"seed": 1}), 0)) == ()
    executor, _ = make_executor(env, lambda prompt, k, request: "stop", mode=mode, branching=2)
    result = executor.run([Problem("p1", {"seed": 1}), Problem("p2", {"seed": 2})], [0, 0])
    over = [e for e in result.episodes if e.problem_id == "p1"]
    assert over and all(e.terminated and e.turns == 0 and e.outcomes == {"player": -1.0} and e.error is None
                        for e in over)
    assert not [s for s in result.samples if s.problem_id == "p1"]
    assert [s for s in result.samples if s.problem_id == "p2"]  # the other problem trains as ever


def test_a_game_that_draws_chance_inside_its_moves_is_refused():
    with pytest.raises(ConfigError, match="sampled stochastic"):
        OpenSpielEnv(game="negotiation")


def test_textarena_replays_are_exact_and_the_library_decides_who_acts():
    env = TextArenaEnv(game="KuhnPoker-v0")
    problem = Problem("p", {"seed": 5})
    start = env.reset(problem, 0)
    assert env.reset(problem, 0) == start, "its observation wrapper must not carry text across replays"
    seat = env.acting_agents(start)[0]
    invalid = env.step(start, seat, "[raise 100]")
    assert env.acting_agents(invalid.state) == (seat,), "an invalid move is resubmitted by the same seat"
    assert "invalid" in invalid.state.prompt.lower()


def test_a_textarena_game_lost_by_invalid_moves_is_not_a_success_in_self_play():
    """As in openspiel: a game ended by a forfeit was won by no one's play (TextArena's game_info names the seat)."""
    env = TextArenaEnv(game="TicTacToe-v0")
    state = env.reset(Problem("p", {"seed": 0}), 0)
    seat = env.acting_agents(state)[0]
    for _ in range(2):  # the library's default: one resubmit, then the second invalid move loses
        step = env.step(state, seat, "no move here")
        state = step.state
    assert step.terminated and state.forfeit == int(seat[-1])
    assert env.outcome(state)[seat] == -1.0 and not env.success(state)
    played = env.reset(Problem("p", {"seed": 0}), 0)
    for move in ["[4]", "[0]", "[1]", "[2]", "[7]"]:  # the middle column wins
        step = env.step(played, env.acting_agents(played)[0], move)
        played = step.state
    assert step.terminated and played.forfeit is None and env.success(played)
    assert sorted(env.outcome(played).values()) == [-1.0, 1.0]


def test_textarena_forks_share_no_random_state_across_threads():
    """Without the replay lock, TextArena's module-level random makes forks stepped in threads differ; the checker's
    thread check sees it. With the lock, never."""
    failures = []
    for seed in range(8):
        report = check_env(TextArenaEnv(game="KuhnPoker-v0"), seed=seed)
        failures.append(not report.ok)
    assert not any(failures)
    lock, interval = arena_module._REPLAY, sys.getswitchinterval()
    try:
        arena_module._REPLAY = contextlib.nullcontext()
        # threads switch every microsecond, so they interleave inside a replay even on a loaded machine (at the
        # default 5 ms, two busy cores let each replay finish alone and the race went unseen)
        sys.setswitchinterval(1e-6)
        caught = next((seed for seed in range(60) if not check_env(TextArenaEnv(game="KuhnPoker-v0"), seed=seed).ok),
                      None)
    finally:
        arena_module._REPLAY = lock
        sys.setswitchinterval(interval)
    assert caught is not None, "the thread check should catch the race the lock prevents"


TRAIN = ["base_models.policy_0.path=tiny-random-smollm2", "training.total_training_steps=2",
         "training.train_batch_size=2", "rollout.branching=2", "training.max_response_length=8",
         "training.max_prompt_length=2048", "training.val_freq=0", "training.val_before_train=false",
         "training.export_hf=false", "training.plot=false", "resources.use_ray=false", "env.max_turns=6"]


@pytest.mark.parametrize("game", [["env.name=openspiel", "env.options.game=tic_tac_toe"],
                                  ["env.name=openspiel", "env.options.game=kuhn_poker"],
                                  ["env.name=textarena", "env.options.game=TicTacToe-v0"],
                                  ["env.name=textarena", "env.options.game=KuhnPoker-v0"]])
def test_two_training_steps_record_each_seats_results(game, tmp_path):
    from pettingllms.entry.train import run_training

    trainer, _ = run_training("train", [*TRAIN, *game, f"training.log_dir={tmp_path}"])
    rows = [json.loads(line) for line in (Path(trainer.run_dir) / "summary.log").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        for seat in ("player_0", "player_1"):
            rates = [row[f"episode/{seat}/{name}_rate"] for name in ("win", "draw", "loss")]
            assert sum(rates) == pytest.approx(1.0)
            # every immediate reward is 0: a return is the seat's result once, within the game's range (a forfeit
            # after an invalid move used to count -2 in tree mode)
            bound = 2.0 if "kuhn_poker" in game[1] else 1.0
            assert abs(row.get(f"policy_0/{seat}/episode_return_mean", 0.0)) <= bound  # a seat may never act


def test_eval_of_a_game_run_reports_win_rates_with_intervals_against_the_random_opponent(tmp_path, capsys):
    from pettingllms.entry.eval import run_eval
    from pettingllms.entry.train import run_training

    trainer, _ = run_training("train", [*TRAIN, "env.name=openspiel", "env.options.game=tic_tac_toe",
                                        f"training.log_dir={tmp_path / 'train'}"])
    result = run_eval("eval", [f"model.checkpoint={trainer.run_dir}", "env.options.opponent=random",
                               "env.max_val_problems=4", "eval.n=2", "eval.temperature=1.0", "eval.max_tokens=8",
                               f"eval.log_dir={tmp_path / 'eval'}"], print_table=True)
    seats = result.summary["benchmarks"]["openspiel/procedural"]["seats"]
    player = seats["player"]
    assert player["games"] == 8
    low, high = player["loss_ci95"]
    assert 0.0 <= low <= player["loss_rate"] <= high <= 1.0
    # every immediate reward is 0 and the player moves in every game: its return is its result, counted once
    returns = result.summary["benchmarks"]["openspiel/procedural"]["agents"]["player"]["return_mean"]
    assert returns == pytest.approx(player["outcome_mean"])
    out = capsys.readouterr().out
    assert "per seat (games)" in out, out


def test_textarenas_random_opponent_draws_from_the_moves_the_library_lists_and_replays_identically():
    from pettingllms.envs.textarena_game.env import listed_moves

    env = TextArenaEnv(game="TicTacToe-v0", opponent="random")
    first = env.reset(Problem("t", {"seed": 1}), 0)  # seed 1: player holds seat 1, so the opponent opens
    assert first.seat == 1 and len(first.moves) == 1 and first.moves[0] in [f"[{i}]" for i in range(9)]
    assert env.reset(Problem("t", {"seed": 1}), 0) == first  # seeded by the game: a replay draws the same move
    assert first.moves[0] not in listed_moves(first.prompt)  # the library no longer lists the square it took
    poker = TextArenaEnv(game="KuhnPoker-v0", opponent="random")
    state = poker.reset(Problem("k", {"seed": 0}), 0)
    assert set(listed_moves(state.prompt)) <= {"[check]", "[bet]", "[call]", "[fold]"} and listed_moves(state.prompt)
    assert listed_moves("no list here\nnor here") == []


def test_eval_of_a_textarena_run_against_its_random_opponent_reports_win_rates_with_intervals(tmp_path):
    from pettingllms.entry.eval import run_eval
    from pettingllms.entry.train import run_training

    trainer, _ = run_training("train", [*TRAIN, "env.name=textarena", "env.options.game=TicTacToe-v0",
                                        "env.options.opponent=random", f"training.log_dir={tmp_path / 'train'}"])
    rows = [json.loads(line) for line in (Path(trainer.run_dir) / "summary.log").read_text().splitlines()]
    assert {"episode/player/win_rate", "episode/player/loss_rate"} <= set(rows[-1])
    result = run_eval("eval", [f"model.checkpoint={trainer.run_dir}", "env.options.opponent=random",
                               "env.max_val_problems=4", "eval.n=2", "eval.temperature=1.0", "eval.max_tokens=8",
                               f"eval.log_dir={tmp_path / 'eval'}"], print_table=False)
    player = result.summary["benchmarks"]["textarena/procedural"]["seats"]["player"]
    assert player["games"] == 8
    low, high = player["loss_ci95"]
    assert 0.0 <= low <= player["loss_rate"] <= high <= 1.0


@pytest.mark.parametrize("game, players", [("ThreePlayerTicTacToe-v0", "three"), ("Sudoku-v0", "1")])
def test_a_textarena_game_that_is_not_for_two_players_is_refused_when_the_env_is_built(game, players):
    with pytest.raises(ConfigError, match=rf"plays two-player games, and TextArena's {game} does not start with 2 "
                                          rf"players .*{players}"):
        TextArenaEnv(game=game)
