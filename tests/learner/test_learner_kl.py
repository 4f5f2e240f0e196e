"""KL to the reference policy: zero before any update, positive after, adaptive coefficient moves."""

import pytest

from pettingllms.learner import ADAPTERS_DISABLED, PolicyLearner
from settings_support import learner_config, kl_penalty


def test_no_reference_without_kl(make_model, make_lora_model):
    assert PolicyLearner(make_model(0), learner_config(total_steps=1)).reference is None
    lora = PolicyLearner(make_lora_model(0), learner_config(total_steps=1), adapter_names=["alice", "bob"])
    assert lora.reference is None and lora.kl_coefs == {}


@pytest.mark.parametrize("lora", [False, True], ids=["frozen-copy", "adapters-disabled"])
def test_kl_starts_at_zero_then_grows_and_the_adaptive_coef_moves(make_model, make_lora_model, make_samples, lora):
    kl = kl_penalty(coef=0.1, adaptive=True, target=1e-4, horizon=10)
    config = learner_config(total_steps=5, lr=1e-2, kl=kl)
    if lora:
        learner = PolicyLearner(make_lora_model(0), config, adapter_names=["alice"])
        samples = make_samples(4, seed=3, agent="alice", adapter="alice")
        assert learner.reference == ADAPTERS_DISABLED
    else:
        learner = PolicyLearner(make_model(0), config)
        samples = make_samples(4, seed=3)
        assert learner.reference is not learner.model
    advantages = [1.0, -1.0, 2.0, -2.0]

    first = learner.update(samples, advantages)
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # the policy is still the reference
    assert first["kl_coef"] == 0.1
    # KL below target: the controller lowers the coefficient by (1 - 0.2 * n / horizon) with n = 4 sequences.
    assert list(learner.kl_coefs.values()) == [pytest.approx(0.1 * (1 - 0.2 * 4 / 10))]

    later = [learner.update(samples, advantages) for _ in range(3)]
    assert later[-1]["kl"] > 1e-4
    assert later[-1]["kl_loss"] > 0
    assert later[-1]["kl_coef"] > later[0]["kl_coef"]  # above target now: the coefficient rises again


def test_fixed_kl_coef_stays(make_model, make_samples):
    learner = PolicyLearner(make_model(0), learner_config(total_steps=3, lr=1e-2, kl=kl_penalty(coef=0.2)))
    samples = make_samples(3, seed=4)
    for _ in range(2):
        metrics = learner.update(samples, [1.0, -1.0, 0.5])
    assert metrics["kl_coef"] == 0.2 and metrics["kl"] > 0 and learner.kl_coefs == {None: 0.2}


def test_adapters_disabled_reference_needs_lora(make_model):
    with pytest.raises(ValueError, match="needs LoRA"):
        PolicyLearner(make_model(0), learner_config(total_steps=1, kl=kl_penalty(coef=0.1)),
                      ref_model=ADAPTERS_DISABLED)
