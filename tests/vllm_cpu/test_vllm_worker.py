"""A policy worker with ``engine=vllm``: after an update, vLLM generates with exactly the learner's new weights.

The check is teacher forcing: vLLM's reported logprobs of its own greedy tokens must equal a transformers
forward of the *learner's* module (the one the optimiser just stepped) on those tokens, and must differ from
the logprobs before the update. That holds only if every trained tensor reached vLLM under the right name:
the full model through ``sync_weights``, each LoRA adapter through ``add_adapter`` to the adapter of the agent
that owns it (the reference sent L2 updates to the wrong adapter).

Opt-in lane: ``make test-vllm``.
"""

from __future__ import annotations

import pytest
import torch

from pettingllms.core.types import GenerationRequest, Sample, SamplingParams
from settings_support import learner_config
from pettingllms.models import LoraSpec
from pettingllms.runtime.layout import resolve_layout
from pettingllms.runtime.spec import WorkerSpec
from pettingllms.runtime.worker import PolicyWorker

from conftest import CONTEXT, LORA_RANK
from test_vllm_engine import LOGPROB_ATOL, prompts, teacher_forced_logprobs

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(1800)]

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
ENGINE_OPTIONS = {"max_model_len": CONTEXT, "llm_options": {"enforce_eager": True, "block_size": 32}}
# Large steps so one update moves greedy logprobs far beyond rounding: the test must see the new weights.
FULL_LEARNER = learner_config(total_steps=4, lr=1e-2, grad_clip=None, min_lr_ratio=1.0)
LORA_LEARNER = learner_config(total_steps=4, lr=5e-2, grad_clip=None, min_lr_ratio=1.0)


def worker_spec(model_dir, lora: bool) -> WorkerSpec:
    return WorkerSpec(
        policy="policy_0",
        model_path=str(model_dir),
        learner=LORA_LEARNER if lora else FULL_LEARNER,
        lora=LoraSpec(rank=LORA_RANK, alpha=16.0) if lora else None,
        adapters=("alice", "bob") if lora else (),
        layout=resolve_layout("policy_0", num_gpus=0, engine="vllm"),
        engine_options=dict(ENGINE_OPTIONS),
        num_threads=1,
    )


def started(spec: WorkerSpec) -> PolicyWorker:
    worker = PolicyWorker(spec)
    worker.setup()
    return worker


def samples_from(results, requests, agent: str, adapter: str | None) -> tuple[list[Sample], list[float]]:
    """One GRPO-style group per request: its completions, advantages +1 / -1 alternating."""
    samples, advantages = [], []
    for request, result in zip(requests, results):
        for branch, completion in enumerate(result.completions):
            samples.append(Sample(
                policy="policy_0", agent=agent, turn=0, group=(int(request.request_id[1:]), 0, agent),
                episode=f"{request.request_id}-{branch}", problem_id=request.request_id, branch=branch,
                prompt_ids=request.prompt_ids, response_ids=completion.token_ids,
                response_logprobs=completion.logprobs, reward=float(branch % 2), adapter=adapter,
            ))
            advantages.append(1.0 if branch % 2 else -1.0)
    return samples, advantages


def greedy_logprobs(worker: PolicyWorker, prompt, adapter: str | None):
    """vLLM's greedy tokens and their logprobs, and the learner module's logprobs of the same tokens."""
    from pettingllms.models import use_adapter

    (result,) = worker.generate([GenerationRequest("probe", tuple(prompt), 1, GREEDY, adapter)])
    completion = result.completions[0]
    with use_adapter(worker.model, adapter):
        expected = teacher_forced_logprobs(worker.model, prompt, completion.token_ids)
    return completion.token_ids, torch.tensor(completion.logprobs), expected


def train_once(worker: PolicyWorker, agent: str, adapter: str | None) -> dict:
    sampled = SamplingParams(temperature=1.0, max_tokens=6)
    requests = [GenerationRequest(f"q{i}", p, 4, sampled, adapter) for i, p in enumerate(prompts(2, seed=31))]
    samples, advantages = samples_from(worker.generate(requests), requests, agent, adapter)
    return worker.update(samples, advantages)


def test_full_model_update_reaches_vllm(tiny_dir):
    worker = started(worker_spec(tiny_dir, lora=False))
    try:
        prompt = prompts(1, seed=41)[0]
        ids, vllm_before, hf_before = greedy_logprobs(worker, prompt, None)
        assert torch.allclose(vllm_before, hf_before, atol=LOGPROB_ATOL)

        metrics = train_once(worker, "alice", None)
        assert metrics["timing/sync_s"] >= worker.engine.last_sync_seconds > 0.0  # push = the sync + bookkeeping

        _, vllm_after, hf_after = greedy_logprobs(worker, prompt, None)
        assert torch.allclose(vllm_after, hf_after, atol=LOGPROB_ATOL), (vllm_after, hf_after)
        with torch.no_grad():
            moved = teacher_forced_logprobs(worker.model, prompt, ids)
        assert (moved - hf_before).abs().max() > 100 * LOGPROB_ATOL, "the update must move the logprobs"
    finally:
        worker.engine.close()


def test_l2_update_reaches_only_the_agents_own_adapter_in_vllm(tiny_dir):
    worker = started(worker_spec(tiny_dir, lora=True))
    try:
        assert worker.engine.adapter_names == ("alice", "bob")  # fresh adapters registered at start
        prompt = prompts(1, seed=43)[0]
        alice_ids, alice_before, _ = greedy_logprobs(worker, prompt, "alice")
        bob_ids, bob_before, _ = greedy_logprobs(worker, prompt, "bob")

        metrics = train_once(worker, "alice", "alice")  # only alice's samples
        assert metrics["timing/sync_s"] > 0.0

        _, alice_vllm, alice_hf = greedy_logprobs(worker, prompt, "alice")
        bob_ids_after, bob_vllm, bob_hf = greedy_logprobs(worker, prompt, "bob")
        assert torch.allclose(alice_vllm, alice_hf, atol=LOGPROB_ATOL), (alice_vllm, alice_hf)
        assert torch.allclose(bob_vllm, bob_hf, atol=LOGPROB_ATOL)
        assert bob_ids_after == bob_ids and torch.allclose(bob_vllm, bob_before, atol=LOGPROB_ATOL), (
            "bob's adapter must not change"
        )
        from pettingllms.models import use_adapter

        with torch.no_grad(), use_adapter(worker.model, "alice"):
            moved = teacher_forced_logprobs(worker.model, prompt, alice_ids)
        assert (moved - alice_before).abs().max() > 100 * LOGPROB_ATOL, "alice's update must move her logprobs"
    finally:
        worker.engine.close()


def test_training_entry_point_runs_l2_with_the_vllm_engine(tiny_dir, tmp_path):
    """`pettingllms train` with engine=vllm: two L2 steps; every step syncs both agents' adapters."""
    import json

    from pettingllms.entry.train import run_training

    state, _ = run_training("train", [
        f"base_models.policy_0.path={tiny_dir}", "base_models.policy_0.engine=vllm",
        "base_models.policy_0.engine_options={max_model_len:256,llm_options:{enforce_eager:true,block_size:32}}",
        "base_models.policy_0.lora.rank=8", "base_models.policy_0.lora.alpha=16", "specialization=L2",
        "env.name=toy_targets", "env.max_turns=2", "rollout.branching=2", "training.train_batch_size=2",
        "training.total_training_steps=2", "training.max_response_length=6", "training.val_before_train=false",
        "training.val_freq=100", "training.export_hf=false", "training.plot=false", "training.resume=none",
        f"training.log_dir={tmp_path}", "training.logger=[]", "resources.use_ray=false", "optim.lr=1e-2",
        "+agents.alice.train_sampling.max_tokens=6", "+agents.bob.train_sampling.max_tokens=6",
    ])
    rows = [json.loads(line) for line in (state.run_dir / "summary.log").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) >= 1 and "timing/sync_s" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["timing/sync_s"] > 0.0 for r in steps)  # the vLLM engine received the adapters each step
    # The rollout check ran on vLLM's logprobs against the learner's, per adapter, and stayed under its threshold.
    for row in steps:
        for agent in ("alice", "bob"):
            assert row[f"policy_0/actor/adapter/{agent}/rollout/kl_k3"] < 0.05, row
        assert row["policy_0/actor/rollout/tokens"] > 0


def test_a_resumed_worker_gives_vllm_the_restored_weights(tiny_dir, tmp_path):
    """Resume must not leave vLLM on the checkpoint's base weights while the learner holds the trained ones."""
    worker = started(worker_spec(tiny_dir, lora=False))
    prompt = prompts(1, seed=47)[0]
    try:
        train_once(worker, "alice", None)
        trained_ids, trained, _ = greedy_logprobs(worker, prompt, None)
        worker.save(str(tmp_path / "ckpt"))
    finally:
        worker.engine.close()
    resumed = started(worker_spec(tiny_dir, lora=False))
    try:
        with torch.no_grad():
            fresh = teacher_forced_logprobs(resumed.model, prompt, trained_ids)
        assert (fresh - trained).abs().max() > 100 * LOGPROB_ATOL, "the test needs weights that differ"
        resumed.load(str(tmp_path / "ckpt"))
        restored_ids, restored, expected = greedy_logprobs(resumed, prompt, None)
        assert restored_ids == trained_ids
        assert torch.allclose(restored, expected, atol=LOGPROB_ATOL)
        assert torch.allclose(restored, trained, atol=LOGPROB_ATOL)
    finally:
        resumed.engine.close()


def test_a_full_model_pool_worker_plays_the_snapshot_in_vllm_while_the_live_policy_moves_on(tiny_dir):
    """The opponent pool of a full fine-tune (``runtime/snapshots.py``): the live policy's weights after an update,
    held by the pool worker and served into its own vLLM engine, give vLLM the logprobs of the snapshot; the next
    update moves the live policy and leaves the pool's engine where it was."""
    from pettingllms.assembly.plan import pool_worker_spec

    live = started(worker_spec(tiny_dir, lora=False))
    pool = started(pool_worker_spec(live.spec))
    try:
        assert pool.learner is None and pool.spec.snapshot_of == "policy_0"
        prompt = prompts(1, seed=53)[0]
        train_once(live, "alice", None)
        live_ids, live_logprobs, _ = greedy_logprobs(live, prompt, None)
        pool.hold_snapshot(0, live.snapshot_weights())
        pool.serve_snapshot(0)
        ids, served, expected = greedy_logprobs(pool, prompt, None)
        assert ids == live_ids and torch.allclose(served, live_logprobs, atol=LOGPROB_ATOL), (served, live_logprobs)
        assert torch.allclose(served, expected, atol=LOGPROB_ATOL)  # vLLM plays what the pool's module holds

        train_once(live, "alice", None)
        with torch.no_grad():
            moved = teacher_forced_logprobs(live.model, prompt, ids)
        assert (moved - served).abs().max() > 100 * LOGPROB_ATOL, "the second update must move the live policy"
        _, still, _ = greedy_logprobs(pool, prompt, None)
        assert torch.allclose(still, served, atol=LOGPROB_ATOL), "the pool's engine must keep the past version"
    finally:
        live.engine.close()
        pool.engine.close()
