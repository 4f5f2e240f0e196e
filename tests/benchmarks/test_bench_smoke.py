"""Slow lane: each issue-#7 benchmark script runs end to end with ``--quick`` and writes a complete JSON.

Quick runs use the tiny random model and tiny sizes, so their figures mean nothing; what is checked is that
the script really runs its measurement and reports it in the agreed shape, with a verdict that matches the
numbers. Run with ``pytest -m slow tests/benchmarks/test_bench_smoke.py``.
"""

from __future__ import annotations

import importlib.util
import json
import operator
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
COMPARE = {">=": operator.ge, "<=": operator.le, "<": operator.lt}


def run_quick(name: str, out: Path) -> dict:
    """Import benchmarks/<name>.py, call its main with --quick into ``out``, return the JSON it wrote."""
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    module.main(["--quick", "--out-dir", str(out)])
    report = json.loads((out / f"{name}.json").read_text())
    check_common_fields(report, name)
    return report


def check_common_fields(report: dict, name: str) -> None:
    from _report import REQUIRED_FIELDS

    missing = [f for f in REQUIRED_FIELDS if f not in report]
    assert not missing, f"{name}.json lacks {missing}"
    assert report["benchmark"] == name and report["quick"] is True
    assert f"benchmarks/{name}.py" in report["command"] and "--quick" in report["command"]
    machine = report["machine"]
    for key in ("cpu_count", "torch", "load_average_before", "load_average_after", "torch_threads"):
        assert key in machine, key
    assert len(machine["load_average_before"]) == 3
    assert isinstance(report["measured"], float)
    target = report["target"]
    expected = COMPARE[target["op"]](report["measured"], target["value"]) and all(report["also_required"].values())
    assert report["passed"] is expected
    assert report["samples"] and report["medians"] and report["config"]


@pytest.mark.slow
def test_rollout_efficiency_quick(tmp_path):
    report = run_quick("rollout_efficiency", tmp_path)
    for sample in report["samples"]:
        assert sample["tokens"] > 0 and sample["calls"] >= 1
        # The bare replay starts from the executor's RNG state with the executor's own requests: same tokens.
        assert sample["identical_completions"] is True
        assert sample["ratio"] == pytest.approx(sample["bare_s"] / sample["executor_s"])


@pytest.mark.slow
def test_naive_loop_quick(tmp_path):
    report = run_quick("naive_loop", tmp_path)
    for sample in report["samples"]:
        executor, naive = sample["executor"], sample["naive"]
        assert executor["tokens"] > 0 and naive["tokens"] > 0
        assert naive["calls"] > executor["calls"]  # one call per candidate vs one per flush


@pytest.mark.slow
def test_scaling_quick(tmp_path):
    report = run_quick("scaling", tmp_path)
    fits = report["medians"]["fits"]
    assert {"vs_generated_tokens", "vs_episodes"} <= set(fits)
    assert all({"slope", "intercept", "r2"} <= set(f) for f in fits.values())
    steps = [s for row in report["samples"] for s in row["steps"]]
    assert len(steps) == len(report["config"]["sweep"]) * report["config"]["repeats"]
    assert all(s["generated_tokens"] > 0 and s["step_s"] > 0 for s in steps)


@pytest.mark.slow
def test_driver_memory_quick(tmp_path):
    report = run_quick("driver_memory", tmp_path)
    samples = report["samples"]
    assert [s["step"] for s in samples] == list(range(1, report["config"]["steps"] + 1))
    assert all(s["rss_bytes"] > 0 for s in samples)
    assert "growth_from_step_1" in report["medians"] and "growth_from_step_5" in report["medians"]


@pytest.mark.slow
def test_trl_compare_quick(tmp_path):
    if not (ROOT / ".venv-trl" / "bin" / "python").is_file():
        pytest.skip("TRL venv missing: run `bash benchmarks/trl/setup.sh` first")
    report = run_quick("trl_compare", tmp_path)
    ours = report["samples"]["ours"]["timed"]
    configurations = report["trl_configurations"]
    assert len(ours) == len(configurations) + 1 and all(s["seconds"] > 0 for s in ours)
    assert {c["name"] for c in configurations} == {"trl_defaults", "defaults_fp32", "one_batch_fp32",
                                                   "micro_batches_fp32", "micro_batches_bf16"}
    for c in configurations:  # every configuration ran its timed steps, as configured
        assert c["error"] is None and c["step_s_median"] > 0 and len(c["step_s"]) == report["config"]["repeats"]
        assert c["threads"] == report["config"]["threads"] and c["peak_rss_gb"] > 0
        assert c["gradient_checkpointing"] == c["settings"].get("gradient_checkpointing", True)  # TRL's default
        assert c["bf16"] == c["settings"].get("bf16", True)
    best = min(configurations, key=lambda c: c["step_s_median"])
    assert report["fastest_trl_configuration"] == best["name"]
    assert report["ratio"] == report["ours_step_s_median"] / best["step_s_median"] == report["medians"]["ratio"]
    alone, short = report["standalone"]
    assert alone["name"] == f"{best['name']}/harness_prompts" and alone["step_s_median"] > 0
    assert alone["prompt_lengths"] == report["config"]["prompt_lengths"]["trl"]
    assert short["step_s_median"] > 0 and sum(short["prompt_lengths"]) < sum(alone["prompt_lengths"])
    lengths = report["config"]["prompt_lengths"]
    assert lengths["ours"] == lengths["trl"]  # both sides tokenize the same chat messages identically
