"""Board facts in words for the plan agent's compact prompt: a small model reads words beside the move letters of
the answer format better than it reads coordinates off a drawn grid."""

from __future__ import annotations

Cell = tuple[int, int]


def offset_in_words(start: Cell, end: Cell) -> str:
    """Where ``end`` lies from ``start``, ``2 rows down (D) and 1 column left (L)`` (``here`` when equal): a fact
    about the board, not a path (walls and boxes may force a longer one). The move letters tie the words to the
    answer format."""
    (r, c), (er, ec) = start, end
    parts = [f"{abs(d)} {unit if abs(d) == 1 else unit + 's'} {word} ({word[0].upper()})"
             for d, unit, word in ((er - r, "row", "down" if er > r else "up"),
                                   (ec - c, "column", "right" if ec > c else "left")) if d]
    return " and ".join(parts) or "here"
