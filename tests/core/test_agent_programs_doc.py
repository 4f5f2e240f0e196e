"""docs/agent_programs.md is a test: its program, saved as the page says, passes check-env and trains with exactly the
page's commands; each agent's reward and samples reach summary.log."""

from __future__ import annotations

import json

from doc_support import run_page_example


def test_the_pages_program_checks_and_trains(tmp_path, monkeypatch, capsys):
    logs = run_page_example("agent_programs.md", "my_program", tmp_path, monkeypatch, capsys)
    (summary,) = logs.glob("**/summary.log")
    rows = [json.loads(line) for line in summary.read_text().splitlines()]
    assert len(rows) == 2
    for agent in ("proposer", "reviewer"):
        assert rows[-1][f"policy_0/{agent}/samples"] == 4.0 and f"policy_0/{agent}/reward_mean" in rows[-1]
