"""The learner's rollout check: engine logprobs against the learner's raw logprobs of the same tokens, per stream.

The trainer-level tests (tests/runtime/test_rollout_check.py) drop a weight sync or swap adapters; these check the
learner itself: the figures, the stop before any weight moves in both code paths (old logprobs from the training
forward, or from a separate pass when there are several mini-batches), the adapter named in the error, and the
switch that turns the stop off.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pettingllms.core.errors import PettingLLMsError, RolloutMismatchError
from pettingllms.learner import PolicyLearner
from settings_support import learner_config
from pettingllms.learner.rollout_check import RolloutAgreement


def test_agreement_figures_resolve_tiny_mismatches():
    """A uniform 1e-4 logprob drift has k3 = expm1(d) - d ~ 5e-9: measured, not rounded to 0 (float32 would)."""
    agreement = RolloutAgreement()
    learner = torch.full((2, 3), -2.0)
    engine = learner - 1e-4
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    agreement.add("alice", learner, engine, mask)
    tokens, abs_diff, k3 = agreement.of("alice")
    d = float(torch.tensor(-2.0) - (torch.tensor(-2.0) - 1e-4))  # the float32 difference actually seen
    assert tokens == 5.0
    assert abs_diff == pytest.approx(abs(d), rel=1e-9)
    assert k3 == pytest.approx(d * d / 2, rel=1e-3)
    assert agreement.of("bob") is None
    metrics = agreement.metrics(["alice", "bob"])
    assert metrics["adapter/alice/rollout/kl_k3"] == k3 and metrics["rollout/tokens"] == 5.0


def _engine_logprobs(model, samples, shift: float, adapter_names=()):
    """``samples`` with engine logprobs: ``model``'s raw logprobs of their tokens, minus ``shift``."""
    raw = PolicyLearner(model, learner_config(total_steps=1), adapter_names=adapter_names).compute_logprobs(samples)
    return [dataclasses.replace(s, response_logprobs=tuple(v - shift for v in values))
            for s, values in zip(samples, raw)]


@pytest.mark.parametrize("mini_batch_size", [0, 3], ids=["from-the-training-forward", "from-a-separate-pass"])
def test_a_mismatch_stops_the_update_before_any_weight_moves(make_model, make_samples, mini_batch_size):
    samples = _engine_logprobs(make_model(0), make_samples(6, seed=1), shift=0.5)  # k3 = e^0.5 - 1.5 ~ 0.149
    learner = PolicyLearner(make_model(0), learner_config(total_steps=2, lr=1e-2, ppo_mini_batch_size=mini_batch_size),
                            policy="policy_0")
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    with pytest.raises(RolloutMismatchError, match=r"policy 'policy_0': .* k3 KL 0\.14\d+ > .*max_kl=0\.05") as err:
        learner.update(samples, [1.0, -1.0] * 3)
    assert isinstance(err.value, PettingLLMsError)
    assert all(torch.equal(before[n], p) for n, p in learner.model.named_parameters())
    assert learner.step == 0 and all(p.grad is None for p in learner.model.parameters())


def test_matching_logprobs_train_and_report_the_figures(make_model, make_samples):
    samples = _engine_logprobs(make_model(0), make_samples(6, seed=1), shift=0.0)
    learner = PolicyLearner(make_model(0), learner_config(total_steps=2, lr=1e-2, ppo_mini_batch_size=3))
    metrics = learner.update(samples, [1.0, -1.0] * 3)
    assert metrics["rollout/tokens"] == sum(len(s.response_ids) for s in samples)
    assert metrics["rollout/kl_k3"] < 1e-12 and metrics["rollout/logprob_abs_diff"] < 1e-5


def test_the_stop_can_be_turned_off_and_the_figures_are_still_logged(make_model, make_samples):
    samples = _engine_logprobs(make_model(0), make_samples(6, seed=1), shift=0.5)
    learner = PolicyLearner(make_model(0), learner_config(total_steps=2, max_rollout_kl=0.0))
    metrics = learner.update(samples, [1.0, -1.0] * 3)
    assert metrics["rollout/logprob_abs_diff"] == pytest.approx(0.5, abs=1e-5)
    assert metrics["rollout/kl_k3"] == pytest.approx(float(torch.tensor(0.5).exp()) - 1.5, rel=1e-4)


def test_the_error_names_the_mismatched_adapter_only(make_lora_model, make_samples):
    model = make_lora_model(0)
    # Move alice's adapter away from the initial (B = 0) weights the "engine" sampled with; bob's stays put.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B.alice" in name:
                param.normal_(0, 0.5)
    engine_model = make_lora_model(0)
    alice = make_samples(4, seed=2, agent="alice", adapter="alice")
    bob = make_samples(4, seed=3, agent="bob", adapter="bob", start=4)
    samples = _engine_logprobs(engine_model, alice + bob, shift=0.0, adapter_names=("alice", "bob"))
    learner = PolicyLearner(model, learner_config(total_steps=1, max_rollout_kl=1e-4), adapter_names=("alice", "bob"),
                            policy="policy_0")
    with pytest.raises(RolloutMismatchError, match=r"policy 'policy_0', adapter 'alice'"):
        learner.update(samples, [1.0, -1.0] * 4)
    relaxed = PolicyLearner(make_lora_model(0), learner_config(total_steps=1, max_rollout_kl=0.0),
                            adapter_names=("alice", "bob"))
    with torch.no_grad():
        for (name, param), (_, source) in zip(relaxed.model.named_parameters(), model.named_parameters()):
            param.copy_(source)
    metrics = relaxed.update(samples, [1.0, -1.0] * 4)
    assert metrics["adapter/alice/rollout/kl_k3"] > 1e-3 > 1e-9 > metrics["adapter/bob/rollout/kl_k3"]
