"""``benchmarks/lora_vs_shared.py``: L2 (an adapter per agent) against L1 (one shared adapter), step by step.

The quick run uses the tiny random model, so its figures mean nothing; what is checked is that both levels really
trained in their own processes on the same workload and that the JSON reports what the target is judged on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def test_the_levels_alternate_so_each_runs_first_in_half_the_pairs():
    import lora_vs_shared

    order = lora_vs_shared.alternating_order(4)
    assert order == [("L1", "L2"), ("L2", "L1"), ("L1", "L2"), ("L2", "L1")]


def test_the_two_levels_differ_only_in_specialization(tmp_path):
    import lora_vs_shared

    configs = {level: lora_vs_shared.overrides(level, "hf", "m", rank=8, problems=1, branching=2, turns=1,
                                                max_tokens=4, threads=1, steps=2, workdir=tmp_path)
               for level in ("L1", "L2")}
    differing = set(configs["L1"]) ^ set(configs["L2"])
    assert differing == {"specialization=L1", "specialization=L2"}
    assert "base_models.policy_0.lora.rank=8" in configs["L1"]  # L1 trains one shared adapter of the same rank


def test_a_missing_vllm_interpreter_is_a_note_not_a_failure(tmp_path):
    import lora_vs_shared

    python, why = lora_vs_shared.vllm_python(str(tmp_path / "no-python"))
    assert python is None and "no vLLM interpreter" in why and "install_vllm_cpu.sh" in why


@pytest.mark.bench
def test_lora_vs_shared_quick_reports_both_levels_per_engine(tmp_path):
    import lora_vs_shared
    from _report import REQUIRED_FIELDS

    lora_vs_shared.main(["--quick", "--engines", "hf", "vllm", "--vllm-python", str(tmp_path / "none"),
                         "--out-dir", str(tmp_path)])
    report = json.loads((tmp_path / "lora_vs_shared.json").read_text())
    assert not [f for f in REQUIRED_FIELDS if f not in report]
    assert report["quick"] is True and report["engines_skipped"] == ["vllm"]
    assert any(note.startswith("vllm part skipped: no vLLM interpreter") for note in report["notes"])
    levels = report["medians"]["hf"]
    for level in ("L1", "L2"):
        figures = levels[level]
        assert figures["step_s"] > 0 and figures["generate_s"] > 0 and figures["update_s"] > 0
        assert figures["peak_rss_mib"] > 0 and figures["learner"]["optimizer_rounds"] >= 1
        assert len(report["samples"]["hf"][level]) == report["config"]["timed_steps"]
    # Same workload on both sides: every sequence runs to the token cap on the tiny random model.
    cap = report["config"]["sequences_per_step"] * report["config"]["max_tokens"]
    assert levels["L1"]["generated_tokens"] == levels["L2"]["generated_tokens"] == cap
    ratio = levels["L2"]["step_s"] / levels["L1"]["step_s"]
    assert report["ratio_l2_over_l1"]["hf"] == pytest.approx(ratio) == levels["ratio_l2_over_l1"]
    assert report["passed"] is (report["measured"] <= report["target"]["value"])
