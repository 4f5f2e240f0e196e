"""Serving a policy from one home (``runtime/serving.py``): the model is resolved once per policy per run, in a real
tiny training run and a real evaluation of its checkpoint; a dry run's plan resolves nothing; evaluation builds
its vLLM engine as training does."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from pettingllms.entry.eval import run_eval
from pettingllms.entry.train import check_run, load_config, run_training

TINY = "tiny-random-smollm2"
TRAIN = [  # L3: two policies, each its own copy of the tiny model
    f"base_models.policy_0.path={TINY}", "specialization=L3", "env.name=toy_targets", "env.max_turns=1",
    "training.total_training_steps=1", "training.train_batch_size=2", "training.max_response_length=4",
    "training.val_freq=0", "training.export_hf=true", "training.plot=false", "training.resume=none",
    "rollout.branching=2", "resources.use_ray=false",
    "+agents.alice.train_sampling.max_tokens=4", "+agents.bob.train_sampling.max_tokens=4",
]
EVAL = ["env.name=toy_targets", "env.benchmark=[procedural]", "env.max_val_problems=2", "env.max_turns=1",
        "eval.max_tokens=4"]


@pytest.fixture
def resolutions(monkeypatch) -> list[str]:
    """The argument of every ``resolve_model`` call, wherever the function was imported."""
    from pettingllms.models import resolve

    original, calls = resolve.resolve_model, []

    def counted(spec, *args, **kwargs):
        calls.append(str(spec))
        return original(spec, *args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("pettingllms") and \
                getattr(module, "resolve_model", None) is original:
            monkeypatch.setattr(module, "resolve_model", counted)
    return calls


def test_a_training_run_and_an_eval_of_its_checkpoint_resolve_each_policys_model_once(resolutions, tmp_path):
    trainer, _ = run_training("train", TRAIN + [f"training.log_dir={tmp_path / 'train'}"])
    policies = [spec.policy for spec in trainer.plan.worker_specs]
    assert len(policies) == 2
    assert Counter(resolutions) == {TINY: len(policies)}  # learner, engine, codec, client, export: one directory

    resolutions.clear()
    result = run_eval("eval", [*EVAL, f"model.checkpoint={trainer.run_dir}", f"eval.log_dir={tmp_path / 'eval'}"],
                      print_table=False)
    assert set(result.summary["model"]["policies"]) == set(policies)
    assert Counter(resolutions) == {TINY: len(policies)}  # model, tokenizer, codec, engine: one directory


def test_a_dry_run_plans_without_resolving_any_model(resolutions):
    lines = check_run(load_config("train", TRAIN))
    assert any("policy_alice" in line for line in lines) and resolutions == []


class RecordingVLLM:
    """Stands in for ``VLLMEngine`` (not installed in this lane; tests/vllm_cpu runs the real one): records how eval
    built it and what it was given, and answers every request with failed completions."""

    built: list[dict] = []

    def __init__(self, model_path, **options) -> None:
        self.calls: list[tuple] = []
        RecordingVLLM.built.append({"model_path": str(model_path), **options, "calls": self.calls})

    def sync_weights(self, named_tensors):
        self.calls.append(("sync_weights", len(list(named_tensors))))
        return 0.0

    def add_adapter(self, name, source, *, config=None):
        self.calls.append(("add_adapter", name))

    def generate(self, requests):
        from pettingllms.core.types import FINISH_ERROR, Completion, GenerationResult

        return [GenerationResult(r.request_id, (Completion((), (), "", FINISH_ERROR),) * r.n) for r in requests]

    def close(self) -> None:
        self.calls.append(("close",))


def test_eval_builds_its_vllm_engine_as_training_does(monkeypatch, tmp_path):
    """Eval's LoRA slots are training's: a rank-4 adapter is served with max_lora_rank=8, a rank vLLM accepts (it
    refuses 4 at start-up); every agent's adapter is pushed; no sleep mode (no learner shares the GPU)."""
    import pettingllms.rollout.vllm as vllm_package

    monkeypatch.setattr(vllm_package, "VLLMEngine", RecordingVLLM)
    RecordingVLLM.built.clear()
    run_eval("eval", [*EVAL, f"base_models.policy_0.path={TINY}", "base_models.policy_0.engine=vllm",
                      "specialization=L2", "base_models.policy_0.lora.rank=4", "eval.seed=7",
                      f"eval.log_dir={tmp_path}"], print_table=False)
    (built,) = RecordingVLLM.built
    assert built["max_lora_rank"] == 8 and built["enable_lora"] is True and built["max_loras"] == 2
    assert built["seed"] == 7 and built["dtype"] == "float32" and "enable_sleep_mode" not in built
    assert sorted(c[1] for c in built["calls"] if c[0] == "add_adapter") == ["alice", "bob"]
    assert built["calls"][-1] == ("close",)


class GPUCheckingVLLM(RecordingVLLM):
    """``RecordingVLLM`` on one simulated 80 GiB GPU, refusing to start as vLLM does when the GPU's free memory is
    below ``gpu_memory_utilization`` x the whole GPU. A started engine holds its budget plus 2.08 GiB outside it
    (its process's CUDA context and libraries: the figure measured on the lent H200, docs/distributed.md)."""

    TOTAL_GIB, OUTSIDE_GIB = 80.0, 2.08
    used_gib = 0.0

    def __init__(self, model_path, **options) -> None:
        import inspect

        from pettingllms.rollout.vllm.engine import VLLMEngine

        default = inspect.signature(VLLMEngine).parameters["gpu_memory_utilization"].default
        budget = options.get("gpu_memory_utilization", default) * self.TOTAL_GIB
        free = self.TOTAL_GIB - GPUCheckingVLLM.used_gib
        if free < budget:
            raise ValueError(f"Free memory on device ({free:.2f}/{self.TOTAL_GIB} GiB) on startup is less than "
                             f"desired GPU memory utilization ({budget:.2f} GiB)")
        GPUCheckingVLLM.used_gib += budget + self.OUTSIDE_GIB
        super().__init__(model_path, **options)


def test_eval_of_an_l3_run_starts_both_vllm_engines_on_its_gpu(monkeypatch, tmp_path):
    """Eval starts every policy's engine in its one process, on the same GPU: two at vLLM's usual half of the GPU
    each would leave the second less than half free, and vLLM refuses to start it. They split that half."""
    import pettingllms.rollout.vllm as vllm_package

    monkeypatch.setattr(vllm_package, "VLLMEngine", GPUCheckingVLLM)
    RecordingVLLM.built.clear()
    GPUCheckingVLLM.used_gib = 0.0
    run_eval("eval", [*EVAL, f"base_models.policy_0.path={TINY}", "base_models.policy_0.engine=vllm",
                      "specialization=L3", f"eval.log_dir={tmp_path}"], print_table=False)
    assert [b["gpu_memory_utilization"] for b in RecordingVLLM.built] == [0.25, 0.25]
    assert all(b["calls"][-1] == ("close",) for b in RecordingVLLM.built)
