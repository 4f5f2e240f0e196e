"""docs/agent_programs.md is a test: its program, saved as the page says, passes check-env and trains with exactly the
page's commands; each agent's reward and samples reach summary.log."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

from pettingllms.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent_programs.md"


def test_the_pages_program_checks_and_trains(tmp_path, monkeypatch, capsys):
    text = DOC.read_text()
    module = re.search(r"## A complete example.*?```python\n(.*?)```", text, flags=re.S).group(1)
    (tmp_path / "my_program.py").write_text(module)
    block = re.search(r"Saved as `my_program.py`.*?```bash\n(.*?)```", text, flags=re.S).group(1)
    check, train = [shlex.split(line) for line in block.splitlines() if line.strip()]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        assert check[0] == "pettingllms" and main(check[1:]) == 0, capsys.readouterr().out
        assert main([*train[1:], f"training.log_dir={tmp_path / 'logs'}"]) == 0
    finally:
        sys.modules.pop("my_program", None)
    (summary,) = (tmp_path / "logs").glob("**/summary.log")
    rows = [json.loads(line) for line in summary.read_text().splitlines()]
    assert len(rows) == 2
    for agent in ("proposer", "reviewer"):
        assert rows[-1][f"policy_0/{agent}/samples"] == 4.0 and f"policy_0/{agent}/reward_mean" in rows[-1]
