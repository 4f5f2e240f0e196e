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
    ("L2", ["policy_0"], 1.0),
    ("L3", ["policy_reasoner", "policy_tool"], 0.5),
])
def test_each_level_runs_a_shipped_script_that_fits_one_gpu(level, policies, gpus, tmp_path):
    """On the lent machine (one GPU, 16 cores) each part runs a train script as shipped: vLLM engines, bf16, the
    GPU split over the script's policies, and the vLLM memory share leaving room for the learners."""
    import gpu_smoke
    from script_support import script_specs

    from pettingllms.runtime.serving import vllm_options
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


@pytest.mark.parametrize("rank,served", [(1, 1), (4, 8), (8, 8), (16, 16), (48, 64), (300, 320), (512, 512)])
def test_lora_rank_is_rounded_up_to_one_vllm_accepts(rank, served):
    from pettingllms.runtime.serving import vllm_lora_rank

    assert vllm_lora_rank(rank) == served


def test_a_lora_rank_vllm_cannot_serve_is_refused_naming_the_key():
    from pettingllms.core.errors import ConfigError
    from pettingllms.runtime.serving import vllm_lora_rank

    with pytest.raises(ConfigError, match=r"base_models.policy_0.lora.rank=1024 .* at most 512"):
        vllm_lora_rank(1024, "policy_0")


def test_the_l2_script_asks_vllm_for_an_allowed_rank(tmp_path):
    """The shipped LoRA scripts' own rank, whatever it is, reaches vLLM as a value it accepts."""
    from script_support import script_specs

    from pettingllms.runtime.serving import VLLM_LORA_RANKS, vllm_options

    for script in ("math/math_L2_lora.sh", "code/code_L2_lora.sh", "game/game_L2_lora.sh"):
        (spec,) = script_specs(script, {"CUDA_VISIBLE_DEVICES": "0"})
        options = vllm_options(spec)
        assert options["max_lora_rank"] in VLLM_LORA_RANKS and options["max_lora_rank"] >= spec.lora.rank


def test_gpu_training_does_not_seed_every_request_unless_asked():
    """Per-request seeds put vLLM's sampler on its slow row-by-row path: off on GPUs by default, on for CPU engines
    (exact resumption in the CPU lane), and an explicit engine option wins."""
    from script_support import script_specs

    from pettingllms.runtime.serving import vllm_options

    (gpu,) = script_specs("math/math_L1_prompt.sh", {"CUDA_VISIBLE_DEVICES": "0"})
    assert vllm_options(gpu)["reproducible"] is False
    (asked,) = script_specs("math/math_L1_prompt.sh", {"CUDA_VISIBLE_DEVICES": "0"},
                            "+base_models.policy_0.engine_options.reproducible=true")
    assert vllm_options(asked)["reproducible"] is True
    (cpu,) = script_specs("math/math_L1_prompt.sh", {"GPU_num": "0"}, "base_models.policy_0.engine=vllm")
    assert vllm_options(cpu)["reproducible"] is True


def test_memory_phases_are_read_from_the_step_rows():
    import gpu_smoke

    row = {"policy_0/actor/memory/after_update_device_used_gb": 41.0,
           "policy_0/actor/memory/after_release_device_used_gb": 12.5,
           "policy_0/actor/memory/after_weights_device_used_gb": 16.0,
           "policy_0/actor/memory/after_wake_device_used_gb": 60.0, "policy_0/actor/timing/sync_s": 1.0}
    assert gpu_smoke.memory_phases(row) == {"after_update": 41.0, "after_release": 12.5, "after_weights": 16.0,
                                            "after_wake": 60.0}
    assert gpu_smoke.DEFAULT_MODEL == "replica:Qwen/Qwen3-1.7B"  # the scripts' model, at full size, no hub
    assert gpu_smoke.resolve_model_arg("/models/Qwen3-1.7B", Path("/nowhere")) == "/models/Qwen3-1.7B"


def test_llm_options_reach_vllm_at_every_tp_size():
    """engine_options.llm_options (enforce_eager, max_num_seqs, ...) used to be dropped when TP was 1."""
    from script_support import script_specs

    from pettingllms.runtime.serving import vllm_options

    option = "+base_models.policy_0.engine_options={llm_options:{enforce_eager:true}}"
    (tp1,) = script_specs("math/math_L1_prompt.sh", {"CUDA_VISIBLE_DEVICES": "0"}, option)
    assert vllm_options(tp1)["llm_options"] == {"enforce_eager": True}
    (tp2,) = script_specs("math/math_L1_prompt.sh", {"CUDA_VISIBLE_DEVICES": "0,1"}, option,
                          "base_models.policy_0.tensor_parallel=2")
    assert vllm_options(tp2)["llm_options"] == {"enforce_eager": True, "distributed_executor_backend": "mp"}


def test_the_kv_cache_vllm_allocates_is_set_against_the_plan_with_the_real_model_shape(tmp_path, monkeypatch):
    """The generation part's KV cache check, on the scripts' Qwen3-1.7B (its recorded config) and the H200's size:
    the bound is 0.4 of the GPU less the bf16 weights and the start-up profile's floor (16384 tokens, 1024 rows of
    logits), over 114,688 B per token; the ratio is vLLM's allocation over it."""
    import json
    import types

    import gpu_smoke
    import torch

    from pettingllms.models.replicas import recorded_config

    (tmp_path / "config.json").write_text(json.dumps(recorded_config("Qwen/Qwen3-1.7B")))
    total = 150_109_880_320  # an H200's 139.8 GiB
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(total_memory=total))
    engine = types.SimpleNamespace(model_dir=str(tmp_path), tensor_parallel_size=1, kv_cache_tokens=400_000)
    found = gpu_smoke.kv_cache_against_plan(engine, utilization=0.4)
    weights = 1_720_574_976 * 2
    profile = 2 * 16384 * (3 * 2048 + 3 * 6144) + 2 * 1024 * 151936
    assert found["plan_bound_tokens"] == pytest.approx((0.4 * total - weights - profile) / 114_688)
    assert found["ratio"] == round(400_000 / found["plan_bound_tokens"], 4)
    engine.kv_cache_tokens = None  # a vLLM that does not say
    assert gpu_smoke.kv_cache_against_plan(engine, utilization=0.4)["ratio"] is None


@pytest.mark.parametrize("gpu_gb", [80, 141])
@pytest.mark.parametrize("level", ["L1", "L1_streaming", "L2", "L3", "L1_pool"])
def test_every_part_is_admitted_by_the_memory_plan_on_an_h100_and_an_h200(level, gpu_gb, tmp_path):
    """The parts a lent GPU runs (the shipped scripts with gpu_smoke's budget, its full-size Qwen3-1.7B replica) fit
    the memory plan of an 80 GB and a 141 GB card, so device minutes are never spent on a refusal."""
    import argparse

    import gpu_smoke
    from script_support import script_command

    from pettingllms.assembly.plan import plan
    from pettingllms.config.load import compose, to_schema

    # A replica has its hub model's recorded config: the plan reads it by the hub id, offline.
    model = gpu_smoke.part_model(level, gpu_smoke.DEFAULT_MODEL).removeprefix("replica:")
    args = argparse.Namespace(model=model, steps=2, problems=16, branching=4, max_tokens=64)
    script = gpu_smoke.LEVEL_SCRIPTS[level].removeprefix("scripts/train/")
    name, overrides = script_command(script, {"CUDA_VISIBLE_DEVICES": "0"}, *gpu_smoke.budget_overrides(args, tmp_path),
                                     *gpu_smoke.PART_OVERRIDES[level], f"resources.gpu_memory_gb={gpu_gb}")
    memory = plan(to_schema(compose(name, overrides))).memory
    assert memory is not None and memory.fits, memory.describe() if memory is not None else "no GPU plan"
