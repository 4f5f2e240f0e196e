"""Slow lane: SmolLM2 on the quickstart task, validation success before vs after training; and the benchmark lane's
smoke of benchmarks/learning_claims.py --quick.

Run with ``make test-slow`` (or ``pytest -m slow tests/benchmarks``) and ``make test-bench``. It writes the same JSON as
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


@pytest.mark.bench
def test_learning_claims_quick_runs_every_method_end_to_end(tmp_path):
    """The pre-registered comparison's pipeline, at a tiny budget: each method trains past its budget, is evaluated
    before and after, and the report, its paired comparisons and the plot are written."""
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning_claims.py"), "--quick", "--out-dir", str(tmp_path),
         "--log-dir", str(tmp_path / "logs")],
        check=True, cwd=ROOT,
    )
    report = json.loads((tmp_path / "learning_claims_paired_vault.json").read_text())
    assert {r["method"] for r in report["runs"]} == {"at_grpo", "trajectory", "single_agent"}
    for r in report["runs"]:
        assert r["tokens"] >= report["config"]["budget_tokens"] and r["steps"] >= 1
        assert r["curve"][0][0] == 0 and len(r["curve"]) >= 2
        assert all(0.0 <= value <= 1.0 for _, value in r["curve"])
        assert r["problems"][0] == 4 and r["problems"][-1] == 8  # fewer held-out problems before the end
        assert r["eval_seconds"] < r["seconds"]
    assert set(report["comparisons"]) == {f"at_grpo - {other} ({metric})" for other in ("trajectory", "single_agent")
                                          for metric in ("auc", "final")}
    for key, c in report["comparisons"].items():
        assert c["pairs"] == 1 and c["low"] == c["mean"] == c["high"]  # one seed: the interval is its difference
        other = key.split(" - ")[1].split(" ")[0]
        assert c["verdict"] == ("not separated" if c["mean"] == 0 else
                                "at_grpo better" if c["mean"] > 0 else f"{other} better")
    assert (tmp_path / "learning_claims_paired_vault.png").stat().st_size > 10_000
    # every finished run was kept at once; asked again, the benchmark reuses them instead of training
    assert len((tmp_path / "logs" / "runs.jsonl").read_text().splitlines()) == 3
    again = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning_claims.py"), "--quick", "--out-dir", str(tmp_path),
         "--log-dir", str(tmp_path / "logs"), "--seeds", "0", "--methods", "trajectory"],
        check=True, cwd=ROOT, capture_output=True, text=True,
    )
    assert "trajectory seed 0: kept from" in again.stdout
    kept = json.loads((tmp_path / "learning_claims_paired_vault.json").read_text())["runs"]
    assert kept == [r for r in report["runs"] if r["method"] == "trajectory"]
