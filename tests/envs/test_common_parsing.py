"""The envs' one fence parser: its default rule (code and math agents) and the game tool agent's options."""

from __future__ import annotations

from pettingllms.envs.common.parsing import code_blocks, last_python_block, parse_test_pairs
from pettingllms.envs.games_common.parsing import extract_code

F = "```"
CODE_THEN_OUTPUT = f"{F}python\nsolve()\n{F}\nIt prints:\n{F}\n**Actions List**: [U]\n{F}\n"


def test_blocks_in_order_with_lower_cased_tags_and_an_unclosed_last_block():
    text = f"{F}Python\na\n{F} {F} bash --x\nb\n{F}\n{F}\nc"
    assert code_blocks(text) == [("python", "a\n"), ("bash", "b\n"), ("", "c")]
    assert code_blocks(text, closed_only=True) == [("python", "a\n"), ("bash", "b\n")]
    assert code_blocks(None) == [] and code_blocks(f"{F}{F}{F}") == []


def test_default_rule_python_and_untagged_alike_the_last_wins():
    assert last_python_block(CODE_THEN_OUTPUT) == "**Actions List**: [U]\n"
    assert last_python_block(f"{F}python\na\n{F}\n{F}cpp\nb\n{F}") == "a\n", "other languages never count"
    assert last_python_block(f"{F}cpp\nb\n{F}") is None
    assert last_python_block(f"{F}python\na\n{F}\n{F}python\n  \n{F}") == "a\n", "blank blocks are skipped"
    assert last_python_block(f"{F} py\nprint(3)") == "print(3)", "an unclosed last fence runs to the end"


def test_fallback_rule_prefers_python_tags_then_any_block():
    def fallback(text):
        return last_python_block(text, fallback_to_any_block=True)

    assert fallback(CODE_THEN_OUTPUT) == "solve()\n"
    assert fallback(f"{F}python\na\n{F}\n{F}cpp\nb\n{F}") == "a\n"
    assert fallback(f"{F}cpp\nb\n{F}\n{F}\nc\n{F}") == "c\n"
    assert fallback(f"{F}cpp\nb\n{F}") == "b\n"
    assert fallback(f"{F}python3\na\n{F}\n{F}python\n \n{F}") == "a\n"


def test_closed_only_ignores_an_unclosed_last_fence():
    assert last_python_block(f"{F}python\nprint(3)", closed_only=True) is None
    assert last_python_block(f"{F}python\na\n{F}\n{F}python\nb", closed_only=True) == "a\n"


def test_the_game_tool_agent_uses_the_fallback_rule_on_closed_fences_only():
    assert extract_code(CODE_THEN_OUTPUT) == "solve()\n"
    assert extract_code(f"{F}text\nprint(1)\n{F}") == "print(1)\n"
    assert extract_code(f"{F}python\nprint(3)") is None
    assert extract_code(f"{F}python\n" + "x" * 30_000 + f"\n{F}") == "x" * 20_000, "code is cut to 20k chars"


def test_test_pairs_read_closed_blocks_with_the_same_fence_lines():
    text = f"**Test Input:**\n  {F} text\n1 2\n{F}\n**Test Output:**\n{F}\n3\n{F}\n**Test Input:**\n{F}\n4\n"
    assert parse_test_pairs(text, 5) == (("1 2\n", "3\n"),)
