"""Text parsers shared by the game agents. Every function here accepts any string and never raises.

Formats (they are also what the prompts ask for):
- Tool agent: the last closed fenced code block of the response (```python ...``` preferred, else any other
  fenced block), by the envs' one fence parser (``pettingllms.envs.common.parsing.last_python_block``).
- Tool program output: the text after the last ``**Actions List**:`` (or ``Actions List:``) in its stdout.
- Plan agent: the text after the last ``####`` of the response.
- Moves (Sokoban, Plan-Path): a list like ``[U, R, R, D]``, ``['Up', 'Left']`` or ``U R R D``; each item is a
  move name, and an item that is not one is kept as an *invalid* move (the env penalises it).
- Sudoku: fills ``[[r, c, v], ...]`` (0-based row and column, value 1..n) or the full grid as n rows of n numbers.
"""

from __future__ import annotations

import re

from pettingllms.envs.common.parsing import last_python_block

MAX_TEXT_CHARS = 20_000  # longer inputs are cut first, so every regex below runs on bounded text
MAX_CODE_CHARS = 20_000
MAX_ACTIONS = 200
INVALID_MOVE = "?"

MOVE_NAMES = {
    "u": "U", "up": "U", "north": "U", "^": "U",
    "d": "D", "down": "D", "south": "D", "v": "D",
    "l": "L", "left": "L", "west": "L", "<": "L",
    "r": "R", "right": "R", "east": "R", ">": "R",
}

_ACTIONS_MARKER = re.compile(r"(?:\*\*)?\s*actions?[ _]list\s*(?:\*\*)?\s*:\s*(?:\*\*)?", re.IGNORECASE)
_ITEM_SPLIT = re.compile(r"[\s,;]+")
_INNER_GROUP = re.compile(r"[\[(]([^\[\]()]*)[\])]")
_INT = re.compile(r"-?\d{1,6}")


def _bounded(text: object, limit: int = MAX_TEXT_CHARS) -> str:
    return text[:limit] if isinstance(text, str) else ""


def extract_code(response: object) -> str | None:
    """The last ```python block (or, failing that, the last fenced block); None without a closed fence."""
    code = (last_python_block(response, fallback_to_any_block=True, closed_only=True) or "")[:MAX_CODE_CHARS]
    return code if code.strip() else None


def text_after_last(text: object, marker: str) -> str | None:
    """The text after the last ``marker``; None when it does not occur."""
    text = _bounded(text)
    index = text.rfind(marker)
    return None if index < 0 else text[index + len(marker):]


def text_after_actions_marker(stdout: object) -> str | None:
    """The text after the last ``**Actions List**:`` line marker of a tool program's stdout."""
    text = _bounded(stdout)
    matches = list(_ACTIONS_MARKER.finditer(text))
    return text[matches[-1].end():] if matches else None


def _list_chunk(segment: str) -> str:
    """The first bracketed list of ``segment`` if it starts with one, else its first non-empty line."""
    stripped = segment.strip()
    if stripped.startswith("["):
        end = stripped.find("]")
        return stripped[1:end] if end >= 0 else stripped[1:].split("\n", 1)[0]
    for line in stripped.split("\n"):
        if line.strip():
            return line
    return ""


def _move_items(token: str) -> list[str]:
    token = token.strip("'\"`[](){}.*")
    if not token:
        return []
    name = MOVE_NAMES.get(token.lower())
    if name:
        return [name]
    if len(token) > 1 and set(token) <= set("UDLR"):  # "URRD": compact uppercase moves
        return list(token)
    return [INVALID_MOVE]


def parse_moves(segment: object) -> tuple[str, ...] | None:
    """Moves in ``segment`` (U/D/L/R, or ``?`` for an item that is no move); None when there are no items."""
    if not isinstance(segment, str):
        return None
    chunk = _list_chunk(_bounded(segment))
    moves: list[str] = []
    for token in _ITEM_SPLIT.split(chunk):
        moves.extend(_move_items(token))
        if len(moves) >= MAX_ACTIONS:
            break
    return tuple(moves[:MAX_ACTIONS]) or None


def _ints(text: str) -> list[int]:
    return [int(x) for x in _INT.findall(text)]


def parse_sudoku_answer(segment: object, size: int) -> tuple[tuple[int, int, int], ...] | None:
    """Fills (r, c, v) from a fill list or a full grid (a grid's zeros are skipped); None if neither."""
    if not isinstance(segment, str) or size < 2:
        return None
    segment = _bounded(segment)
    groups = [_ints(g) for g in _INNER_GROUP.findall(segment)]
    groups = [g for g in groups if g]
    if groups and all(len(g) == 3 for g in groups) and size != 3:
        return tuple((r, c, v) for r, c, v in groups[: 2 * size * size])
    if len(groups) >= size and all(len(g) == size for g in groups[:size]):
        return _grid_fills(groups[:size])
    if groups:
        return None
    rows = [_row_numbers(line) for line in segment.split("\n")]
    rows = [r for r in rows if len(r) == size]
    return _grid_fills(rows[:size]) if len(rows) >= size else None


def _row_numbers(line: str) -> list[int]:
    line = line.strip()
    if line.isdigit():  # "1234": one digit per cell
        return [int(ch) for ch in line]
    return _ints(line)


def _grid_fills(rows: list[list[int]]) -> tuple[tuple[int, int, int], ...]:
    return tuple((r, c, v) for r, row in enumerate(rows) for c, v in enumerate(row) if v != 0)
