"""The learner's logprobs are those of the distribution the tokens were sampled from (logits / T), in every pass,
and old and new logprobs agree exactly before the first step: the on-policy ratio is 1 at T != 1, with dropout in
the model's config."""

from __future__ import annotations

import dataclasses

import torch

from pettingllms.learner import PolicyLearner
from settings_support import learner_config


def reference_log_probs(model, sample, temperature: float) -> torch.Tensor:
    """A plain forward of prompt + response (no packing, no custom mask), log_softmax(logits / T)."""
    ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(sample.prompt_ids) - 1
    picked = logits[start:start + len(sample.response_ids)] / temperature
    return torch.log_softmax(picked, dim=-1).gather(1, torch.tensor(sample.response_ids)[:, None]).squeeze(1)


def test_learner_logprobs_are_those_of_the_tempered_distribution(make_model, make_sample):
    model = make_model(0)
    learner = PolicyLearner(model, learner_config(total_steps=1))
    samples = [make_sample([5, 6, 7, 8], [9, 10, 11], index=0, temperature=1.7),
               make_sample([5, 6, 7, 8], [12, 13], index=1, temperature=1.7),  # packed with the first
               make_sample([5, 6, 7, 8], [9, 10], index=2, temperature=0.5),  # same prompt, its own row
               make_sample([3, 4], [20, 21, 22], index=3, temperature=0.0)]  # greedy: T = 1
    got = learner.compute_logprobs(samples)
    for sample, values in zip(samples, got):
        expected = reference_log_probs(model, sample, sample.temperature or 1.0)
        assert torch.allclose(torch.tensor(values), expected, atol=1e-5), (sample.temperature, values, expected)
    assert not torch.allclose(torch.tensor(got[0]), reference_log_probs(model, samples[0], 1.0), atol=1e-3)


def test_the_ratio_is_exactly_one_before_any_step_at_t_not_1_with_dropout_configured(make_model, make_samples):
    model = make_model(0)
    model.config.attention_dropout = 0.3  # what transformers' attention layers read in train mode
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.3
    samples = [dataclasses.replace(sample, temperature=1.5) for sample in make_samples(8, seed=5)]
    # Two mini-batches: old logprobs come from a separate no-grad pass, the ratio from the training forward.
    # lr is so small that no weight moves, so every mini-batch is still "before the first step".
    config = learner_config(total_steps=1, lr=1e-30, ppo_mini_batch_size=4, grad_clip=None)
    learner = PolicyLearner(model, config)
    assert model.config.attention_dropout == 0.0 and model.model.layers[0].self_attn.attention_dropout == 0.0
    metrics = learner.update(samples, [1.0, -1.0] * 4)
    assert metrics["num_optimizer_steps"] == 2.0
    assert metrics["ppo_kl"] == 0.0 and metrics["pg_clipfrac"] == 0.0 and metrics["pg_clipfrac_lower"] == 0.0
