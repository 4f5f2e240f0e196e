"""The plan agent's compact prompt (a worked example and the board's positions in words, for SmolLM2-135M) and the
small settings of the CPU presets: the games keep their real rules at those sizes."""

from __future__ import annotations

import pytest

from pettingllms.assembly.construct import check_options
from pettingllms.core import ConfigError, Problem
from pettingllms.envs.games_common.agents import PlanAgent
from pettingllms.envs.games_common.base import EXAMPLE_SEED, PLAN, worked_example
from pettingllms.envs.games_common.runner import EchoRunner
from pettingllms.envs.games_common.words import offset_in_words
from pettingllms.envs.plan_path.env import PlanPathEnv, shortest_path_length
from pettingllms.envs.sokoban.env import SokobanEnv, is_solved, solve_bfs
from pettingllms.envs.sudoku.env import SudokuEnv, count_solutions

SETTINGS = [  # the presets' settings (and round 1's 3x3 grid) and the envs' defaults
    (PlanPathEnv, {"size": 4, "wall_prob": 0.0, "max_moves": 6}),
    (PlanPathEnv, {"size": 3, "wall_prob": 0.0}),
    (PlanPathEnv, {}),
    (SudokuEnv, {"holes": 1}),
    (SudokuEnv, {}),
    (SokobanEnv, {"size": 6, "max_moves": 2}),
    (SokobanEnv, {"size": 5}),
    (SokobanEnv, {}),
]


def make(cls, **options):
    return cls(runner=EchoRunner(), **options)


@pytest.mark.parametrize("cls,options", SETTINGS)
def test_the_worked_example_is_a_real_puzzle_its_answer_solves(cls, options):
    env = make(cls, **options)
    example = worked_example(env.game)
    assert example is not None
    state = env.reset(Problem("example", {"seed": example.seed}), 0)
    assert (state.board_text, state.positions) == (example.board_text, example.positions)
    assert not env.success(state)
    played = env.step(state, PLAN, example.answer)  # the answer as the plan agent would give it
    assert played.terminated and env.success(played.state)


@pytest.mark.parametrize("cls,options", SETTINGS)
def test_the_example_seed_is_in_neither_split(cls, options):
    env = make(cls, **options)
    seed = worked_example(env.game).seed
    seeds = {p.data["seed"] for split in ("train", "test") for p in env.procedural_problems(split, 200)}
    assert seed not in seeds and seed <= EXAMPLE_SEED < 0


def test_a_plan_path_example_moves_on_both_axes_so_copying_it_is_not_a_policy():
    # seeds -1, -2 and -3 of the 3x3 preset are one-move puzzles (L, L, R): the base model copied "#### L" onto
    # every held-out grid; the example is now the first puzzle whose path turns
    example = worked_example(make(PlanPathEnv, size=3, wall_prob=0.0).game)
    assert example.seed == -4 and example.answer == "D D R R"
    assert example.positions.endswith("The goal is at row 2, column 2: 2 rows down (D) and 2 columns right (R).")


def test_an_example_that_shows_too_little_is_kept_when_no_later_seed_can_be_built():
    from pettingllms.envs.plan_path.env import PlanPathGame

    class OnlySeedMinusOne(PlanPathGame):  # seed -1 is a one-move puzzle (L); every later seed fails to generate
        def generate(self, seed):
            if seed < EXAMPLE_SEED:
                raise RuntimeError("cannot build")
            return super().generate(seed)

    example = worked_example(OnlySeedMinusOne(3, 0.0))
    assert (example.seed, example.answer) == (EXAMPLE_SEED, "L")


def test_the_offset_in_words_is_the_goal_minus_the_player_even_behind_walls():
    env = make(PlanPathEnv)
    state = env.reset(Problem("p", {"rows": ["G#.", ".#.", "..S"]}), 0)
    assert state.positions == ("You are at row 2, column 2. The goal is at row 0, column 0: 2 rows up (U) and 2 "
                               "columns left (L).")
    one_axis = env.reset(Problem("q", {"rows": ["S.G"]}), 0)
    assert one_axis.positions.endswith(": 2 columns right (R).")
    near = env.reset(Problem("r", {"rows": ["S", "G"]}), 0)
    assert near.positions.endswith(": 1 row down (D).")


def test_the_compact_prompt_shows_the_example_then_the_board_with_its_positions():
    env = make(PlanPathEnv, size=3, wall_prob=0.0)
    state = env.reset(env.procedural_problems("test", 1)[0], 0)
    messages = PlanAgent(PLAN, prompt="compact").observe(state, 0)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]  # no system message
    assert messages[1]["content"] == f"#### {state.example.answer}"
    ask = messages[2]["content"]
    assert state.board_text in ask and state.positions in ask and ask.endswith("Give the action list after ####.")
    r, c = state.board.position
    assert f"You are at row {r}, column {c}." in state.positions
    assert state.board_text.splitlines()[r][c] == "@"


def test_after_a_move_the_positions_and_the_earlier_turn_follow_the_real_board():
    env = make(PlanPathEnv, size=3, wall_prob=0.0)
    state = env.reset(Problem("p", {"rows": ["S..", "...", "..G"]}), 0)
    moved = env.step(state, PLAN, "R").state
    assert moved.positions == ("You are at row 0, column 1. The goal is at row 2, column 2: 2 rows down (D) and 1 "
                               "column right (R).")
    ask = PlanAgent(PLAN, prompt="compact").observe(moved, 1)[-1]["content"]
    assert "turn 1: applied [R]" in ask and "@." in ask


def test_the_full_prompt_is_unchanged_by_default():
    env = make(SudokuEnv, holes=1)
    state = env.reset(env.procedural_problems("test", 1)[0], 0)
    messages = PlanAgent(PLAN).observe(state, 0)
    assert [m["role"] for m in messages] == ["system", "user"] and state.positions not in messages[1]["content"]


def test_sudoku_and_sokoban_positions_name_the_real_cells():
    sudoku = make(SudokuEnv, holes=2)
    board = sudoku.reset(sudoku.procedural_problems("test", 1)[0], 0).board
    empty = [(r, c) for r in range(4) for c in range(4) if board.grid[r][c] == 0]
    assert sudoku.game.positions(board).startswith("Empty cells (row, column): " + ", ".join(map(str, empty)) + ". ")
    sokoban = make(SokobanEnv)
    board = sokoban.reset(Problem("corridor", {"rows": ["#######", "#@_$_.#", "#######"]}), 0).board
    assert sokoban.game.positions(board) == ("You are at row 1, column 1. Box at row 1, column 3: 2 columns right (R) "
                                             "of you. Goal at row 1, column 5: 2 columns right (R) of the box at row 1, "
                                             "column 3.")


def test_an_unknown_prompt_is_refused_and_the_option_is_known_to_the_config_check():
    with pytest.raises(ValueError, match="prompt must be one of full, compact"):
        PlanAgent(PLAN, prompt="short")
    check_options(PlanAgent, {"prompt": "compact"}, "agents.plan_agent.options", positional=1)
    with pytest.raises(ConfigError, match="prompt"):
        check_options(PlanAgent, {"promt": "compact"}, "agents.plan_agent.options", positional=1)


def test_small_settings_keep_the_real_rules():
    path = make(PlanPathEnv, size=4, wall_prob=0.0, max_moves=6)
    sudoku = make(SudokuEnv, holes=1)
    sokoban = make(SokobanEnv, size=5)
    for problem in path.procedural_problems("test", 64):
        board = path.reset(problem, 0).board
        assert (board.height, board.width, board.walls) == (4, 4, frozenset()) and board.position != board.goal
        assert board.max_moves == 6 >= board.optimal  # the budget never cuts a shortest path
        assert board.optimal == shortest_path_length(board.walls, 4, 4, board.position, board.goal) >= 1
    for problem in sudoku.procedural_problems("test", 64):
        state = sudoku.reset(problem, 0)
        board = state.board
        assert sum(v == 0 for row in board.clues for v in row) == 1 and count_solutions(board.clues, 3) == 1
        (r, c), = [(r, c) for r in range(4) for c in range(4) if board.clues[r][c] == 0]
        wrong = next(v for v in range(1, 5) if v != board.solution[r][c])
        assert not sudoku.success(sudoku.step(state, PLAN, f"[[{r}, {c}, {wrong}]]").state)  # a full grid is not enough
        clue = next((i, j) for i in range(4) for j in range(4) if board.clues[i][j])
        changed = sudoku.step(state, PLAN, f"[[{clue[0]}, {clue[1]}, {board.clues[clue[0]][clue[1]] % 4 + 1}]]").state
        assert changed.board.grid == board.grid  # a clue never changes
    for problem in sokoban.procedural_problems("test", 64):
        board = sokoban.reset(problem, 0).board
        assert not is_solved(board) and solve_bfs(board) is not None


def _one_hole_sudoku(**options):
    env = make(SudokuEnv, holes=1, **options)
    state = env.reset(env.procedural_problems("test", 1)[0], 0)
    board = state.board
    (r, c), = [(r, c) for r in range(4) for c in range(4) if board.clues[r][c] == 0]
    right = board.solution[r][c]
    wrong = next(v for v in range(1, 5) if v != right)
    clue = next((i, j) for i in range(4) for j in range(4) if board.clues[i][j])
    dodge = f"[[{clue[0]}, {clue[1]}, {board.clues[clue[0]][clue[1]] % 4 + 1}]]"  # tries to change a clue: refused
    return env, state, f"[[{r}, {c}, {right}]]", f"[[{r}, {c}, {wrong}]]", dodge


def test_shaped_sudoku_rewards_pay_a_refused_clue_change_more_than_a_wrong_guess():
    # why rewards="success" exists: the cpu_sudoku run of 2026-11-26 collapsed onto fills that change clues
    env, state, right, wrong, dodge = _one_hole_sudoku()
    score = {name: env.step(state, PLAN, answer).state.plan_reward
             for name, answer in (("right", right), ("wrong", wrong), ("dodge", dodge))}
    assert score["right"] == 3.5 and score["wrong"] == -0.5 and score["dodge"] == -0.1


def test_success_rewards_are_one_for_the_solving_step_and_zero_for_every_other_answer():
    env, state, right, wrong, dodge = _one_hole_sudoku(rewards="success")
    for answer, expected in ((right, 1.0), (wrong, 0.0), (dodge, 0.0)):
        step = env.step(state, PLAN, answer)
        assert (step.state.plan_reward, env.team_reward(step.state)) == (expected, expected)
        assert f"reward {expected:+.2f}" in step.state.history[-1]  # the prompt's history shows the reward given
    assert env.step(state, PLAN, "no fills here").state.plan_reward == -2.0  # no_action_penalty still applies
    path = make(PlanPathEnv, rewards="success")
    start = path.reset(Problem("p", {"rows": ["S.G"]}), 0)
    halfway = path.step(start, PLAN, "R")
    assert halfway.state.plan_reward == 0.0 and not halfway.terminated
    done = path.step(halfway.state, PLAN, "R")
    assert done.terminated and done.state.plan_reward == 1.0 and path.team_reward(done.state) == 1.0


def test_success_rewards_score_the_tool_by_whether_its_simulated_actions_solve():
    from pettingllms.envs.games_common.base import TOOL

    env = make(PlanPathEnv, rewards="success")  # EchoRunner: the "program" prints its own source
    start = env.reset(Problem("p", {"rows": ["S.G"]}), 0)
    assert env.step(start, TOOL, "**Actions List**: [R, R]").state.tool.sim_reward == 1.0
    assert env.step(start, TOOL, "**Actions List**: [R]").state.tool.sim_reward == 0.0  # progress is not solving
    assert env.step(start, TOOL, "print('no marker')").state.tool.sim_reward == -2.0  # no_action_penalty still
    assert env.step(start, TOOL, "**Actions List**: [R, R]").state.board == start.board  # the real board stays


def test_an_unknown_rewards_mode_is_refused():
    with pytest.raises(ValueError, match="rewards must be one of shaped, success"):
        make(SudokuEnv, rewards="sparse")


def test_sudoku_positions_tell_the_fills_from_the_clues_after_a_wrong_fill():
    env, state, right, wrong, dodge = _one_hole_sudoku()
    (r, c, v), = [tuple(int(x) for x in wrong.strip("[]").split(", "))]
    after = env.step(state, PLAN, wrong).state
    assert after.positions.startswith(f"Empty cells (row, column): none. Your fills (row, column, value): "
                                      f"({r}, {c}, {v}). Cell ({r}, {c}): ")
    assert state.positions.startswith(f"Empty cells (row, column): ({r}, {c}). Cell")  # before any fill: the holes
    assert env.step(after, PLAN, right).terminated  # a fill can be written over; a clue cannot


SOLVED_4X4 = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]


def test_sudoku_positions_name_each_open_cells_row_column_and_box_digits_by_hand():
    # holes at (0, 2) and (0, 3); digits counted by hand from SOLVED_4X4
    puzzle = [[1, 2, 0, 0], *SOLVED_4X4[1:]]
    env = make(SudokuEnv, holes=2)
    state = env.reset(Problem("two holes", {"puzzle": puzzle, "solution": SOLVED_4X4}), 0)
    assert state.positions == (
        "Empty cells (row, column): (0, 2), (0, 3)."
        " Cell (0, 2): its row has 1 2, its column has 1 2 4, its box has 1 2."
        " Cell (0, 3): its row has 1 2, its column has 1 2 3, its box has 1 2.")
    # a fill counts in the other cells' units like a clue, and the filled cell stays listed (it can be written over)
    after = env.step(state, PLAN, "[[0, 3, 3]]").state
    assert after.positions == (
        "Empty cells (row, column): (0, 2). Your fills (row, column, value): (0, 3, 3)."
        " Cell (0, 2): its row has 1 2 3, its column has 1 2 4, its box has 1 2 3."
        " Cell (0, 3): its row has 1 2, its column has 1 2 3, its box has 1 2.")


def test_offset_words_name_both_axes_with_their_move_letters_and_here():
    assert offset_in_words((2, 3), (0, 4)) == "2 rows up (U) and 1 column right (R)"
    assert offset_in_words((0, 4), (1, 2)) == "1 row down (D) and 2 columns left (L)"
    assert offset_in_words((1, 1), (1, 1)) == "here"


def test_sokoban_positions_name_each_free_goal_from_its_nearest_loose_box():
    rows = ["#######",
            "#@$_._#",
            "#___*_#",
            "#_$___#",
            "#.____#",
            "#######"]
    board = make(SokobanEnv).reset(Problem("two loose boxes", {"rows": rows}), 0).board
    assert SokobanEnv(runner=EchoRunner()).game.positions(board) == (
        "You are at row 1, column 1."
        " Box at row 1, column 2: 1 column right (R) of you. Box at row 3, column 2: 2 rows down (D) and 1 column right"
        " (R) of you. Box on a goal at row 2, column 4."
        " Goal at row 1, column 4: 2 columns right (R) of the box at row 1, column 2."
        " Goal at row 4, column 1: 1 row down (D) and 1 column left (L) of the box at row 3, column 2.")
