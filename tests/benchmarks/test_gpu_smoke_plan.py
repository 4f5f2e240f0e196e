"""benchmarks/gpu_smoke.py cannot run here (no GPU), but what it asks for must be a valid layout, and it must say
why it stops. Its runs themselves are recorded in benchmarks/results/gpu_smoke.json once a GPU is available."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.parametrize("level,policies,gpus,lora", [
    ("L1", ["policy_0"], 1.0, True),
    ("L3", ["policy_checker", "policy_solver"], 0.5, False),
])
def test_each_level_plans_vllm_with_fsdp_on_one_gpu(level, policies, gpus, lora):
    import gpu_smoke

    from pettingllms.config.load import compose, to_schema
    from pettingllms.runtime.placement import PolicyDemand, check_layout
    from pettingllms.trainer.setup import plan

    overrides = ["base_models.policy_0.path=tiny-random-smollm2", "base_models.policy_0.engine=vllm",
                 "base_models.policy_0.fsdp.enabled=true", "base_models.policy_0.fsdp.mixed_precision=true",
                 "resources.use_ray=true", *gpu_smoke.LEVEL_OVERRIDES[level]]
    specs = plan(to_schema(compose("quickstart", overrides))).worker_specs

    assert sorted(s.policy for s in specs) == policies
    assert all(s.engine == "vllm" and s.fsdp is not None and s.gpus_per_rank == gpus for s in specs)
    assert all((s.lora is not None) == lora for s in specs)
    assert sum(s.engine_options["gpu_memory_utilization"] for s in specs) < 0.9  # room for the learners
    check_layout([PolicyDemand(s.policy, s.num_ranks, s.gpus_per_rank, 1.0, s.tensor_parallel) for s in specs],
                 {"CPU": 16, "GPU": 1})  # the lent machine: one GPU, 16 cores


def test_without_a_gpu_it_stops_with_the_reason():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_smoke.py")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode != 0
    assert "needs" in run.stderr and ("GPU" in run.stderr or "vLLM" in run.stderr or "CUDA" in run.stderr)
