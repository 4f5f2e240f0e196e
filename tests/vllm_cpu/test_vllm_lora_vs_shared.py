"""``benchmarks/lora_vs_shared.py --quick`` with the vLLM engine: L1 and L2 train and sync their adapters."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(1800)]
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_run_measures_both_levels_with_vllm(tmp_path):
    pytest.importorskip("vllm")
    sys.path.insert(0, str(BENCHMARKS))
    import lora_vs_shared

    lora_vs_shared.main(["--quick", "--engines", "vllm", "--vllm-python", sys.executable, "--out-dir", str(tmp_path)])
    report = json.loads((tmp_path / "lora_vs_shared.json").read_text())
    assert report["engines_skipped"] == []
    for level in ("L1", "L2"):
        figures = report["medians"]["vllm"][level]
        assert figures["sync_s"] > 0  # vLLM holds its own adapters: every update pushes them
        assert figures["generate_s"] > 0 and figures["update_s"] > 0
    assert report["ratio_l2_over_l1"]["vllm"] > 0
