"""The two game roles. Both are generic: everything game-specific comes from the state's text fields."""

from __future__ import annotations

from typing import Any

from pettingllms.core import Agent, Message

from .base import GameState
from .parsing import extract_code, text_after_last

PLAN_MARKER = "####"
HISTORY_SHOWN = 3
PROMPTS = ("full", "compact")

TOOL_SYSTEM = (
    "You are the tool agent of a two-agent team solving a puzzle. You write a Python 3 program (standard "
    "library only) that solves the puzzle by search, for example BFS or A*. Your teammate, the plan agent, "
    "sees your code, its output and the actions it printed, then decides the final moves."
)
PLAN_SYSTEM = (
    "You are the plan agent of a two-agent team solving a puzzle. You decide the actions that are really "
    "applied to the board. End your answer with one line: #### followed by the action list."
)


def _history(state: GameState) -> str:
    if not state.history:
        return ""
    return "\nEarlier turns:\n" + "\n".join(state.history[-HISTORY_SHOWN:]) + "\n"


def _task(state: GameState) -> str:
    return f"{state.instructions}\n\nCurrent board:\n{state.board_text}\n{_history(state)}"


def _tool_report(state: GameState) -> str:
    tool = state.tool
    if tool is None:
        return "No tool program ran this turn: solve the puzzle yourself.\n"
    if tool.verdict == "no-code":
        return "The tool agent wrote no runnable code block this turn: solve the puzzle yourself.\n"
    actions = "none" if not tool.actions else "[" + ", ".join(str(a) for a in tool.actions[:60]) + "]"
    simulated = "not simulated (no actions)" if not tool.actions else (
        f"reward {tool.sim_reward:+.2f}, " + ("solves the puzzle" if tool.sim_solved else "does not solve it"))
    return (
        f"The tool agent's program:\n```python\n{tool.code}\n```\n"
        f"Its run ended with verdict '{tool.verdict}' and printed:\n```\n{tool.stdout.strip()}\n```\n"
        f"Parsed actions: {actions}\nSimulated on a copy of the board: {simulated}\n"
    )


class ToolAgent(Agent):
    """Writes a solver program; ``parse`` returns its code (or None)."""

    known_options = ()

    def observe(self, state: GameState, turn: int) -> list[Message]:
        del turn
        user = (
            f"{_task(state)}\n"
            "Write a Python program that computes the action list that solves the puzzle from the current "
            "board. The board text above is also given on standard input. The program must print one line:\n"
            "**Actions List**: <the action list>\n"
            "Put the whole program in one ```python code block."
        )
        return [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": user}]

    def parse(self, response: str) -> str | None:
        try:
            return extract_code(response)
        except Exception:  # parsers must survive any text; extract_code already does, this is belt and braces
            return None

    def local_reward(self, state: Any) -> float:
        tool = getattr(state, "tool", None)
        return float(tool.sim_reward) if tool is not None else 0.0


def _compact_ask(instructions: str, board_text: str, positions: str, rest: str) -> str:
    return f"{instructions}\nBoard:\n{board_text}\n{positions}\n{rest}Give the action list after {PLAN_MARKER}."


class PlanAgent(Agent):
    """Decides the real actions; ``parse`` returns the answer text after the last ``####`` (or None).

    ``prompt="full"``: the system message, rules, board, earlier turns and the tool's report. ``"compact"``, for
    models too small to follow that (SmolLM2-135M answers it with no move at all): no system message, the board's
    positions in words, and first one worked example, a solved puzzle of the same kind from a seed in neither split.
    """

    known_options = ()

    def __init__(self, name: str, prompt: str = "full", **options: Any) -> None:
        super().__init__(name, **options)
        if prompt not in PROMPTS:
            raise ValueError(f"prompt must be one of {', '.join(PROMPTS)}, got {prompt!r}")
        self.prompt = prompt

    def observe(self, state: GameState, turn: int) -> list[Message]:
        del turn
        if self.prompt == "compact":
            return self._compact(state)
        has_tool_run = state.tool is not None and state.tool.verdict != "no-code"
        advice = "Adopt the tool's actions if they are right, or override them. " if has_tool_run else ""
        user = (
            f"{_task(state)}\n{_tool_report(state)}\n{advice}"
            f"Think briefly, then give the final action list on the last line after {PLAN_MARKER}."
        )
        return [{"role": "system", "content": PLAN_SYSTEM}, {"role": "user", "content": user}]

    def _compact(self, state: GameState) -> list[Message]:
        tool = _tool_report(state) if state.tool is not None else ""
        earlier = _history(state).lstrip("\n")
        messages: list[Message] = []
        if state.example is not None:
            ex = state.example
            messages += [{"role": "user", "content": _compact_ask(state.instructions, ex.board_text, ex.positions, "")},
                         {"role": "assistant", "content": f"{PLAN_MARKER} {ex.answer}"}]
        ask = _compact_ask(state.instructions, state.board_text, state.positions, earlier + tool)
        return messages + [{"role": "user", "content": ask}]

    def parse(self, response: str) -> str | None:
        try:
            answer = text_after_last(response, PLAN_MARKER)
        except Exception:
            return None
        if answer is None or not answer.strip():
            return None
        return answer.strip()

    def local_reward(self, state: Any) -> float:
        return float(getattr(state, "plan_reward", 0.0))
