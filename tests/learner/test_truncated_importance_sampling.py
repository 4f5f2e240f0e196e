"""Truncated importance sampling (``algorithm.tis_cap``): each token's policy-gradient term is weighted by
min(exp((old learner logprob - engine logprob) / T), cap), both raw (temperature 1, what engines report).

Checked: the weights themselves; that they scale the gradient exactly as stated; that the learner uses its OLD policy
(the pass before the first optimiser step) and not the current one in later mini-batches; and that dividing the raw
log-ratio by T estimates the tempered ratio better than the raw log-ratio does.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from pettingllms.algo.losses import truncated_importance_weights
from pettingllms.learner import PolicyLearner
from settings_support import learner_config


def test_weights_are_capped_ratios_divided_by_the_temperature_and_one_without_an_engine_logprob():
    learner = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
    engine = torch.tensor([[-1.5, -1.0, -0.5], [-1.2, -3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    weights = truncated_importance_weights(learner, engine, mask, cap=2.0)
    expected = torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0], [math.exp(0.2), 2.0, 1.0]])
    assert torch.allclose(weights, expected, atol=1e-6)
    tempered = truncated_importance_weights(learner, engine, mask, cap=100.0, temperatures=torch.tensor([0.5, 2.0]))
    expected = torch.tensor([[math.exp(1.0), math.exp(-2.0), 1.0], [math.exp(0.1), math.exp(1.0), 1.0]])
    assert torch.allclose(tempered, expected, atol=1e-6)
    assert not weights.requires_grad


@pytest.mark.parametrize("temperature", [0.6, 1.5])
def test_dividing_the_raw_log_ratio_by_t_estimates_the_tempered_ratio_better_than_the_raw_ratio(temperature):
    """Engine and learner logits differ by small noise (bf16-like); tokens sampled from the engine at T. The exact
    tempered log-ratio needs the engine's tempered normaliser, which no engine reports."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4000, 200, generator=generator, dtype=torch.float64) * 2
    learner_logits = logits + torch.randn(logits.shape, generator=generator, dtype=torch.float64) * 0.05
    tokens = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)

    def log_prob(z, t):
        return torch.log_softmax(z / t, -1).gather(1, tokens).squeeze(1)

    exact = log_prob(learner_logits, temperature) - log_prob(logits, temperature)
    raw = log_prob(learner_logits, 1.0) - log_prob(logits, 1.0)
    ours = torch.log(truncated_importance_weights(log_prob(learner_logits, 1.0), log_prob(logits, 1.0),
                                                  torch.ones(len(tokens)), cap=1e9,
                                                  temperatures=torch.full((len(tokens),), temperature)))
    assert torch.allclose(ours.double(), raw / temperature, atol=1e-5)
    assert (ours - exact).abs().mean() < 0.8 * (raw - exact).abs().mean()


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _with_engine_logprobs(model, samples, shift: float, temperature: float):
    """Copies of ``samples`` sampled at ``temperature`` whose engine logprobs are ``model``'s raw ones - shift."""
    raw = PolicyLearner(model, learner_config(total_steps=1)).compute_logprobs(
        [dataclasses.replace(s, temperature=1.0) for s in samples])
    return [dataclasses.replace(s, temperature=temperature, response_logprobs=tuple(v - shift for v in values))
            for s, values in zip(samples, raw)]


@pytest.mark.parametrize("temperature, shift, cap, weight", [
    (1.0, math.log(1.5), 10.0, 1.5),  # engine less confident than the learner: w = 1.5 on every token
    (1.0, math.log(1.5), 1.2, 1.2),  # capped
    (0.5, 0.1, 10.0, math.exp(0.2)),  # the raw log-ratio divided by T
])
def test_tis_scales_the_policy_gradient_by_the_capped_weight(make_model, make_samples, temperature, shift, cap,
                                                             weight):
    samples = _with_engine_logprobs(make_model(0), make_samples(6, seed=2), shift, temperature)
    advantages = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0]
    plain = PolicyLearner(make_model(0), learner_config(total_steps=1, grad_clip=None))
    plain.accumulate_gradients(samples, advantages)
    weighted = PolicyLearner(make_model(0), learner_config(total_steps=1, grad_clip=None, tis_cap=cap))
    weighted.accumulate_gradients(samples, advantages)
    expected, got = _grads(plain.model), _grads(weighted.model)
    assert sorted(expected) == sorted(got)
    for name in expected:
        scaled = weight * expected[name]
        assert float((got[name] - scaled).norm()) <= 1e-4 * float(scaled.norm()), name


def test_tis_weights_come_from_the_old_policy_in_every_mini_batch(make_model, make_samples):
    """The engine sampled from exactly the learner's initial weights, so every TIS weight is 1 and the update equals
    the one without TIS, mini-batch after mini-batch (the PPO ratio, not TIS, accounts for the policy moving)."""
    samples = _with_engine_logprobs(make_model(0), make_samples(8, seed=4), shift=0.0, temperature=1.0)
    advantages = [1.0, -1.0] * 4
    after = []
    for cap in (0.0, 5.0):
        config = learner_config(total_steps=1, lr=5e-2, ppo_mini_batch_size=2, tis_cap=cap)
        learner = PolicyLearner(make_model(0), config)
        metrics = learner.update(samples, advantages)
        assert metrics["num_optimizer_steps"] == 4.0 and metrics["ppo_kl"] != 0.0  # the policy moved in between
        after.append({n: p.detach().clone() for n, p in learner.model.named_parameters()})
    assert max(float((after[0][n] - after[1][n]).abs().max()) for n in after[0]) < 1e-6
