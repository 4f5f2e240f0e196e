"""Learning tests: the real trainer on a tiny random-weight model must raise reward on the toy env.

The toy env rewards each agent for the fraction of its target character in its answer. Under L2 and L3 the two
agents have *opposite* targets ('a' vs 'b'): both can only improve if each agent's samples update that agent's
own adapter (L2) or model (L3). The public reference trained one adapter for every agent, which fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pettingllms.entry.train import run_training

STEPS = 24
COMMON = [
    "base_models.policy_0.path=tiny-random-smollm2",
    "env.name=toy_targets",
    "env.max_turns=1",
    "+env.options.threshold=2.0",  # never "solved": every step keeps a learning signal
    f"training.total_training_steps={STEPS}",
    "training.train_batch_size=4",
    "training.max_response_length=6",
    "training.val_freq=0",
    "training.export_hf=false",
    "training.plot=false",
    "training.resume=none",
    "rollout.branching=8",
    "optim.lr=1e-2",
    "optim.min_lr_ratio=1.0",
    "resources.use_ray=false",
    # A random-weight model is near-uniform over SmolLM2's 49k-token vocabulary, so a few hundred samples a
    # step would touch each token about once and nothing could be learned. top_k keeps each position's
    # candidates to the model's current favourites, which GRPO can then re-rank within a few dozen steps.
    "+agents.alice.train_sampling.max_tokens=6",
    "+agents.alice.train_sampling.top_k=16",
    "+agents.bob.train_sampling.max_tokens=6",
    "+agents.bob.train_sampling.top_k=16",
]


def reward_curve(run_dir: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "summary.log").read_text().splitlines()]
    return [r[key] for r in rows if r.get(key) is not None]


def rises(curve: list[float], margin: float) -> bool:
    head, tail = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    return tail > head + margin


def train(tmp_path, *overrides):
    trainer, _ = run_training("train", COMMON + [f"training.log_dir={tmp_path}", *overrides])
    return trainer.run_dir


@pytest.mark.slow  # 10 s; the default lane keeps the L2 test (two adapters learning opposite targets)
def test_reward_rises_l1(tmp_path):
    run = train(tmp_path, "specialization=L1", "env.agents=[alice]", "specialization=L0")
    curve = reward_curve(run, "policy_0/alice/local_reward_mean")
    assert len(curve) == STEPS
    assert rises(curve, 0.15), curve


def test_l2_agents_learn_opposite_targets_with_their_own_adapters(tmp_path):
    run = train(tmp_path, "specialization=L2", "base_models.policy_0.lora.rank=8", "optim.lr=2e-2",
                "base_models.policy_0.lora.target_modules=[q_proj,v_proj,up_proj,down_proj,lm_head]")
    alice = reward_curve(run, "policy_0/alice/local_reward_mean")
    bob = reward_curve(run, "policy_0/bob/local_reward_mean")
    assert rises(alice, 0.1), alice
    assert rises(bob, 0.1), bob


def test_l3_agents_learn_opposite_targets_with_their_own_models(tmp_path):
    run = train(tmp_path, "specialization=L3")
    alice = reward_curve(run, "policy_alice/alice/local_reward_mean")
    bob = reward_curve(run, "policy_bob/bob/local_reward_mean")
    assert rises(alice, 0.1), alice
    assert rises(bob, 0.1), bob


# Slow lane too (19 s): bf16 compute against fp32 stays in the default lane through tests/learner/test_precision.py.
@pytest.mark.slow
def test_bf16_compute_learns_like_fp32(tmp_path):
    """dtype=bfloat16 (bf16 autocast over fp32 master weights, the engine autocasting alike) raises the reward as
    float32 does; the rollout check stays quiet, so engine and learner agree in bf16 too."""
    level = ["specialization=L0", "env.agents=[alice]"]
    fp32 = reward_curve(train(tmp_path / "fp32", *level), "policy_0/alice/local_reward_mean")
    run = train(tmp_path / "bf16", *level, "base_models.policy_0.dtype=bfloat16")
    bf16 = reward_curve(run, "policy_0/alice/local_reward_mean")
    assert rises(fp32, 0.15), fp32
    assert rises(bf16, 0.15), bf16
    gain = lambda c: sum(c[-5:]) / 5 - sum(c[:5]) / 5  # noqa: E731
    assert gain(bf16) > 0.5 * gain(fp32), (fp32, bf16)
    kl = [json.loads(line).get("policy_0/actor/rollout/kl_k3") for line in (run / "summary.log").read_text().splitlines()]
    assert all(k is not None and k < 0.05 for k in kl if k is not None) and any(k is not None for k in kl)
