"""benchmarks/gpu_smoke.py cannot run here (no GPU), but what it asks for must be a valid layout, and it must say
why it stops. Its runs themselves are recorded in benchmarks/results/gpu_smoke.json once a GPU is available."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.parametrize("level,policies,gpus", [
    ("L1", ["policy_0"], 1.0),
    ("L3", ["policy_reasoner", "policy_tool"], 0.5),
])
def test_each_level_runs_a_shipped_script_that_fits_one_gpu(level, policies, gpus, tmp_path):
    """On the lent machine (one GPU, 16 cores) each part runs a train script as shipped: vLLM engines, bf16, the
    GPU split over the script's policies, and the vLLM memory share leaving room for the learners."""
    import gpu_smoke
    from script_support import script_specs

    from pettingllms.runtime.engines import vllm_options
    from pettingllms.runtime.placement import check_layout

    import argparse

    args = argparse.Namespace(model="tiny-random-smollm2", steps=3, problems=16, branching=4, max_tokens=64)
    script = gpu_smoke.LEVEL_SCRIPTS[level].removeprefix("scripts/train/")
    specs = script_specs(script, {"CUDA_VISIBLE_DEVICES": "0"}, *gpu_smoke.budget_overrides(args, tmp_path))
    assert [s.policy for s in specs] == policies
    assert all(s.engine == "vllm" and s.layout.gpus == gpus and s.dtype == "bfloat16" for s in specs)
    assert sum(vllm_options(s)["gpu_memory_utilization"] for s in specs) <= 0.5  # room for the learners
    check_layout([s.layout for s in specs], {"CPU": 16, "GPU": 1}, largest_node={"CPU": 16, "GPU": 1})


def test_without_a_gpu_it_stops_with_the_reason():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_smoke.py")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode != 0
    assert "needs" in run.stderr and ("GPU" in run.stderr or "vLLM" in run.stderr or "CUDA" in run.stderr)
