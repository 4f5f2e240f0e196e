"""Run directories are absolute: they are handed to Ray actors, whose working directory is not the driver's (a
worker node, or wherever ``ray start`` ran), so a relative ``training.log_dir`` would put checkpoints elsewhere."""

from __future__ import annotations

from pettingllms.assembly.run_dirs import new_run_dir
from pettingllms.trainer.run_dir import find_resumable_run


def test_a_relative_log_dir_gives_an_absolute_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = new_run_dir("logs", "exp")
    assert run.is_absolute() and run.is_dir() and run.parent.parent == tmp_path / "logs" / "exp"
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("step_000001")
    found = find_resumable_run("logs", "exp")
    assert found is not None and found.is_absolute() and found == run
