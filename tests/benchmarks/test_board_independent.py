"""The board-independent floor of a Plan-Path preset (benchmarks/board_independent.py): the best fixed answer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import board_independent as bi  # noqa: E402

from pettingllms.core import Problem  # noqa: E402
from pettingllms.envs.games_common.runner import EchoRunner  # noqa: E402
from pettingllms.envs.plan_path.env import PlanPathEnv  # noqa: E402


def grids(*rows_list):
    return [Problem(f"g{i}", {"rows": rows}) for i, rows in enumerate(rows_list)]


def test_the_best_fixed_answer_is_found_and_scored_by_the_real_env():
    env = PlanPathEnv(max_turns=1, runner=EchoRunner())
    problems = grids(["S.G"], [".SG"], ["G.S"])  # goals 2 right, 1 right, 2 left
    # "R R" solves the first two (moves after the goal are ignored); no list of 1-2 moves solves all three
    assert bi.best_fixed_answer(env, problems, 2) == ("R R", 2 / 3)
    assert bi.best_fixed_answer(env, problems, 1) == ("R", 1 / 3)


def test_turns_repeat_the_answer_and_the_move_budget_stops_them():
    two_turns = PlanPathEnv(max_turns=2, runner=EchoRunner())
    assert bi.best_fixed_answer(two_turns, grids(["G.S"]), 1) == ("L", 1.0)  # one L a turn, two turns
    budget = PlanPathEnv(max_turns=2, max_moves=1, runner=EchoRunner())
    assert bi.best_fixed_answer(budget, grids(["G.S"]), 1) == ("U", 0.0)  # out of moves after the first


@pytest.mark.bench
def test_board_independent_quick(tmp_path):
    report = bi.main(["--quick", "--out-dir", str(tmp_path)])
    assert report["max_length"] == 2 and (tmp_path / "board_independent_cpu_plan_path.json").is_file()


def test_the_preset_floor_is_below_the_learning_target(tmp_path):
    report = bi.main(["--max-length", "2", "--out-dir", str(tmp_path)])  # short lists: fast; the full run is 6
    assert report["preset"] == "cpu_plan_path" and report["held_out_problems"] == 64
    assert report["answers_tried"] == 4 + 16 and 0 < report["best_success"] < 0.5
    saved = json.loads((tmp_path / "board_independent_cpu_plan_path.json").read_text())
    assert saved["best_answer"] == report["best_answer"]


def test_the_best_fixed_sudoku_grid_takes_the_most_common_digit_at_each_hole(tmp_path):
    from pettingllms.envs.sudoku.env import SudokuEnv

    env = SudokuEnv(max_turns=2, holes=1, runner=EchoRunner())
    problems = env.procedural_problems("test", 64)
    answer, floor = bi.best_fixed_grid(env, problems, problems)
    starts = [env.reset(p, 0) for p in problems]
    holes = {}
    for state in starts:
        (cell,) = [(r, c) for r in range(4) for c in range(4) if not state.board.clues[r][c]]
        holes.setdefault(cell, []).append(state.board.solution[cell[0]][cell[1]])
    expected = sum(max(digits.count(d) for d in set(digits)) for digits in holes.values()) / 64
    assert floor == expected  # played through the env, it solves exactly the puzzles its digit is right for
    assert bi.success(env, starts, "[[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]") < floor
    report = bi.main(["--preset", "cpu_sudoku", "--out-dir", str(tmp_path)])
    assert report["env"] == "sudoku" and report["best_success"] == floor and report["best_answer"] == answer
    # picked on training puzzles, a fixed grid holds about the rate of guessing the digit (1 in 4)
    assert 0.15 <= report["train_picked_success"] <= 0.35


def test_the_committed_floors_were_made_with_the_presets_as_shipped():
    # docs and README cite these files: a preset change must come with a new floor
    from pettingllms.entry.train import load_config

    for preset in ("cpu_plan_path", "cpu_sokoban", "cpu_sudoku"):
        saved = json.loads((bi.RESULTS_DIR / f"board_independent_{preset}.json").read_text())
        cfg = load_config("train", [f"+experiment={preset}"])
        assert saved["env_options"] == dict(cfg.env.options) and saved["max_turns"] == cfg.env.max_turns
        assert saved["held_out_problems"] == cfg.env.max_val_problems


def test_the_sokoban_floor_is_the_levels_one_straight_push_direction_solves():
    # with cpu_sokoban's 2-move budget a fixed answer solves a level only if its shortest solution is that answer
    # (or its first move): counted here from the BFS solutions, independently of the search over answers
    from pettingllms.envs.games_common.runner import EchoRunner
    from pettingllms.envs.sokoban.env import SokobanEnv, solve_bfs

    env = SokobanEnv(max_turns=2, size=6, boxes=1, max_moves=2, runner=EchoRunner())
    problems = env.procedural_problems("test", 64)
    answer, floor = bi.best_fixed_answer(env, problems, 2)
    shortest = [" ".join(solve_bfs(env.reset(p, 0).board)) for p in problems]
    first = answer.split()[0]
    assert floor == sum(s in (first, f"{first} {first}") for s in shortest) / 64
    assert floor == max(sum(s in (m, f"{m} {m}") for s in shortest) for m in bi.MOVES) / 64  # no direction does better
