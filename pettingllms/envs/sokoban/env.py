"""``sokoban``: push every box onto a goal. Tool agent + plan agent (see ``pettingllms/envs/games_common/base.py``).

- Board symbols: ``#`` wall, ``_`` floor, ``.`` goal, ``$`` box, ``*`` box on a goal, ``@`` player, ``+`` player
  on a goal. Rows top to bottom; moves U, D, L, R. Walking into a wall, or pushing a box into a wall or another
  box, is an invalid move: nothing moves.
- Generation (``size`` default 6, ``boxes`` default 1): a random-walk room inside an outer wall, boxes placed on
  goals (a solved state), then reverse play: the player walks and *pulls* boxes. The reverse of every pull is a
  push, so each generated level is solvable by construction; the most scrambled state seen is kept.
- Rewards per move (the reference's shaping): -0.01 per move, -0.05 more for an invalid move, +1 when a box
  lands on a goal and -0.5 when one leaves a goal, potential shaping 0.1 * (phi' - phi) with
  phi = -(sum over boxes of the Manhattan distance to the nearest goal), +10 when the level is solved, and -5
  when the move budget (``max_moves`` = 200) runs out (``truncated``).
- Positions in words (the plan agent's compact prompt): you, each box with its offset from you, and each free goal
  with its offset from the nearest box off a goal, each offset with its move letters.
- Seeds: train 0..1e9-1, test 1e9.. (``procedural_problems``); dataset rows carry the level as ``rows``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from pettingllms.envs.games_common.base import GameEnv, Game, Outcome
from pettingllms.envs.games_common.parsing import INVALID_MOVE, parse_moves
from pettingllms.envs.games_common.words import offset_in_words
from pettingllms.core import DataError

DIRECTIONS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
STEP_COST, INVALID_COST = -0.01, -0.05
BOX_ON_GOAL, BOX_OFF_GOAL = 1.0, -0.5
SHAPING, WIN_BONUS, OUT_OF_MOVES = 0.1, 10.0, -5.0
FLOOR_CHARS = "_ -"

Cell = tuple[int, int]


@dataclass(frozen=True)
class SokobanBoard:
    walls: frozenset[Cell]
    goals: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell
    height: int
    width: int
    moves: int = 0
    max_moves: int = 200


def _add(cell: Cell, d: Cell, k: int = 1) -> Cell:
    return (cell[0] + k * d[0], cell[1] + k * d[1])


def box_distance(boxes: Iterable[Cell], goals: frozenset[Cell]) -> int:
    return sum(min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for g in goals) for b in boxes)


def move(board: SokobanBoard, direction: str) -> tuple[SokobanBoard, float]:
    """One move with its shaped reward (no win bonus: ``apply`` adds it)."""
    d = DIRECTIONS.get(direction)
    target = _add(board.player, d) if d else None
    pushed = target is not None and target in board.boxes
    beyond = _add(board.player, d, 2) if d else None
    blocked = target is None or target in board.walls or (pushed and (beyond in board.walls or beyond in board.boxes))
    counted = replace(board, moves=board.moves + 1)
    if blocked:
        return counted, STEP_COST + INVALID_COST
    reward = STEP_COST
    boxes = board.boxes
    if pushed:
        boxes = (board.boxes - {target}) | {beyond}
        reward += BOX_ON_GOAL * (beyond in board.goals) + BOX_OFF_GOAL * (target in board.goals)
        reward += SHAPING * (box_distance(board.boxes, board.goals) - box_distance(boxes, board.goals))
    return replace(counted, boxes=boxes, player=target), reward


def is_solved(board: SokobanBoard) -> bool:
    return board.boxes <= board.goals


def solve_bfs(board: SokobanBoard, max_states: int = 200_000) -> tuple[str, ...] | None:
    """A shortest move list that solves ``board`` (None if unsolvable within ``max_states``). For tests."""
    start = (board.player, board.boxes)
    parents: dict[Any, Any] = {start: None}
    queue = deque([start])
    while queue and len(parents) < max_states:
        player, boxes = queue.popleft()
        if boxes <= board.goals:
            path = []
            node = (player, boxes)
            while parents[node] is not None:
                node, step = parents[node]
                path.append(step)
            return tuple(reversed(path))
        for name, d in DIRECTIONS.items():
            target = _add(player, d)
            if target in board.walls:
                continue
            new_boxes = boxes
            if target in boxes:
                beyond = _add(player, d, 2)
                if beyond in board.walls or beyond in boxes:
                    continue
                new_boxes = (boxes - {target}) | {beyond}
            key = (target, new_boxes)
            if key not in parents:
                parents[key] = ((player, boxes), name)
                queue.append(key)
    return None


# ---------------------------------------------------------------------------------------------- generation
def _carve_room(rng: random.Random, height: int, width: int) -> set[Cell]:
    """Floor cells from a random walk inside the outer wall (connected by construction)."""
    interior = [(r, c) for r in range(1, height - 1) for c in range(1, width - 1)]
    target = max(4, int(0.7 * len(interior)))
    cell = rng.choice(interior)
    floor = {cell}
    direction = rng.choice(list(DIRECTIONS.values()))
    for _ in range(50 * len(interior)):
        if len(floor) >= target:
            break
        if rng.random() < 0.35:
            direction = rng.choice(list(DIRECTIONS.values()))
        nxt = _add(cell, direction)
        if 1 <= nxt[0] < height - 1 and 1 <= nxt[1] < width - 1:
            cell = nxt
            floor.add(cell)
    return floor


def _reverse_play(
    rng: random.Random, floor: set[Cell], boxes_n: int, steps: int
) -> tuple[frozenset, frozenset, Cell] | None:
    """Start solved, walk and pull boxes; return the most scrambled (goals, boxes, player) seen."""
    cells = sorted(floor)
    if len(cells) < boxes_n + 2:
        return None
    goals = frozenset(rng.sample(cells, boxes_n))
    boxes = set(goals)
    player = rng.choice([c for c in cells if c not in boxes])
    best, best_score = None, 0
    for _ in range(steps):
        d = rng.choice(list(DIRECTIONS.values()))
        nxt = _add(player, d)
        if nxt not in floor or nxt in boxes:
            continue
        behind = _add(player, d, -1)
        if behind in boxes and rng.random() < 0.7:  # pull: the box follows the player
            boxes.remove(behind)
            boxes.add(player)
        player = nxt
        score = box_distance(boxes, goals) * 10 + sum(b not in goals for b in boxes)
        if score > best_score and not boxes <= goals:
            best, best_score = (goals, frozenset(boxes), player), score
    return best


def generate_level(seed: int, size: int = 6, boxes: int = 1) -> list[str]:
    """Rows of a solvable level made from ``seed``."""
    rng = random.Random(f"sokoban/{size}/{boxes}/{seed}")
    for _ in range(200):
        floor = _carve_room(rng, size, size)
        made = _reverse_play(rng, floor, boxes, steps=20 * size * size)
        if made is not None:
            goals, box_cells, player = made
            return render_rows(size, size, floor, goals, box_cells, player)
    raise RuntimeError(f"no sokoban level for seed {seed} (size {size}, {boxes} boxes)")


def render_rows(height: int, width: int, floor: Iterable[Cell], goals, boxes, player: Cell) -> list[str]:
    floor = set(floor)
    rows = []
    for r in range(height):
        row = []
        for c in range(width):
            cell = (r, c)
            if cell not in floor and cell != player and cell not in boxes:
                row.append("#")
            elif cell in boxes:
                row.append("*" if cell in goals else "$")
            elif cell == player:
                row.append("+" if cell in goals else "@")
            else:
                row.append("." if cell in goals else "_")
        rows.append("".join(row))
    return rows


def board_from_rows(rows: Sequence[str], max_moves: int = 200) -> SokobanBoard:
    if not isinstance(rows, (list, tuple)) or not rows or not all(isinstance(r, str) for r in rows):
        raise DataError(f"sokoban rows must be a non-empty list of strings, got {rows!r:.200}")
    walls, goals, boxes, players = set(), set(), set(), []
    width = max(len(r) for r in rows)
    for r, row in enumerate(rows):
        for c, ch in enumerate(row.ljust(width, "#")):
            if ch == "#":
                walls.add((r, c))
            elif ch in ".*+":
                goals.add((r, c))
            elif ch not in FLOOR_CHARS + "$@":
                raise DataError(f"sokoban row {r} has an unknown symbol {ch!r}: {row!r}")
            if ch in "$*":
                boxes.add((r, c))
            if ch in "@+":
                players.append((r, c))
    if len(players) != 1 or not boxes or len(boxes) != len(goals):
        raise DataError(f"sokoban level needs one player and as many boxes as goals (>0): {list(rows)}")
    # Cells outside the grid count as walls, so a ragged or open level cannot be walked off.
    border = {(r, c) for r in range(-1, len(rows) + 1) for c in (-1, width)} | {
        (r, c) for r in (-1, len(rows)) for c in range(-1, width + 1)}
    return SokobanBoard(frozenset(walls | border), frozenset(goals), frozenset(boxes), players[0], len(rows), width,
                        max_moves=max_moves)


@dataclass(frozen=True)
class SokobanGame(Game):
    size: int = 6
    boxes: int = 1
    max_moves: int = 200
    name = "sokoban"
    action_format = "a list of moves, each U (up), D (down), L (left) or R (right), e.g. [U, R, R, D]"

    def generate(self, seed: int) -> dict[str, Any]:
        return {"seed": seed, "size": self.size, "boxes": self.boxes,
                "rows": generate_level(seed, self.size, self.boxes)}

    def has_content(self, data: Mapping[str, Any]) -> bool:
        return data.get("rows") is not None

    def board_from_data(self, data: Mapping[str, Any]) -> SokobanBoard:
        return board_from_rows(list(data.get("rows") or []), self.max_moves)

    def content_key(self, data: Mapping[str, Any]) -> str:
        return "\n".join(data["rows"])

    def render(self, board: SokobanBoard) -> str:
        floor = {(r, c) for r in range(board.height) for c in range(board.width)} - board.walls
        return "\n".join(render_rows(board.height, board.width, floor, board.goals, board.boxes, board.player))

    def positions(self, board: SokobanBoard) -> str:
        """Each box where it lies from you, and each free goal where it lies from the nearest box off a goal."""
        loose = sorted(board.boxes - board.goals)
        parts = [f"You are at row {board.player[0]}, column {board.player[1]}."]
        parts += [f"Box at row {r}, column {c}: {offset_in_words(board.player, (r, c))} of you." for r, c in loose]
        parts += [f"Box on a goal at row {r}, column {c}." for r, c in sorted(board.boxes & board.goals)]
        for goal in sorted(board.goals - board.boxes):
            text = f"Goal at row {goal[0]}, column {goal[1]}"
            if loose:
                box = min(loose, key=lambda b: (abs(b[0] - goal[0]) + abs(b[1] - goal[1]), b))
                text += f": {offset_in_words(box, goal)} of the box at row {box[0]}, column {box[1]}"
            parts.append(text + ".")
        return " ".join(parts)

    def example_shows_enough(self, answer: str) -> bool:
        # a small model copies the example's answer onto every board (seed -1's is the one push `L`), so it should
        # be more than one move; and within the move budget, as every answer the model is asked for must be. With a
        # budget of 2 every such level is one push or two the same way (`D D`): none moves on both axes.
        return 2 <= len(answer.split()) <= self.max_moves

    def solution(self, board: SokobanBoard, max_states: int) -> str | None:
        moves = solve_bfs(board, max_states)
        return None if moves is None else " ".join(moves)

    def rules(self, board: SokobanBoard) -> str:
        return (
            "Sokoban. Push every box onto a goal. Symbols: # wall, _ floor, . goal, $ box, * box on a goal, "
            "@ you, + you on a goal. Rows are listed top to bottom. You move one cell per action and push a box "
            "by walking into it; you cannot pull boxes, push two boxes, or walk through walls. "
            f"At most {board.max_moves} moves in all.\n"
            f"Answer format: {self.action_format}."
        )

    def parse_actions(self, text: str | None, board: Any) -> tuple[str, ...] | None:
        del board
        return parse_moves(text)

    def apply(self, board: SokobanBoard, actions: Sequence, first_step: bool) -> Outcome:
        del first_step
        was_solved = is_solved(board)
        total, valid, invalid = 0.0, 0, 0
        for action in actions:
            if is_solved(board) or board.moves >= board.max_moves:
                break  # moves after the win (or the budget) are ignored
            before = board
            board, reward = move(board, action if action != INVALID_MOVE else "")
            total += reward
            moved = board.player != before.player
            valid, invalid = valid + moved, invalid + (not moved)
        solved = is_solved(board)
        if solved and not was_solved:
            total += WIN_BONUS
        out = not solved and board.moves >= board.max_moves
        if out:
            total += OUT_OF_MOVES
        return Outcome(board, round(total, 6), solved, out, valid, invalid)

    def is_solved(self, board: SokobanBoard) -> bool:
        return is_solved(board)


class SokobanEnv(GameEnv):
    domain = "sokoban"

    def __init__(self, max_turns: int = 4, size: int = 6, boxes: int = 1, max_moves: int = 200, **options: Any):
        super().__init__(max_turns=max_turns, **options)
        if size < 4 or boxes < 1:
            raise ValueError(f"sokoban needs size >= 4 and boxes >= 1, got size={size}, boxes={boxes}")
        self.game = SokobanGame(int(size), int(boxes), int(max_moves))
