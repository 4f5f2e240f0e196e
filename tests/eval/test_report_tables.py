"""The console tables of ``pettingllms eval``: what summary.json holds, readable, nothing hidden."""

from __future__ import annotations

from rich.console import Console

from pettingllms.eval.report import print_summary

AGENT = {"actions": 8.0, "success_after_action": None, "reward_mean": 0.0, "local_reward_mean": 0.0,
         "return_mean": -0.25, "response_tokens_mean": 8.0, "failed_ratio": 0.0}
SUMMARY = {"settings": {"k": [1], "n": 2, "temperature": 1.0, "top_p": 1.0, "top_k": -1}, "run_dir": "/runs/x",
           "benchmarks": {"program/procedural": {"problems": 4, "pass@1": 0.25, "success_by_turn": {},
                                                 "turns_mean": 2.0, "failed_generation_ratio": 0.0,
                                                 "error_ratio": 0.75, "agents": {"solver": AGENT}}}}


def test_episodes_that_ended_in_an_error_show_beside_failed_generations():
    """An agent program that raised in 3 of 4 episodes: summary.json's error_ratio is on the console, not just 0%
    failed generations."""
    console = Console(width=140, record=True)
    print_summary(SUMMARY, console)
    text = console.export_text()
    header = next(line for line in text.splitlines() if "failed" in line and "errors" in line)
    row = next(line for line in text.splitlines() if "program/procedural" in line and "25.0%" in line)
    assert header.index("errors") > header.index("failed") and row.rstrip(" │").endswith("75.0%")
    agents = next(line for line in text.splitlines() if "solver" in line)
    assert "-0.25" in agents  # the agent's return per episode
    quiet = {**SUMMARY, "benchmarks": {k: {**b, "error_ratio": 0.0} for k, b in SUMMARY["benchmarks"].items()}}
    console = Console(width=140, record=True)
    print_summary(quiet, console)
    assert "errors" not in console.export_text()  # no errors, no column: narrow terminals keep their headers
