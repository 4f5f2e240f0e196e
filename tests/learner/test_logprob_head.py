"""The chunked LM head (``optim.logprob_chunk_tokens``) gives the dense head's log-probs, entropies, raw log-probs
and gradients, for packed tree rows, mixed temperatures, LoRA adapters and bf16 autocast, whatever the chunk size;
heads it cannot stand in for are refused at construction."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pettingllms.core.errors import ConfigError
from pettingllms.learner import PolicyLearner
from settings_support import learner_config
from test_learner_packing import tree_samples


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _mixed_temperatures(samples):
    """Tree nodes share a temperature (one agent's sampling); the loose samples differ."""
    temperatures = [0.7] * 4 + [1.0] * 4 + [1.3, 0.5]
    return [dataclasses.replace(s, temperature=t) for s, t in zip(samples, temperatures)]


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_log_probs_equal_the_dense_heads(make_model, make_sample, chunk):
    samples = _mixed_temperatures(tree_samples(make_sample))
    model = make_model(0)
    dense = PolicyLearner(model, learner_config(total_steps=1)).compute_logprobs(samples)
    chunked = PolicyLearner(model, learner_config(total_steps=1, logprob_chunk_tokens=chunk)).compute_logprobs(samples)
    for got, expected in zip(chunked, dense):
        assert len(got) == len(expected)
        assert got == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_an_update_through_the_chunked_head_gives_the_dense_gradient_and_metrics(make_model, make_sample,
                                                                               entropy_coeff):
    samples = _mixed_temperatures(tree_samples(make_sample, seed=1))
    advantages = [1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0, 1.5, -0.7]
    grads, metrics = [], []
    for chunk in (0, 5):
        model = make_model(0)
        config = learner_config(total_steps=1, logprob_chunk_tokens=chunk, entropy_coeff=entropy_coeff,
                                micro_batch_max_tokens=40)  # several micro-batches
        metrics.append(PolicyLearner(model, config).accumulate_gradients(samples, advantages))
        grads.append(_grads(model))
    assert grads[0].keys() == grads[1].keys() and "lm_head.weight" in grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6, msg=name)
    for key in ("pg_loss", "entropy"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("bfloat16", 1e-2)])
def test_lora_adapters_and_bf16_autocast(make_lora_model, make_sample, dtype, tolerance):
    """Under bf16 autocast both heads see the same bf16 logits; the gradient of a shared prompt column is summed in
    bf16 here (one entry per response) and in float32 there, so they agree to bf16's precision (2^-8 = 0.4%)."""
    samples = [dataclasses.replace(s, adapter="alice" if i % 2 else "bob", agent="alice" if i % 2 else "bob")
               for i, s in enumerate(tree_samples(make_sample, seed=2))]
    advantages = [0.5 * (-1) ** i for i in range(len(samples))]
    grads = []
    for chunk in (0, 3):
        model = make_lora_model(0)
        config = learner_config(total_steps=1, logprob_chunk_tokens=chunk, dtype=dtype)
        PolicyLearner(model, config, adapter_names=("alice", "bob")).accumulate_gradients(samples, advantages)
        grads.append(_grads(model))
    assert grads[0].keys() == grads[1].keys()
    moved = [name for name in grads[0] if grads[0][name].norm() > 0]  # LoRA A has no gradient while B is zero
    assert any("alice" in name for name in moved) and any("bob" in name for name in moved)
    for name in moved:
        error = (grads[1][name] - grads[0][name]).norm() / grads[0][name].norm()
        assert error < tolerance, (name, float(error))


def test_heads_it_cannot_stand_in_for_are_refused(make_model):
    model = make_model(0)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ConfigError, match="final_logit_softcapping=30.0.*logprob_chunk_tokens=0"):
        PolicyLearner(model, learner_config(total_steps=1, logprob_chunk_tokens=8))
    model = make_model(0)
    model.lm_head = torch.nn.Sequential(model.lm_head)
    with pytest.raises(ConfigError, match="plain nn.Linear LM head.*Sequential"):
        PolicyLearner(model, learner_config(total_steps=1, logprob_chunk_tokens=8))


def test_the_head_is_restored_after_every_forward(make_model, make_sample):
    model = make_model(0)
    PolicyLearner(model, learner_config(total_steps=1, logprob_chunk_tokens=4)).compute_logprobs(
        tree_samples(make_sample))
    assert "forward" not in vars(model.lm_head)
    assert model(torch.tensor([[1, 2, 3]])).logits.shape[-1] == model.config.vocab_size
