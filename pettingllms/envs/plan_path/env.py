"""``plan_path``: walk from S to G on a grid with walls. Tool agent + plan agent (``pettingllms/envs/games_common``).

- Board symbols: ``#`` wall, ``.`` free, ``@`` you, ``G`` goal (dataset rows use ``S`` for the start). Rows top to
  bottom; moves U, D, L, R. Moving into a wall or off the grid is invalid: you stay.
- Generation (``size`` default 10, ``wall_prob`` default 0.22): each cell is a wall with that probability; start
  and goal are distinct free cells, redrawn until BFS finds a path. The optimal length is the BFS distance.
- Rewards per move (the reference's shaping): -0.01 for a valid move, -0.1 for an invalid one, potential
  shaping 0.1 * (phi' - phi) with phi = -(Manhattan distance to the goal) (gamma = 1, so shaping sums to the
  distance gained and cannot be farmed by walking in circles), +1 on reaching the goal, +0.5 more when the goal is
  reached in exactly the optimal number of moves (every move counts, invalid ones too), -1 when the move budget
  (``max_moves`` = 200) runs out (``truncated``). Actions after reaching the goal are ignored.
- Seeds: train 0..1e9-1, test 1e9.. (``procedural_problems``); dataset rows carry ``rows`` and ``optimal_length``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from pettingllms.envs.games_common.base import GameEnv, Game, Outcome
from pettingllms.envs.games_common.parsing import parse_moves
from pettingllms.envs.games_common.words import offset_in_words
from pettingllms.core import DataError

DIRECTIONS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
VALID_COST, INVALID_COST, SHAPING = -0.01, -0.1, 0.1
GOAL_BONUS, OPTIMAL_BONUS, OUT_OF_MOVES = 1.0, 0.5, -1.0

Cell = tuple[int, int]


@dataclass(frozen=True)
class PathBoard:
    walls: frozenset[Cell]
    height: int
    width: int
    position: Cell
    goal: Cell
    optimal: int  # BFS distance from the start
    moves: int = 0
    max_moves: int = 200


def shortest_path(walls: frozenset[Cell], height: int, width: int, start: Cell, goal: Cell) -> list[str] | None:
    """The moves of a shortest path by BFS, or None when the goal is unreachable."""
    came_from: dict[Cell, tuple[Cell, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            moves = []
            while came_from[cell] is not None:
                cell, name = came_from[cell]
                moves.append(name)
            return moves[::-1]
        for name, (dr, dc) in DIRECTIONS.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < height and 0 <= nxt[1] < width and nxt not in walls and nxt not in came_from:
                came_from[nxt] = (cell, name)
                queue.append(nxt)
    return None


def shortest_path_length(walls: frozenset[Cell], height: int, width: int, start: Cell, goal: Cell) -> int | None:
    """BFS distance, or None when the goal is unreachable."""
    path = shortest_path(walls, height, width, start, goal)
    return None if path is None else len(path)


def generate_grid(seed: int, size: int = 10, wall_prob: float = 0.22) -> tuple[list[str], int]:
    rng = random.Random(f"plan_path/{size}/{wall_prob}/{seed}")
    for _ in range(1000):
        walls = frozenset((r, c) for r in range(size) for c in range(size) if rng.random() < wall_prob)
        free = [(r, c) for r in range(size) for c in range(size) if (r, c) not in walls]
        if len(free) < 2:
            continue
        start, goal = rng.sample(free, 2)
        optimal = shortest_path_length(walls, size, size, start, goal)
        if optimal is not None:
            rows = ["".join("#" if (r, c) in walls else "S" if (r, c) == start else "G" if (r, c) == goal else "."
                            for c in range(size)) for r in range(size)]
            return rows, optimal
    raise RuntimeError(f"no reachable plan_path grid for seed {seed}")


def board_from_rows(rows: Sequence[str], max_moves: int = 200) -> PathBoard:
    if not isinstance(rows, (list, tuple)) or not rows or not all(isinstance(r, str) and r for r in rows):
        raise DataError(f"plan_path rows must be a non-empty list of strings, got {rows!r:.200}")
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise DataError(f"plan_path rows must all have the same length: {list(rows)}")
    walls, starts, goals = set(), [], []
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch == "#":
                walls.add((r, c))
            elif ch in "S@":
                starts.append((r, c))
            elif ch == "G":
                goals.append((r, c))
            elif ch != ".":
                raise DataError(f"plan_path row {r} has an unknown symbol {ch!r}: {row!r}")
    if len(starts) != 1 or len(goals) != 1:
        raise DataError(f"plan_path grid needs exactly one S and one G: {list(rows)}")
    optimal = shortest_path_length(frozenset(walls), len(rows), width, starts[0], goals[0])
    if optimal is None:
        raise DataError(f"plan_path grid has no path from S to G: {list(rows)}")
    return PathBoard(frozenset(walls), len(rows), width, starts[0], goals[0], optimal, max_moves=max_moves)


def _potential(board: PathBoard, cell: Cell) -> float:
    return -float(abs(cell[0] - board.goal[0]) + abs(cell[1] - board.goal[1]))


def move(board: PathBoard, direction: str) -> tuple[PathBoard, float, bool]:
    """One move: (new board, reward without the goal bonuses, valid?)."""
    d = DIRECTIONS.get(direction)
    counted = replace(board, moves=board.moves + 1)
    if d is None:
        return counted, INVALID_COST, False
    nxt = (board.position[0] + d[0], board.position[1] + d[1])
    if not (0 <= nxt[0] < board.height and 0 <= nxt[1] < board.width) or nxt in board.walls:
        return counted, INVALID_COST, False
    shaping = SHAPING * (_potential(board, nxt) - _potential(board, board.position))
    return replace(counted, position=nxt), VALID_COST + shaping, True


@dataclass(frozen=True)
class PlanPathGame(Game):
    size: int = 10
    wall_prob: float = 0.22
    max_moves: int = 200
    name = "plan_path"
    action_format = "a list of moves, each U (up), D (down), L (left) or R (right), e.g. [U, R, R, D]"

    def generate(self, seed: int) -> dict[str, Any]:
        rows, optimal = generate_grid(seed, self.size, self.wall_prob)
        return {"seed": seed, "size": self.size, "rows": rows, "optimal_length": optimal}

    def has_content(self, data: Mapping[str, Any]) -> bool:
        return data.get("rows") is not None

    def board_from_data(self, data: Mapping[str, Any]) -> PathBoard:
        return board_from_rows(list(data.get("rows") or []), self.max_moves)

    def content_key(self, data: Mapping[str, Any]) -> str:
        return "\n".join(data["rows"])

    def render(self, board: PathBoard) -> str:
        def symbol(cell: Cell) -> str:
            if cell == board.position:
                return "@"
            return "G" if cell == board.goal else "#" if cell in board.walls else "."

        return "\n".join("".join(symbol((r, c)) for c in range(board.width)) for r in range(board.height))

    def positions(self, board: PathBoard) -> str:
        offset = offset_in_words(board.position, board.goal)
        return (f"You are at row {board.position[0]}, column {board.position[1]}. "
                f"The goal is at row {board.goal[0]}, column {board.goal[1]}: {offset}.")

    def example_shows_enough(self, answer: str) -> bool:
        return len(set(answer.split())) >= 2  # moves on both axes: not one letter a small model copies everywhere

    def solution(self, board: PathBoard, max_states: int) -> str | None:
        del max_states  # a grid's BFS visits each cell once
        path = shortest_path(board.walls, board.height, board.width, board.position, board.goal)
        return None if path is None else " ".join(path)

    def rules(self, board: PathBoard) -> str:
        return (
            f"Path planning on a {board.height}x{board.width} grid. Move from @ to G. Symbols: # wall, . free, "
            "@ you, G goal. Rows are listed top to bottom; row 0 is the top. You cannot enter walls or leave the "
            "grid. Reach the goal in as few moves as possible.\n"
            f"Answer format: {self.action_format}."
        )

    def parse_actions(self, text: str | None, board: Any) -> tuple[str, ...] | None:
        del board
        return parse_moves(text)

    def apply(self, board: PathBoard, actions: Sequence, first_step: bool) -> Outcome:
        del first_step
        total, valid, invalid = 0.0, 0, 0
        was_solved = board.position == board.goal
        for action in actions:
            if board.position == board.goal or board.moves >= board.max_moves:
                break
            board, reward, ok = move(board, action)
            total, valid, invalid = total + reward, valid + ok, invalid + (not ok)
        solved = board.position == board.goal
        if solved and not was_solved:
            total += GOAL_BONUS + (OPTIMAL_BONUS if board.moves == board.optimal else 0.0)
        out = not solved and board.moves >= board.max_moves
        if out:
            total += OUT_OF_MOVES
        return Outcome(board, round(total, 6), solved, out, valid, invalid)

    def is_solved(self, board: PathBoard) -> bool:
        return board.position == board.goal


class PlanPathEnv(GameEnv):
    domain = "plan_path"

    def __init__(self, max_turns: int = 4, size: int = 10, wall_prob: float = 0.22, max_moves: int = 200,
                 **options: Any):
        super().__init__(max_turns=max_turns, **options)
        if size < 2 or not 0.0 <= wall_prob < 0.9:
            raise ValueError(f"plan_path needs size >= 2 and 0 <= wall_prob < 0.9, got {size}, {wall_prob}")
        self.game = PlanPathGame(int(size), float(wall_prob), int(max_moves))
