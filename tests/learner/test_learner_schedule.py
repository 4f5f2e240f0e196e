"""The LR follows one warmup + cosine curve over total_steps iterations and never oscillates."""

import math

import pytest

from pettingllms.learner import PolicyLearner
from settings_support import learner_config


def expected_ratio(iteration: int, warmup: int, total: int, min_ratio: float) -> float:
    # Iteration i (0-based) runs at schedule step i + 1, so the last planned iteration sits at the minimum.
    s = min(iteration + 1, total)
    if s < warmup:
        return s / warmup
    progress = (s - warmup) / max(1, total - warmup)
    return max(min_ratio, 0.5 * (1 + min_ratio) + 0.5 * (1 - min_ratio) * math.cos(math.pi * progress))


def test_lr_warms_up_then_decays_monotonically_to_the_floor_and_holds(make_model, make_samples):
    total, warmup, lr = 8, 3, 1e-3
    config = learner_config(total_steps=total, warmup_steps=warmup, lr=lr, min_lr_ratio=0.3, ppo_mini_batch_size=2)
    learner = PolicyLearner(make_model(0), config)
    samples = make_samples(6, seed=1)  # three mini-batches: three optimizer steps per iteration
    seen = []
    for step in range(total + 3):
        metrics = learner.update(samples, [1.0, -1.0] * 3)
        assert metrics["num_optimizer_steps"] == 3
        seen.append(metrics["lr"])
    expected = [lr * expected_ratio(i, warmup, total, 0.3) for i in range(total + 3)]
    assert seen == pytest.approx(expected, rel=1e-9)
    assert seen[:warmup] == sorted(seen[:warmup])  # warmup rises
    after = seen[warmup - 1 :]
    assert all(b <= a for a, b in zip(after, after[1:])), "LR must never go back up after warmup"
    assert seen[total - 1] == pytest.approx(0.3 * lr)
    assert seen[total:] == [seen[total - 1]] * 3  # past total_steps the cosine would climb; it holds instead


def test_lr_steps_once_per_iteration_with_several_adapters_and_mini_batches(make_lora_model, make_samples):
    config = learner_config(total_steps=4, lr=1e-3, min_lr_ratio=0.0, ppo_mini_batch_size=2, ppo_epochs=2)
    learner = PolicyLearner(make_lora_model(0), config, adapter_names=["alice", "bob"])
    samples = make_samples(4, seed=2, agent="alice", adapter="alice") + make_samples(
        2, seed=3, agent="bob", adapter="bob", start=4
    )
    lrs = [learner.update(samples, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0])["lr"] for _ in range(4)]
    assert lrs == pytest.approx([1e-3 * expected_ratio(i, 0, 4, 0.0) for i in range(4)])
    assert learner.lr == pytest.approx(0.0, abs=1e-12)
