"""Helpers shared by the evaluation tests: reading records and checking a summary against them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pettingllms.eval.passk import mean_pass_at_k, pass_at_k


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def only_run_dir(log_dir: Path) -> Path:
    runs = [p.parent for p in log_dir.glob("*/*/summary.json")]
    assert len(runs) == 1, runs
    return runs[0]


def check_records_against_summary(run_dir: Path, summary: dict) -> None:
    """Every pass@k in the summary is the estimator applied to the per-sample successes in the JSONL records."""
    ks = summary["settings"]["k"]
    n = summary["settings"]["n"]
    for key, bench in summary["benchmarks"].items():
        records = read_jsonl(run_dir / bench["records"])
        assert len(records) == bench["problems"] > 0
        counts = []
        for record in records:
            successes = [s["success"] for s in record["samples"]]
            assert record["benchmark"] == key and record["n"] == len(successes) == n
            assert record["num_success"] == sum(successes)
            for k in ks:
                assert record["pass_at_k"][str(k)] == pytest.approx(pass_at_k(n, sum(successes), k))
            counts.append((n, sum(successes)))
        for k in ks:
            assert bench[f"pass@{k}"] == pytest.approx(mean_pass_at_k(counts, k))
        assert bench["success_rate"] == pytest.approx(sum(c for _, c in counts) / (n * len(counts)))
