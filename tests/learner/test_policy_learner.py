"""PolicyLearner on a full (non-LoRA) tiny model: loss values, accumulation, masking, direction, routing."""

import copy

import pytest
import torch

from pettingllms.learner import PolicyLearner
from settings_support import learner_config


def _grads(model):
    return {n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()}


def _assert_same_grads(a, b, exact=False):
    assert a.keys() == b.keys()
    for name in a:
        if a[name] is None or b[name] is None:
            assert a[name] is None and b[name] is None, name
        elif exact:
            assert torch.equal(a[name], b[name]), name
        else:
            torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=name)


def test_on_policy_pg_loss_is_minus_token_mean_advantage_and_failed_samples_do_not_count(
    make_model, make_samples, make_sample
):
    samples = make_samples(5, seed=0)
    samples.append(make_sample([1, 2, 3], [4, 5, 6, 7, 8, 9], failed=True, index=9))
    advantages = [1.0, -2.0, 0.5, 0.0, 3.0, 100.0]
    learner = PolicyLearner(make_model(0), learner_config(total_steps=3, micro_batch_max_tokens=16))
    metrics = learner.update(samples, advantages)
    lengths = [len(s.response_ids) for s in samples[:5]]
    expected = -sum(a * n for a, n in zip(advantages, lengths)) / sum(lengths)
    assert metrics["pg_loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["ppo_kl"] == 0.0 and metrics["pg_clipfrac"] == 0.0  # old log-probs come from the same forward
    assert metrics["old_log_prob_s"] == 0.0  # no second pass when exactly on-policy
    assert metrics["num_tokens"] == sum(lengths) and metrics["num_sequences"] == 5
    assert metrics["num_failed_skipped"] == 1
    for key in ("entropy", "grad_norm", "lr", "update_s", "kl", "kl_coef", "pg_clipfrac_lower"):
        assert isinstance(metrics[key], float)
    assert metrics["entropy"] > 0 and metrics["grad_norm"] > 0


def test_compute_logprobs_uses_only_response_positions(make_model, make_samples):
    model = make_model(0)
    samples = make_samples(4, seed=5)
    learner = PolicyLearner(model, learner_config(total_steps=1, micro_batch_max_tokens=20))
    got = learner.compute_logprobs(samples)
    with torch.no_grad():
        for sample, values in zip(samples, got):
            ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)])
            log_probs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            p = len(sample.prompt_ids)
            expected = [log_probs[p + j - 1, t].item() for j, t in enumerate(sample.response_ids)]
            assert values == pytest.approx(expected, abs=1e-5)


def test_gradient_equals_hand_written_response_only_loss(make_model, make_samples):
    """At ratio 1 the PPO gradient is that of -sum(A * logp(response)) / N: prompt tokens play no part."""
    model = make_model(0)
    reference = copy.deepcopy(model)
    samples = make_samples(4, seed=6)
    advantages = [1.0, -0.5, 2.0, -1.5]
    learner = PolicyLearner(model, learner_config(total_steps=1, micro_batch_max_tokens=24))
    learner.accumulate_gradients(samples, advantages)

    total_tokens = sum(len(s.response_ids) for s in samples)
    loss = 0.0
    for sample, advantage in zip(samples, advantages):
        ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)])
        log_probs = torch.log_softmax(reference(ids).logits[0].float(), dim=-1)
        p = len(sample.prompt_ids)
        for j, token in enumerate(sample.response_ids):
            loss = loss - advantage * log_probs[p + j - 1, token] / total_tokens
    loss.backward()
    _assert_same_grads(_grads(model), _grads(reference))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_accumulation_equals_one_big_batch(make_model, make_samples, mode):
    samples = make_samples(7, seed=7)
    advantages = [1.0, -1.0, 0.5, 2.0, -0.3, 0.0, 1.5]
    grads = []
    for budget in (10_000, 12):  # one forward for all vs. many small micro-batches (longest sequences alone)
        model = make_model(0)
        config = learner_config(total_steps=1, loss_agg_mode=mode, micro_batch_max_tokens=budget, entropy_coeff=0.01)
        PolicyLearner(model, config).accumulate_gradients(samples, advantages)
        grads.append(_grads(model))
    _assert_same_grads(grads[0], grads[1])


def test_failed_samples_and_padding_contribute_no_gradient(make_model, make_samples, make_sample):
    good = make_samples(4, seed=8)
    failed = [
        make_sample([1, 2, 3], [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], failed=True, index=20),
        make_sample([4, 5], [], failed=True, index=21),
    ]
    base_adv = [1.0, -1.0, 0.5, -0.5]
    results = []
    for failed_adv in ([0.0, 0.0], [1e6, -1e6]):
        model = make_model(0)
        learner = PolicyLearner(model, learner_config(total_steps=1))
        learner.accumulate_gradients(good + failed, base_adv + failed_adv)
        results.append(_grads(model))
    alone = make_model(0)
    PolicyLearner(alone, learner_config(total_steps=1)).accumulate_gradients(good, base_adv)
    _assert_same_grads(results[0], results[1], exact=True)
    _assert_same_grads(results[0], _grads(alone), exact=True)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_advantage_sign_moves_the_response_log_prob(make_model, make_sample, sign):
    target = make_sample([10, 20, 30, 40], [50, 60, 70])
    learner = PolicyLearner(make_model(0), learner_config(total_steps=5, lr=1e-3))
    before = sum(learner.compute_logprobs([target])[0])
    for _ in range(3):
        learner.update([target], [sign])
    after = sum(learner.compute_logprobs([target])[0])
    assert (after - before) * sign > 0.05


def test_several_epochs_and_mini_batches_use_old_log_probs_from_one_pass(make_model, make_samples):
    samples = make_samples(6, seed=9)
    config = learner_config(total_steps=2, lr=1e-2, ppo_epochs=2, ppo_mini_batch_size=3, clip_ratio_high=0.01)
    learner = PolicyLearner(make_model(0), config)
    metrics = learner.update(samples, [2.0, -1.0, 1.0, -2.0, 0.5, 1.0])
    assert metrics["num_optimizer_steps"] == 4
    assert metrics["old_log_prob_s"] > 0
    # After the first optimizer step the policy has moved away from the old one: ratios differ from 1.
    assert metrics["ppo_kl"] != 0.0 and metrics["pg_clipfrac"] > 0


def test_gradient_checkpointing_and_bf16(make_model, make_samples):
    samples = make_samples(4, seed=10)
    advantages = [1.0, -1.0, 0.5, -0.5]
    plain, checkpointed = make_model(0), make_model(0)
    PolicyLearner(plain, learner_config(total_steps=1)).accumulate_gradients(samples, advantages)
    PolicyLearner(checkpointed, learner_config(total_steps=1, gradient_checkpointing=True)).accumulate_gradients(
        samples, advantages
    )
    _assert_same_grads(_grads(plain), _grads(checkpointed))

    learner = PolicyLearner(make_model(0), learner_config(total_steps=2, lr=1e-3, dtype="bfloat16"))
    metrics = learner.update(samples, advantages)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert next(learner.model.parameters()).dtype == torch.float32  # autocast: master weights stay fp32


def test_routing_errors_name_the_sample(make_model, make_sample):
    learner = PolicyLearner(make_model(0), learner_config(total_steps=1), policy="policy_0")
    with pytest.raises(ValueError, match="another policy"):
        learner.update([make_sample([1, 2], [3], policy="policy_1")], [1.0])
    with pytest.raises(ValueError, match="no LoRA adapters"):
        learner.update([make_sample([1, 2], [3], adapter="alice")], [1.0])
    with pytest.raises(ValueError, match="one per sample"):
        learner.update([make_sample([1, 2], [3])], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        learner.update([make_sample([1, 2], [3])], [float("nan")])


def test_frozen_agents_and_empty_batches_leave_weights_but_advance_the_schedule(make_model, make_samples):
    model = make_model(0)
    learner = PolicyLearner(model, learner_config(total_steps=4, lr=1e-3), frozen={"bob"})
    before = {n: p.clone() for n, p in model.named_parameters()}
    lr0 = learner.lr
    metrics = learner.update(make_samples(3, seed=11, agent="bob"), [1.0, -1.0, 2.0])
    assert metrics["num_frozen_skipped"] == 3 and metrics["num_sequences"] == 0
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert learner.lr < lr0 and learner.step == 1
