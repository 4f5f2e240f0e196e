"""Text parsers for model responses, shared by the envs. Every function here is total: any string in, a value out.

Model responses are arbitrary text (empty, huge, unclosed fences, several fences, unicode). The parsers use
linear-time scans and never raise; anything they cannot read becomes ``None`` or an empty tuple.

Fenced code blocks have one set of rules here (``code_blocks``): an opening fence is ```` ``` ````, optional
spaces, a language tag (lower-cased) and the rest of its line; the block ends at the next ```` ``` ````.
"""

from __future__ import annotations

import re

MAX_PARSE_CHARS = 200_000  # longer responses are cut first, so a pathological reply cannot stall a worker
# Bounded repeats only: an unbounded [^\n]* after every ``` makes a newline-free run of backticks quadratic.
_FENCE_LINE = r"```[ \t]{0,10}([A-Za-z0-9_+\-.]{0,30})[^\n`]{0,100}\n"
_FENCE = re.compile(_FENCE_LINE)
PYTHON_TAGS = frozenset({"python", "python3", "py"})


def _block(text: str, opening: re.Match) -> tuple[str, str, int]:
    """(tag, body, index after the closing fence; -1 when the block is not closed) of the block ``opening`` starts."""
    start = opening.end()
    close = text.find("```", start)
    body = text[start:] if close < 0 else text[start:close]
    return opening.group(1).lower(), body, -1 if close < 0 else close + 3


def code_blocks(text: object, *, closed_only: bool = False) -> list[tuple[str, str]]:
    """(language tag, body) of each fenced block in order. A final unclosed fence runs to the end of the text,
    because a response cut by max_tokens usually lost only its closing fence; ``closed_only`` drops it."""
    if not isinstance(text, str):
        return []
    text = text[:MAX_PARSE_CHARS]
    blocks = []
    pos = 0
    while (opening := _FENCE.search(text, pos)) is not None:
        tag, body, pos = _block(text, opening)
        if pos < 0:
            if not closed_only:
                blocks.append((tag, body))
            break
        blocks.append((tag, body))
    return blocks


def last_python_block(text: object, *, fallback_to_any_block: bool = False, closed_only: bool = False) -> str | None:
    """Body of the last non-blank fenced block holding the Python program; None when there is none.

    Two documented rules, one per kind of agent:
    - default (the code and math agents): blocks tagged python, python3, py or untagged count alike, the last
      one wins; blocks tagged with another language never count;
    - ``fallback_to_any_block`` (the game tool agent): the last python-tagged block; only when there is none,
      the last block with any other tag or none.
    ``closed_only`` ignores a final unclosed fence (the game tool agent: a response without a closed fence has
    no code); by default it runs to the end of the text.
    """
    blocks = [(tag, body) for tag, body in code_blocks(text, closed_only=closed_only) if body.strip()]
    if fallback_to_any_block:
        tiers = ([body for tag, body in blocks if tag in PYTHON_TAGS], [body for _, body in blocks])
    else:
        tiers = ([body for tag, body in blocks if tag in PYTHON_TAGS or tag == ""],)
    return next((tier[-1] for tier in tiers if tier), None)


MAX_BOXED_CHARS = 5_000  # a \\boxed{} longer than this is not an answer
MAX_BOXED_TRIES = 50  # unclosed boxes examined from the end, so "\\boxed{" * 10**5 stays linear


def last_boxed(text: object) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces; None if absent/empty/unclosed."""
    if not isinstance(text, str):
        return None
    text = text[:MAX_PARSE_CHARS]
    for marker in ("\\boxed", "\\fbox"):
        start = text.rfind(marker + "{")
        for _ in range(MAX_BOXED_TRIES):
            if start < 0:
                break
            content = _balanced(text, start + len(marker) + 1)
            if content is not None and content.strip():
                return content.strip()
            start = text.rfind(marker + "{", 0, start)
    return None


def _balanced(text: str, start: int) -> str | None:
    depth = 1
    for i in range(start, min(len(text), start + MAX_BOXED_CHARS)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is)?\s*[:=]?\s*\$?([^\n$]{1,80})", re.IGNORECASE)


def final_answer(text: object, fallback: bool = True) -> str | None:
    """The answer a response commits to: the last ``\\boxed{}``; with ``fallback``, else an "Answer: X" line,
    else the last number. None when nothing answer-like is present."""
    boxed = last_boxed(text)
    if boxed is not None or not fallback or not isinstance(text, str):
        return boxed
    tail = text[-MAX_PARSE_CHARS:]
    lines = _ANSWER_LINE.findall(tail[-4000:])
    if lines and lines[-1].strip(" .*"):
        return lines[-1].strip(" .*")
    numbers = _NUMBER.findall(tail[-4000:])
    return numbers[-1].replace(",", "") if numbers else None


_INPUT_LABEL = re.compile(r"Test\s{0,3}Input\s{0,3}\d{0,3}\s{0,3}:?\s{0,3}\*{0,2}\s{0,3}:?", re.IGNORECASE)
_OUTPUT_LABEL = re.compile(r"[\s*]{0,8}Test\s{0,3}Output\s{0,3}\d{0,3}\s{0,3}:?\s{0,3}\*{0,2}\s{0,3}:?", re.IGNORECASE)
_FENCE_AFTER_SPACE = re.compile(r"\s{0,20}" + _FENCE_LINE)


def parse_test_pairs(text: object, max_tests: int) -> tuple[tuple[str, str], ...]:
    """(stdin, expected stdout) pairs written as ``**Test Input:**`` + fenced block, then ``**Test Output:**`` +
    fenced block. Pairs missing a part or a closing fence are skipped; at most ``max_tests`` are kept."""
    if not isinstance(text, str) or max_tests < 1:
        return ()
    text = text[:MAX_PARSE_CHARS]
    pairs: list[tuple[str, str]] = []
    for examined, label in enumerate(_INPUT_LABEL.finditer(text)):
        if examined >= 8 * max_tests:  # bounded work whatever the text
            break
        test_input, end = _block_at(text, label.end())
        if test_input is None:
            continue
        out_label = _OUTPUT_LABEL.match(text, end)
        if out_label is None:
            continue
        expected, _ = _block_at(text, out_label.end())
        if expected is None:
            continue
        pairs.append((_as_stdin(test_input), expected))
        if len(pairs) >= max_tests:
            break
    return tuple(pairs)


def _block_at(text: str, pos: int) -> tuple[str | None, int]:
    """The closed fenced block starting at ``pos`` (after a little whitespace), and the index after it."""
    opening = _FENCE_AFTER_SPACE.match(text, pos)
    if opening is None:
        return None, pos
    _, body, end = _block(text, opening)
    return (None, pos) if end < 0 else (body, end)


def _as_stdin(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"
