"""A run killed with SIGKILL in the middle of a step resumes (``training.resume=auto``) to exactly the metrics of
an uninterrupted run: checkpoints are atomic, and they hold everything the next steps depend on (weights,
optimizer, LR schedule, data cursor, the learner's and the engine's RNG).

The training runs as a separate ``pettingllms train`` process (its own process group), killed with SIGKILL as
soon as the step-2 checkpoint is the latest one, i.e. while step 3 runs (or while its checkpoint is written).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import pytest

from test_resume_and_bad_input import BASE, comparable

STEPS = ["training.total_training_steps=5", "training.save_freq=1"]


def train_process(log_dir: Path, *extra: str, overrides: Sequence[str] = (*BASE, *STEPS),
                  launch: Sequence[str] = ("-m", "pettingllms.cli"), env: dict | None = None) -> subprocess.Popen:
    """``pettingllms train`` in its own process group (``launch``: how Python starts the CLI, e.g. a ``-c`` script
    that patches something first and then calls ``pettingllms.cli.main`` with the remaining arguments)."""
    args = [sys.executable, *launch, "train", *overrides, f"training.log_dir={log_dir}", *extra]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)


def latest(log_dir: Path) -> str | None:
    pointers = list(log_dir.glob("*/*/*/checkpoints/latest"))
    return pointers[0].read_text().strip() if pointers else None


@pytest.mark.timeout(900)
def test_kill_9_mid_step_then_resume_auto_reproduces_the_uninterrupted_run(tmp_path):
    from pettingllms.entry.train import run_training

    straight, _ = run_training("train", BASE + STEPS + [f"training.log_dir={tmp_path / 'straight'}",
                                                        "training.resume=none"])
    expected = comparable(straight.run_dir)

    killed_dir = tmp_path / "killed"
    process = train_process(killed_dir, "training.resume=auto")
    deadline = time.monotonic() + 600
    while latest(killed_dir) != "step_000002":
        assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "no step-2 checkpoint within 600 s"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)  # the trainer and anything it started
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    (run_dir,) = killed_dir.glob("*/*/*")
    killed_rows = comparable(run_dir)
    assert max(killed_rows) < 5, "the kill must land before the run finished"

    resumed, _ = run_training("train", BASE + STEPS + [f"training.log_dir={killed_dir}", "training.resume=auto"])
    assert resumed.run_dir == run_dir  # the same run continues
    got = comparable(resumed.run_dir)
    assert sorted(got) == [0, 1, 2, 3, 4, 5]
    for step in range(1, 6):
        assert got[step] == expected[step], f"step {step} differs after kill -9 and resume"
    summary_steps = [json.loads(line)["step"] for line in (run_dir / "summary.log").read_text().splitlines()]
    assert summary_steps == [0, 1, 2, 3, 4, 5]  # no line of the killed step survives twice
