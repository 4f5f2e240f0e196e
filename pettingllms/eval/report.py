"""The evaluation summary as tables on the console (rich) and as ``summary.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from rich.console import Console
from rich.table import Table

SUMMARY_FILE = "summary.json"
SHOWN_TURNS = 6  # "solved by turn" columns on the console


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> Path:
    path = run_dir / SUMMARY_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
    return path


def print_summary(summary: Mapping[str, Any], console: Console | None = None) -> None:
    """Headline table (pass@k, success by turn) and a per-agent table, one row per benchmark (and agent)."""
    console = console or Console()
    ks = summary["settings"]["k"]
    s = summary["settings"]
    if s["temperature"] is None:  # agents sample differently (each with its run's val_sampling)
        sampling = "each agent's own sampling (summary.json: settings.agents)"
    else:
        sampling = "greedy" if s["temperature"] == 0 else f"T={s['temperature']} top_p={s['top_p']} top_k={s['top_k']}"
    headline = Table(title=f"pettingllms eval: n={s['n']} sample(s) per problem, {sampling}")
    headline.add_column("benchmark", no_wrap=True)
    for column in ("problems", *[f"pass@{k}" for k in ks]):
        headline.add_column(column, justify="right")
    headline.add_column("solved by turn")
    headline.add_column("turns", justify="right")
    headline.add_column("failed", justify="right")  # failed generations
    errors = any(b.get("error_ratio") for b in summary["benchmarks"].values())
    if errors:  # episodes that ended in an error (an agent program that raised): shown when there are any
        headline.add_column("errors", justify="right")
    agents = Table(title="per agent (solved: after the agent's action)")
    agents.add_column("benchmark", no_wrap=True)
    agents.add_column("agent", no_wrap=True)
    for column in ("actions", "solved", "reward/step", "local/step", "return", "tokens"):
        agents.add_column(column, justify="right")
    for key, b in summary["benchmarks"].items():
        by_turn = list(b["success_by_turn"].values())
        by_turn = " ".join(_pct(v) for v in by_turn[:SHOWN_TURNS]) + (" ..." if len(by_turn) > SHOWN_TURNS else "") \
            if by_turn else "-"  # a game's 30 turns would not fit a terminal: summary.json has them all
        headline.add_row(key, str(b["problems"]), *[_pct(b[f"pass@{k}"]) for k in ks], by_turn,
                         _num(b["turns_mean"]), _pct(b["failed_generation_ratio"]),
                         *([_pct(b["error_ratio"])] if errors else []))
        for agent, a in b["agents"].items():
            agents.add_row(key, agent, str(int(a["actions"])), _pct(a["success_after_action"]), _num(a["reward_mean"]),
                           _num(a["local_reward_mean"]), _num(a["return_mean"]), _num(a["response_tokens_mean"], 1))
    console.print(headline)
    console.print(agents)
    seats = [(key, _seat_label(seat, b.get("seat")), r) for key, b in summary["benchmarks"].items()
             for seat, r in b.get("seats", {}).items()]
    if seats:  # games: each seat's results with 95% Wilson intervals
        table = Table(title="per seat (games): win / draw / loss, 95% interval")
        for column in ("benchmark", "seat", "games", "win", "draw", "loss", "outcome"):
            table.add_column(column, justify="left" if column in ("benchmark", "seat") else "right")
        for key, seat, r in seats:
            table.add_row(key, seat, str(r["games"]), *[_rate(r, name) for name in ("win", "draw", "loss")],
                          _num(r["outcome_mean"]))
        console.print(table)
    console.print(f"records and {SUMMARY_FILE}: {summary['run_dir']}")


def _seat_label(seat: str, evaluated: str | None) -> str:
    """Against ``model.opponent`` each pass has one seat with the evaluated weights; the others are the opponent's."""
    if evaluated is None:
        return seat
    return f"{seat} (evaluated)" if seat == evaluated else f"{seat} (opponent)"


def _rate(row: Mapping[str, Any], name: str) -> str:
    low, high = row[f"{name}_ci95"]
    return f"{100 * row[f'{name}_rate']:.0f}% [{100 * low:.0f}, {100 * high:.0f}]"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
