"""docs/self_play.md is a test: its Nim module, saved as the page says, passes check-env and trains in self-play with
exactly the page's commands; each seat's results reach summary.log."""

from __future__ import annotations

import json
import sys

from doc_support import example_module, run_page_example


def test_the_pages_nim_game_checks_and_trains(tmp_path, monkeypatch, capsys):
    logs = run_page_example("self_play.md", "nim_env", tmp_path, monkeypatch, capsys)
    (summary,) = logs.glob("**/summary.log")
    rows = [json.loads(line) for line in summary.read_text().splitlines()]
    assert {"episode/player_0/win_rate", "episode/player_1/loss_rate"} <= set(rows[-1])
    assert "W/D/L" in capsys.readouterr().out


def test_the_pages_nim_game_gives_the_right_first_move_the_better_advantage(tmp_path, monkeypatch, make_executor):
    """From 4 stones, taking 1 leaves the opponent a lost position (3). Neither first move ends the game, so only the
    playouts tell them apart (hand-computed below, with a script that takes 2 whenever 2 stones or more are left)."""
    (tmp_path / "nim_env.py").write_text(example_module("self_play.md"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])
    try:
        import nim_env
        from pettingllms.core import Problem

        def script(prompt, k, request):  # player_0 offers 1 then 2; later every answer takes 2 if it can, else 1
            if prompt.count("stones left") == 1 and "4 stones left" in prompt:
                return "12"[k % 2]
            return "2" if "1 stones left" not in prompt else "1"

        executor, _ = make_executor(nim_env.NimEnv(), script, branching=2, mode="tree", playouts=1)
        result = executor.run([Problem("nim", {"stones": 4})], [0])
    finally:
        sys.modules.pop("nim_env", None)
    first = {s.response_text: s.reward for s in result.samples if s.turn == 0}
    # take 1 -> 3 left, opponent takes 2 -> 1 left, player_0 takes it: +1; take 2 -> 2 left, opponent takes 2: -1
    assert first == {"1": 1.0, "2": -1.0}
