"""``pettingllms eval`` with ``engine=vllm``: a trained L2 checkpoint (per-agent adapters), its LoRA export, and a
trained L3 checkpoint (one full model per agent) give exactly the greedy responses of the transformers engine.

Opt-in lane: ``make test-vllm``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pettingllms.entry.eval import run_eval
from pettingllms.entry.train import run_training

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(1800)]

VLLM = ["base_models.policy_0.engine=vllm",
        "base_models.policy_0.engine_options={max_model_len:256,llm_options:{enforce_eager:true,block_size:32}}"]


def train(tiny_dir: Path, log_dir: Path, *level: str) -> Path:
    trainer, _ = run_training("train", [
        f"base_models.policy_0.path={tiny_dir}", "env.name=toy_targets", "env.max_turns=1",
        "training.total_training_steps=1", "training.train_batch_size=2", "training.max_response_length=6",
        "training.val_freq=0", "training.export_hf=true", "training.plot=false", "training.resume=none",
        "rollout.branching=2", "optim.lr=0.05", "resources.use_ray=false", f"training.log_dir={log_dir}",
        "agents.alice.train_sampling.max_tokens=6", "agents.bob.train_sampling.max_tokens=6", *level,
    ])
    return trainer.run_dir


def responses(tmp_path: Path, name: str, *overrides: str) -> list[str]:
    import json

    result = run_eval("eval", ["env.name=toy_targets", "env.benchmark=[procedural]", "env.max_val_problems=4",
                               "env.max_turns=1", "eval.max_tokens=6", f"eval.log_dir={tmp_path / name}",
                               *overrides], print_table=False)
    bench = result.summary["benchmarks"]["toy_targets/procedural"]
    assert result.summary["model"]["policies"], result.summary["model"]
    lines = (result.run_dir / bench["records"]).read_text().splitlines()
    return [step["response"] for line in lines for sample in json.loads(line)["samples"] for step in sample["steps"]]


def test_l2_checkpoint_and_adapter_export_on_vllm_equal_transformers(tiny_dir, tmp_path):
    run = train(tiny_dir, tmp_path / "l2", "specialization=L2", "base_models.policy_0.lora.rank=8",
                "base_models.policy_0.lora.alpha=16")
    hf = responses(tmp_path, "hf", f"model.checkpoint={run}")
    assert len(hf) == 8 and any(hf)
    assert responses(tmp_path, "vllm", f"model.checkpoint={run}", *VLLM) == hf
    exported = responses(tmp_path, "vllm-export", f"base_models.policy_0.path={tiny_dir}",
                         f"model.adapters={run / 'hf' / 'policy_0'}", *VLLM)
    assert exported == hf


def test_l3_checkpoint_on_vllm_equals_transformers(tiny_dir, tmp_path):
    run = train(tiny_dir, tmp_path / "l3", "specialization=L3")
    hf = responses(tmp_path, "hf", f"model.checkpoint={run}")
    assert responses(tmp_path, "vllm", f"model.checkpoint={run}", *VLLM) == hf
