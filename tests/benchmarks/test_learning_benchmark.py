"""Slow lane: SmolLM2 on the quickstart task, validation success before vs after training.

Run with ``make test-slow`` (or ``pytest -m slow tests/benchmarks``). It writes the same JSON as
``python benchmarks/training_run.py --name quickstart --out ...``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_smollm2_quickstart_task_learns(tmp_path):
    out = tmp_path / "learning.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "training_run.py"), "--name", "quickstart", "--out", str(out),
         f"training.log_dir={tmp_path}/logs", "training.experiment_name=learning_benchmark"],
        check=True, cwd=ROOT,
    )
    result = json.loads(out.read_text())
    validation = result["validation_success"]["val/procedural/success_rate"]
    steps = sorted(int(s) for s in validation)
    assert steps[0] == 0 and steps[-1] == result["steps"]
    for key in ("episode/success_rate",):
        assert result["curves"][key] and all(0.0 <= v <= 1.0 for v in result["curves"][key])
