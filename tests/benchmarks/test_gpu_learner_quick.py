"""``benchmarks/gpu_learner.py --quick``: the learner's half of a GPU step, run on CPU with a tiny Qwen3-1.7B replica
through the same worker, plan and sync code it measures on a GPU (FSDP over one gloo rank, LoRA adapters)."""

import json
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.bench  # ~1-2 min on 2 cores: the benchmark lane, not the default one
def test_gpu_learner_quick_runs_the_worker_update_and_streams_every_weight(tmp_path):
    sys.path.insert(0, str(BENCHMARKS))
    import gpu_learner

    assert gpu_learner.main(["--quick", "--cases", "fsdp", "lora", "--repeats", "1", "--profile", "--out-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_learner.json").read_text())
    fsdp, lora = report["samples"]
    assert fsdp["layout_sharded"] and fsdp["script"].endswith("math_L1_prompt.sh")
    assert lora["lora_adapters"] == ["reasoner", "tool"] and lora["script"].endswith("math_L2_lora.sh")
    for case in (fsdp, lora):
        assert len(case["updates"]) == 2 and all(math.isfinite(u["pg_loss"]) and math.isfinite(u["grad_norm"]) for u in case["updates"])
        assert case["tokens_per_s"] > 0 and case["profile"] is None  # on CPU: ran, nothing to rank
    # The full model's stream reaches the engine whole: every weight, once, at the tiny replica's size.
    from pettingllms.models import load_model, resolve_model

    model = load_model(resolve_model("tiny-replica-qwen3-1.7b"), "float32")
    assert fsdp["sync_gb"] * 1e9 == sum(p.numel() * 4 for p in model.parameters())
    assert lora["sync_gb"] == 0.0  # adapters go through add_adapter; the base never moves


def test_the_script_config_is_read_from_the_train_script_itself():
    sys.path.insert(0, str(BENCHMARKS))
    import gpu_learner

    assert gpu_learner.script_config(gpu_learner.SCRIPTS / "math_L2_lora.sh") == (
        "math", ["training.experiment_name=math_L2_lora", "specialization=L2"])
