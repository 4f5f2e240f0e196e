"""Sudoku: unique-solution generation, a solved check that keeps the clues, both answer formats, seeds."""

from __future__ import annotations

import json

import pytest

from pettingllms.envs.games_common.base import PLAN, TOOL
from pettingllms.envs.games_common.runner import EchoRunner
from pettingllms.envs.sudoku.env import SudokuEnv, breaks_rules, count_solutions, generate_puzzle, is_solved_grid
from pettingllms.core import DataError, Problem
from pettingllms.core.checker import check_env

PUZZLE = [[1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]]


def env(**kw):
    return SudokuEnv(runner=EchoRunner(), **kw)


def grid_text(grid):
    return "[" + ", ".join("[" + ", ".join(map(str, row)) + "]" for row in grid) + "]"


def relabelled(grid, a, b):
    """A valid grid with digits a and b swapped everywhere (still a valid Sudoku)."""
    return [[b if v == a else a if v == b else v for v in row] for row in grid]


@pytest.mark.parametrize("size", [4, 9])
def test_check_env_passes(size):
    e = env(size=size)
    problems = [e.materialize(p) for p in e.procedural_problems("train", 2)]  # this size's own puzzles
    assert len(problems[0].data["puzzle"]) == size
    report = check_env(e, problems=problems)
    assert report.ok, report.format()


def test_generated_4x4_puzzles_have_exactly_one_solution():
    for seed in range(60):
        puzzle, solution = generate_puzzle(seed, 4)
        assert count_solutions(puzzle, limit=3) == 1, seed
        assert is_solved_grid(tuple(map(tuple, solution)), tuple(map(tuple, puzzle)))
        assert sum(v == 0 for row in puzzle for v in row) == 10  # the default hole count is reachable on 4x4


def test_generated_9x9_puzzles_have_exactly_one_solution():
    for seed in range(3):
        puzzle, solution = generate_puzzle(seed, 9)
        assert count_solutions(puzzle, limit=3) == 1
        assert 30 <= sum(v == 0 for row in puzzle for v in row) <= 50


def test_solution_counter_sees_several_solutions():
    assert count_solutions([[0] * 4 for _ in range(4)], limit=5) == 5
    assert count_solutions([[1, 1, 0, 0], [0] * 4, [0] * 4, [0] * 4]) == 0


def test_a_valid_grid_that_breaks_a_clue_is_not_solved():
    e = env()
    problem = e.materialize(e.procedural_problems("train", 1)[0])
    clues, solution = problem.data["puzzle"], problem.data["solution"]
    clue_digits = {v for row in clues for v in row if v}
    a = next(iter(clue_digits))
    b = next(v for v in range(1, 5) if v != a)
    cheat = relabelled(solution, a, b)  # full, valid rows/columns/boxes, but contradicts a clue
    assert not breaks_rules(tuple(map(tuple, cheat)))
    assert not is_solved_grid(tuple(map(tuple, cheat)), tuple(map(tuple, clues)))
    s0 = e.reset(problem, 0)
    t = e.step(s0, PLAN, grid_text(cheat))
    assert not t.terminated and not e.success(t.state)


def test_the_true_solution_as_a_grid_solves_with_the_first_step_bonus():
    e = env()
    problem = e.materialize(e.procedural_problems("test", 1)[0])
    s0 = e.reset(problem, 0)
    t = e.step(s0, PLAN, grid_text(problem.data["solution"]))
    assert t.terminated and e.success(t.state)
    assert t.state.plan_reward == pytest.approx(1.0 + 2.0 + 0.5)  # full progress, solved, first step


def test_fill_list_answers_progress_and_solve():
    e = env()
    problem = e.materialize(e.procedural_problems("train", 1)[0])
    clues, solution = problem.data["puzzle"], problem.data["solution"]
    empty = [(r, c) for r in range(4) for c in range(4) if not clues[r][c]]
    s0 = e.reset(problem, 0)
    first = e.step(s0, PLAN, str([[r, c, solution[r][c]] for r, c in empty[:5]]))
    assert not first.terminated and first.state.plan_reward == pytest.approx(5 / len(empty))
    rest = " ".join(f"({r}, {c}, {solution[r][c]})" for r, c in empty[5:])
    second = e.step(first.state, PLAN, rest)
    assert second.terminated and e.success(second.state)
    assert second.state.plan_reward == pytest.approx((len(empty) - 5) / len(empty) + 2.0)  # no first-step bonus


def test_invalid_fills_are_penalised_and_never_change_clues():
    e = env()
    s0 = e.reset(Problem("p", {"puzzle": PUZZLE, "solution": _solve(PUZZLE)}), 0)
    t = e.step(s0, PLAN, "[[0, 0, 2], [9, 9, 1], [1, 1, 7]]")  # a clue overwrite, off-grid, bad value
    assert t.state.board.grid == s0.board.grid
    assert t.state.plan_reward == pytest.approx(3 * -0.1)


def test_a_rule_breaking_fill_costs_half_a_point():
    e = env()
    s0 = e.reset(Problem("p", {"puzzle": PUZZLE, "solution": _solve(PUZZLE)}), 0)
    t = e.step(s0, PLAN, "[[0, 1, 1]]")  # a second 1 in row 0
    assert t.state.plan_reward == pytest.approx(-0.5)


def test_tool_simulation_leaves_the_real_grid_alone():
    e = env()
    problem = e.materialize(e.procedural_problems("train", 1)[0])
    s0 = e.reset(problem, 0)
    t = e.step(s0, TOOL, f"print('**Actions List**: {grid_text(problem.data['solution'])}')")
    assert t.state.tool.sim_solved and t.state.board == s0.board and not e.success(t.state)


def test_seed_spaces_are_disjoint_and_data_is_plain():
    e = env()
    train, test = e.procedural_problems("train", 200), e.procedural_problems("test", 50)
    assert not {p.data["seed"] for p in train} & {p.data["seed"] for p in test}
    json.dumps(dict(e.materialize(test[0]).data))


def test_rows_without_a_valid_solution_are_a_data_error():
    with pytest.raises(DataError):
        env().reset(Problem("p", {"puzzle": PUZZLE}), 0)
    wrong = relabelled(_solve(PUZZLE), 1, 2)
    with pytest.raises(DataError):
        env().reset(Problem("p", {"puzzle": PUZZLE, "solution": wrong}), 0)


def _solve(puzzle):
    """The solution of a 4x4 puzzle by backtracking (a test fixture: PUZZLE has one solution)."""
    from pettingllms.envs.sudoku.env import _most_constrained

    grid = [row[:] for row in puzzle]

    def search():
        cell = _most_constrained(grid, 4)
        if cell is None:
            return True
        r, c, options = cell
        for v in options:
            grid[r][c] = v
            if search():
                return True
        grid[r][c] = 0
        return False

    assert search()
    return grid
