"""The rollout check on vLLM through training: a bf16 policy (fp32 master weights in the learner, vLLM holding the
bf16 copies it receives after every update) sampled at T=0.7 with top-p trains four full-model steps, and each step
the engine's raw logprobs agree with the learner's well under the default threshold.

Opt-in lane: ``make test-vllm``.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(1800)]

STEPS = 4


def test_bf16_full_model_training_on_vllm_stays_under_the_threshold(tiny_dir, tmp_path):
    from pettingllms.entry.train import run_training

    trainer, _ = run_training("train", [
        f"base_models.policy_0.path={tiny_dir}", "base_models.policy_0.engine=vllm",
        "base_models.policy_0.dtype=bfloat16",
        "base_models.policy_0.engine_options={max_model_len:256,llm_options:{enforce_eager:true,block_size:32}}",
        "specialization=L1", "env.name=toy_targets", "env.max_turns=1", "rollout.branching=4",
        "training.train_batch_size=2", f"training.total_training_steps={STEPS}", "training.max_response_length=6",
        "training.val_before_train=false", "training.val_freq=100", "training.export_hf=false", "training.plot=false",
        "training.resume=none", f"training.log_dir={tmp_path}", "training.logger=[]", "resources.use_ray=false",
        "optim.lr=1e-2",
        "+agents.alice.train_sampling={temperature:0.7,top_p:0.9,top_k:0,max_tokens:6}",
        "+agents.bob.train_sampling={temperature:0.7,top_p:0.9,top_k:0,max_tokens:6}",
    ])
    rows = [json.loads(line) for line in (trainer.run_dir / "summary.log").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) >= 1]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    figures = [(r["policy_0/actor/rollout/kl_k3"], r["policy_0/actor/rollout/logprob_abs_diff"]) for r in steps]
    print("vLLM bf16 vs learner (k3 KL, mean |dlogprob|) per step:", figures)
    for row, (k3, _) in zip(steps, figures):
        assert row["policy_0/actor/rollout/tokens"] > 0 and row["timing/sync_s"] > 0.0
        assert k3 < 0.05, figures  # the default algorithm.rollout_check.max_kl
    assert any(r["policy_0/actor/ppo_kl"] != 0.0 or r["policy_0/actor/grad_norm"] > 0 for r in steps)
