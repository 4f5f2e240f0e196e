"""``sudoku``: fill the grid. Tool agent + plan agent (``pettingllms/envs/games_common``). 4x4 (default) or 9x9.

- Puzzles have a unique solution: a random full grid (randomised backtracking), then clues are removed in a
  seeded random order, each removal kept only while a solution counter (stopping at 2) still finds exactly one
  solution, until ``holes`` cells are empty (default 10 of 16 for 4x4, 50 of 81 for 9x9) or no clue can go.
- Answers: fills ``[[r, c, v], ...]`` (0-based row and column, value 1..n) or the full grid (n rows of n
  numbers; zeros are skipped). A fill outside the grid, with a value outside 1..n, or changing a given clue is
  invalid and is not applied. Filled cells may be overwritten by later fills.
- Solved: the grid is full, every row, column and box holds 1..n once, **and every given clue is kept**. (The
  public reference only checked the first two, so one fixed valid grid "solved" every puzzle.)
- Rewards per plan/tool step: 1.0 * (phi' - phi) with phi = the fraction of the puzzle's empty cells that hold
  their solution value, -0.1 per invalid fill, -0.5 when the resulting grid breaks a row, column or box rule,
  +2 on solving, +0.5 more when solved in the first plan step (the reference's "efficiency" bonus).
- Positions in words (the plan agent's compact prompt): the empty cells, the agent's own fills, and for each cell
  that is not a clue the digits of its row, column and box.
- Seeds: train 0..1e9-1, test 1e9.. (``procedural_problems``); dataset rows carry ``puzzle`` and ``solution``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from pettingllms.envs.games_common.base import GameEnv, Game, Outcome
from pettingllms.envs.games_common.parsing import parse_sudoku_answer
from pettingllms.core import DataError

PROGRESS_WEIGHT, INVALID_FILL, RULE_BROKEN = 1.0, -0.1, -0.5
SOLVED_BONUS, FIRST_STEP_BONUS = 2.0, 0.5
DEFAULT_HOLES = {4: 10, 9: 50}

Grid = tuple[tuple[int, ...], ...]


def box_shape(n: int) -> tuple[int, int]:
    root = math.isqrt(n)
    if root * root != n:
        raise ValueError(f"sudoku size must be a square (4 or 9), got {n}")
    return root, root


def _units(n: int) -> list[list[tuple[int, int]]]:
    br, bc = box_shape(n)
    rows = [[(r, c) for c in range(n)] for r in range(n)]
    cols = [[(r, c) for r in range(n)] for c in range(n)]
    boxes = [[(r0 + r, c0 + c) for r in range(br) for c in range(bc)]
             for r0 in range(0, n, br) for c0 in range(0, n, bc)]
    return rows + cols + boxes


def breaks_rules(grid: Grid) -> bool:
    """Whether a filled value repeats in a row, column or box (empty cells are ignored)."""
    for unit in _units(len(grid)):
        values = [grid[r][c] for r, c in unit if grid[r][c]]
        if len(values) != len(set(values)):
            return True
    return False


def is_solved_grid(grid: Grid, clues: Grid) -> bool:
    """Full, valid, and consistent with every clue (a clue-violating valid grid is NOT solved)."""
    n = len(clues)
    if len(grid) != n or any(len(row) != n for row in grid):
        return False
    if any(not 1 <= v <= n for row in grid for v in row):
        return False
    if any(clues[r][c] and grid[r][c] != clues[r][c] for r in range(n) for c in range(n)):
        return False
    return not breaks_rules(grid)


def seen_digits(grid: Grid, r: int, c: int) -> tuple[list[int], list[int], list[int]]:
    """The digits in the other cells of (r, c)'s row, column and box, each sorted (clues and fills alike)."""
    n = len(grid)
    br, bc = box_shape(n)
    r0, c0 = r - r % br, c - c % bc
    units = ([(r, j) for j in range(n)], [(i, c) for i in range(n)],
             [(i, j) for i in range(r0, r0 + br) for j in range(c0, c0 + bc)])
    return tuple(sorted(grid[i][j] for i, j in unit if (i, j) != (r, c) and grid[i][j]) for unit in units)


def _candidates(grid: list[list[int]], r: int, c: int, n: int) -> list[int]:
    br, bc = box_shape(n)
    used = set(grid[r]) | {grid[i][c] for i in range(n)}
    r0, c0 = r - r % br, c - c % bc
    used |= {grid[i][j] for i in range(r0, r0 + br) for j in range(c0, c0 + bc)}
    return [v for v in range(1, n + 1) if v not in used]


def _most_constrained(grid: list[list[int]], n: int) -> tuple[int, int, list[int]] | None:
    best = None
    for r in range(n):
        for c in range(n):
            if grid[r][c] == 0:
                options = _candidates(grid, r, c, n)
                if best is None or len(options) < len(best[2]):
                    best = (r, c, options)
                    if len(options) <= 1:
                        return best
    return best


def count_solutions(grid: Sequence[Sequence[int]], limit: int = 2) -> int:
    """Number of solutions of ``grid`` (0 = empty), counting no further than ``limit``."""
    n = len(grid)
    work = [list(row) for row in grid]

    def search(wanted: int) -> int:
        cell = _most_constrained(work, n)
        if cell is None:
            return 1
        r, c, options = cell
        found = 0
        for v in options:
            work[r][c] = v
            found += search(wanted - found)  # each branch only looks for what is still missing
            work[r][c] = 0
            if found >= wanted:
                break
        return found

    return search(limit)


def _fill_random(rng: random.Random, n: int) -> list[list[int]]:
    grid = [[0] * n for _ in range(n)]

    def search() -> bool:
        cell = _most_constrained(grid, n)
        if cell is None:
            return True
        r, c, options = cell
        rng.shuffle(options)
        for v in options:
            grid[r][c] = v
            if search():
                return True
        grid[r][c] = 0
        return False

    search()
    return grid


def generate_puzzle(seed: int, size: int = 4, holes: int | None = None) -> tuple[list[list[int]], list[list[int]]]:
    """(puzzle with 0 for empty cells, its unique solution)."""
    box_shape(size)
    rng = random.Random(f"sudoku/{size}/{holes}/{seed}")
    solution = _fill_random(rng, size)
    puzzle = [row[:] for row in solution]
    target = DEFAULT_HOLES.get(size, size * size // 2) if holes is None else holes
    cells = [(r, c) for r in range(size) for c in range(size)]
    rng.shuffle(cells)
    removed = 0
    for r, c in cells:
        if removed >= target:
            break
        puzzle[r][c] = 0
        if count_solutions(puzzle, limit=2) == 1:
            removed += 1
        else:
            puzzle[r][c] = solution[r][c]
    return puzzle, solution


@dataclass(frozen=True)
class SudokuBoard:
    clues: Grid
    grid: Grid
    solution: Grid

    @property
    def size(self) -> int:
        return len(self.clues)


def _as_grid(value: Any, n: int | None, label: str) -> Grid:
    try:
        grid = tuple(tuple(int(v) for v in row) for row in value)
    except (TypeError, ValueError) as exc:
        raise DataError(f"sudoku {label} must be a list of rows of integers: {value!r:.200}") from exc
    n = n or len(grid)
    if len(grid) != n or any(len(row) != n for row in grid) or any(not 0 <= v <= n for row in grid for v in row):
        raise DataError(f"sudoku {label} must be {n}x{n} with values 0..{n}: {value!r:.200}")
    return grid


def progress(board: SudokuBoard) -> float:
    empty = [(r, c) for r in range(board.size) for c in range(board.size) if not board.clues[r][c]]
    if not empty:
        return 1.0
    return sum(board.grid[r][c] == board.solution[r][c] for r, c in empty) / len(empty)


@dataclass(frozen=True)
class SudokuGame(Game):
    size: int = 4
    holes: int | None = None
    name = "sudoku"
    action_format = ("a list of fills [row, column, value] with 0-based row and column, e.g. [[0, 1, 3], [2, 0, 4]], "
                     "or the complete grid as rows, e.g. [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]")

    def generate(self, seed: int) -> dict[str, Any]:
        puzzle, solution = generate_puzzle(seed, self.size, self.holes)
        return {"seed": seed, "size": self.size, "puzzle": puzzle, "solution": solution}

    def has_content(self, data: Mapping[str, Any]) -> bool:
        return data.get("puzzle") is not None

    def board_from_data(self, data: Mapping[str, Any]) -> SudokuBoard:
        clues = _as_grid(data.get("puzzle"), None, "puzzle")
        box_shape(len(clues))
        if data.get("solution") is None:
            raise DataError("sudoku rows need a 'solution' (make them with scripts/dataprocess/load_sudoku.py)")
        solution = _as_grid(data["solution"], len(clues), "solution")
        if not is_solved_grid(solution, clues):
            raise DataError(f"sudoku solution does not solve its puzzle: {data!r:.300}")
        return SudokuBoard(clues, clues, solution)

    def content_key(self, data: Mapping[str, Any]) -> str:
        return repr([list(row) for row in data["puzzle"]])

    def render(self, board: SudokuBoard) -> str:
        return "\n".join(" ".join(str(v) if v else "." for v in row) for row in board.grid)

    def positions(self, board: SudokuBoard) -> str:
        cells = [(r, c) for r in range(board.size) for c in range(board.size)]
        empty = [(r, c) for r, c in cells if not board.grid[r][c]]
        text = "Empty cells (row, column): " + (", ".join(f"({r}, {c})" for r, c in empty) or "none") + "."
        # the board text cannot tell a fill from a clue: without this a wrong fill is invisible in the next turn
        filled = [(r, c, board.grid[r][c]) for r, c in cells if board.grid[r][c] and not board.clues[r][c]]
        if filled:
            text += " Your fills (row, column, value): " + ", ".join(f"({r}, {c}, {v})" for r, c, v in filled) + "."
        # a small model does not find a cell's row, column and box in the grid text (round 2 of games.md): name them
        for r, c in cells:
            if not board.clues[r][c]:
                row, column, box = (" ".join(map(str, digits)) or "none" for digits in seen_digits(board.grid, r, c))
                text += f" Cell ({r}, {c}): its row has {row}, its column has {column}, its box has {box}."
        return text

    def solution(self, board: SudokuBoard, max_states: int) -> str | None:
        del max_states  # the board carries its unique solution
        fills = [f"[{r}, {c}, {board.solution[r][c]}]" for r in range(board.size) for c in range(board.size)
                 if board.grid[r][c] != board.solution[r][c]]
        return "[" + ", ".join(fills) + "]"

    def rules(self, board: SudokuBoard) -> str:
        n = board.size
        br, bc = box_shape(n)
        return (
            f"Sudoku {n}x{n}. Fill every empty cell (.) with a digit 1..{n} so that each row, each column and each "
            f"{br}x{bc} box contains every digit exactly once. The given digits cannot change. Rows are listed top "
            "to bottom; row and column numbers start at 0.\n"
            f"Answer format: {self.action_format}."
        )

    def parse_actions(self, text: str | None, board: SudokuBoard) -> tuple[tuple[int, int, int], ...] | None:
        return parse_sudoku_answer(text, board.size)  # the board's size: a 9x9 dataset may meet a size=4 env

    def apply(self, board: SudokuBoard, actions: Sequence, first_step: bool) -> Outcome:
        n = board.size
        cells = [list(row) for row in board.grid]
        valid = invalid = 0
        for fill in actions:
            r, c, v = fill if isinstance(fill, tuple) and len(fill) == 3 else (-1, -1, -1)
            if not (0 <= r < n and 0 <= c < n and 1 <= v <= n) or (board.clues[r][c] and board.clues[r][c] != v):
                invalid += 1
                continue
            valid += 1
            cells[r][c] = v
        new = replace(board, grid=tuple(tuple(row) for row in cells))
        was_solved = is_solved_grid(board.grid, board.clues)
        solved = is_solved_grid(new.grid, new.clues)
        reward = PROGRESS_WEIGHT * (progress(new) - progress(board)) + INVALID_FILL * invalid
        reward += RULE_BROKEN if breaks_rules(new.grid) else 0.0
        if solved and not was_solved:
            reward += SOLVED_BONUS + (FIRST_STEP_BONUS if first_step else 0.0)
        return Outcome(new, round(reward, 6), solved, False, valid, invalid)

    def is_solved(self, board: SudokuBoard) -> bool:
        return is_solved_grid(board.grid, board.clues)


class SudokuEnv(GameEnv):
    domain = "sudoku"

    def __init__(self, max_turns: int = 4, size: int = 4, holes: int | None = None, **options: Any):
        super().__init__(max_turns=max_turns, **options)
        box_shape(int(size))
        if holes is not None and not 0 < int(holes) < int(size) ** 2:
            raise ValueError(f"sudoku holes must be in 1..{int(size) ** 2 - 1}, got {holes}")
        self.game = SudokuGame(int(size), None if holes is None else int(holes))
