"""Per-agent LoRA (L2): an agent's samples train only that agent's adapter.

The public reference trained a single adapter for all agents; here that is impossible by construction.
"""

import pytest
import torch

from pettingllms.learner import PolicyLearner
from settings_support import learner_config
from pettingllms.models.lora import adapter_parameters

CONFIG = dict(total_steps=5, lr=1e-3)


def _snapshot(model, name):
    return {n: p.detach().clone() for n, p in adapter_parameters(model, name)}


def _base_snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def _same(snapshot, model, name):
    current = dict(adapter_parameters(model, name))
    return all(torch.equal(value, current[n]) for n, value in snapshot.items())


def _lora_b_moved(snapshot, model, name):
    current = dict(adapter_parameters(model, name))
    return all(not torch.equal(v, current[n]) for n, v in snapshot.items() if ".lora_B." in n)


def _agent_samples(make_samples, agent, count, seed, start=0):
    return make_samples(count, seed=seed, agent=agent, adapter=agent, start=start)


def test_only_the_samples_adapter_moves(make_lora_model, make_samples):
    model = make_lora_model(0)
    learner = PolicyLearner(model, learner_config(**CONFIG), adapter_names=["alice", "bob"])
    alice0, bob0, base0 = _snapshot(model, "alice"), _snapshot(model, "bob"), _base_snapshot(model)

    metrics = learner.update(_agent_samples(make_samples, "alice", 4, 1), [1.0, -1.0, 0.5, -0.5])
    assert _lora_b_moved(alice0, model, "alice")
    assert _same(bob0, model, "bob"), "bob's adapter must be bit-identical after an alice-only update"
    assert all(torch.equal(v, dict(model.named_parameters())[n]) for n, v in base0.items())
    assert metrics["adapter/alice/num_sequences"] == 4 and metrics["adapter/bob/num_sequences"] == 0
    assert metrics["adapter/alice/grad_norm"] > 0 and metrics["adapter/bob/grad_norm"] == 0


def test_both_adapters_move_and_an_idle_adapter_gets_no_stale_momentum(make_lora_model, make_samples):
    model = make_lora_model(0)
    learner = PolicyLearner(model, learner_config(**CONFIG), adapter_names=["alice", "bob"])
    alice0, bob0 = _snapshot(model, "alice"), _snapshot(model, "bob")
    both = _agent_samples(make_samples, "alice", 3, 2) + _agent_samples(make_samples, "bob", 3, 3, start=3)
    learner.update(both, [1.0, -1.0, 0.5, 0.7, -0.2, -1.0])
    assert _lora_b_moved(alice0, model, "alice") and _lora_b_moved(bob0, model, "bob")

    # bob now has Adam momentum; a step without bob's samples must still leave bob untouched (grad None, not 0).
    bob1 = _snapshot(model, "bob")
    learner.update(_agent_samples(make_samples, "alice", 3, 4), [1.0, -1.0, 0.5])
    assert _same(bob1, model, "bob")


def test_an_agents_update_does_not_depend_on_other_agents_samples(make_lora_model, make_samples):
    alice = _agent_samples(make_samples, "alice", 4, 5)
    bob = _agent_samples(make_samples, "bob", 5, 6, start=4)
    alice_adv, bob_adv = [1.0, -1.0, 2.0, -0.5], [3.0, -3.0, 1.0, 1.0, -2.0]
    results = []
    for samples, advantages in ((alice, alice_adv), (bob[:2] + alice + bob[2:], bob_adv[:2] + alice_adv + bob_adv[2:])):
        model = make_lora_model(0)
        learner = PolicyLearner(model, learner_config(**CONFIG, ppo_mini_batch_size=2), adapter_names=["alice", "bob"])
        learner.update(samples, advantages)
        results.append(_snapshot(model, "alice"))
    for name, value in results[0].items():
        assert torch.equal(value, results[1][name]), name


def test_frozen_adapter_is_never_updated(make_lora_model, make_samples):
    model = make_lora_model(0)
    learner = PolicyLearner(model, learner_config(**CONFIG), adapter_names=["alice", "bob"], frozen={"bob"})
    bob0 = _snapshot(model, "bob")
    optimised = {id(p) for p in learner.optimizer.param_groups[0]["params"]}
    assert not any(id(q) in optimised for _, q in adapter_parameters(model, "bob"))
    both = _agent_samples(make_samples, "alice", 2, 7) + _agent_samples(make_samples, "bob", 2, 8, start=2)
    metrics = learner.update(both, [1.0, -1.0, 1.0, -1.0])
    assert metrics["num_frozen_skipped"] == 2
    assert _same(bob0, model, "bob")


def test_samples_must_name_a_known_adapter(make_lora_model, make_sample):
    learner = PolicyLearner(make_lora_model(0), learner_config(**CONFIG), adapter_names=["alice", "bob"])
    with pytest.raises(ValueError, match="has no adapter"):
        learner.update([make_sample([1, 2], [3, 4], agent="alice", adapter=None)], [1.0])
    with pytest.raises(ValueError, match="unknown adapter 'carol'"):
        learner.update([make_sample([1, 2], [3, 4], agent="carol", adapter="carol")], [1.0])
    with pytest.raises(ValueError, match="no parameters"):
        PolicyLearner(make_lora_model(0), learner_config(**CONFIG), adapter_names=["alice", "dave"])


def test_compute_logprobs_routes_through_each_adapter(make_lora_model, make_sample):
    model = make_lora_model(0)
    learner = PolicyLearner(model, learner_config(**CONFIG), adapter_names=["alice", "bob"])
    a = make_sample([5, 6, 7], [8, 9, 10], agent="alice", adapter="alice")
    b = make_sample([5, 6, 7], [8, 9, 10], agent="bob", adapter="bob")
    assert learner.compute_logprobs([a]) == learner.compute_logprobs([b])  # both start at B = 0
    for _ in range(2):
        learner.update([a], [1.0])
    after_a, after_b = learner.compute_logprobs([a, b])
    assert sum(after_a) > sum(after_b)  # only alice learned to prefer this response
