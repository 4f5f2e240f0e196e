"""A NaN/inf gradient is never skipped quietly: the step is counted and logged, and too many in a row stop the run.

Before this, ``_clip_stream`` dropped a non-finite gradient and the run went on with weights that no longer moved,
with nothing but a NaN ``grad_norm`` in the metrics.
"""

from __future__ import annotations

import logging

import pytest
import torch

from pettingllms.core.errors import NonFiniteGradientError
from pettingllms.learner import PolicyLearner
from settings_support import learner_config


class PoisonedGradient:
    """Turns one parameter's gradient into NaN while ``on`` is set (a stand-in for a kernel's NaN backward)."""

    def __init__(self, param: torch.nn.Parameter) -> None:
        self.on = True
        param.register_hook(lambda grad: grad * float("nan") if self.on else grad)


def _weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_nonfinite_steps_are_counted_logged_leave_weights_and_stop_after_the_limit(make_model, make_samples, caplog):
    model = make_model(0)
    poison = PoisonedGradient(model.model.layers[0].mlp.down_proj.weight)
    learner = PolicyLearner(model, learner_config(total_steps=10, micro_batch_max_tokens=64,
                                                 max_nonfinite_grad_steps=3), policy="policy_0")
    samples = make_samples(4, seed=1)
    advantages = [1.0, -1.0, 0.5, -0.5]
    before = _weights(model)
    with caplog.at_level(logging.WARNING, logger="pettingllms.learner"):
        for expected_streak in (1, 2):
            metrics = learner.update(samples, advantages)
            assert metrics["nonfinite_grad_steps"] == 1.0
            assert learner.nonfinite_streak == expected_streak
    warnings = [r.getMessage() for r in caplog.records if "NaN/inf" in r.getMessage()]
    assert len(warnings) == 2 and "step 1" in warnings[0] and "2 step(s) in a row" in warnings[1]
    for name, value in _weights(model).items():
        assert torch.equal(value, before[name]), f"{name} moved on a NaN gradient"

    poison.on = False  # a finite step resets the streak and trains
    metrics = learner.update(samples, advantages)
    assert metrics["nonfinite_grad_steps"] == 0.0 and learner.nonfinite_streak == 0
    assert any(not torch.equal(value, before[name]) for name, value in _weights(model).items())

    poison.on = True
    for _ in range(2):
        learner.update(samples, advantages)
    with pytest.raises(NonFiniteGradientError, match=r"optim.max_nonfinite_grad_steps=3"):
        learner.update(samples, advantages)


def test_a_resumed_learner_continues_the_streak_of_nonfinite_steps(make_model, make_samples):
    """The streak is part of the learner's state: a run resumed mid-streak stops where the uninterrupted one would."""
    model = make_model(0)
    poison = PoisonedGradient(model.model.layers[0].mlp.down_proj.weight)
    config = learner_config(total_steps=10, micro_batch_max_tokens=64, max_nonfinite_grad_steps=3)
    learner = PolicyLearner(model, config, policy="policy_0")
    samples, advantages = make_samples(4, seed=1), [1.0, -1.0, 0.5, -0.5]
    for _ in range(2):
        learner.update(samples, advantages)
    saved = learner.state_dict()
    assert saved["meta"]["nonfinite_streak"] == 2
    resumed_model = make_model(0)
    PoisonedGradient(resumed_model.model.layers[0].mlp.down_proj.weight)
    resumed = PolicyLearner(resumed_model, config, policy="policy_0")
    resumed.load_state_dict(saved)
    assert resumed.nonfinite_streak == 2
    with pytest.raises(NonFiniteGradientError, match="3 step"):  # the third in a row, as without the resume
        resumed.update(samples, advantages)
    del poison


def test_limit_zero_never_stops(make_model, make_samples):
    model = make_model(0)
    PoisonedGradient(model.model.layers[0].mlp.down_proj.weight)
    learner = PolicyLearner(model, learner_config(total_steps=10, micro_batch_max_tokens=64,
                                                 max_nonfinite_grad_steps=0))
    samples = make_samples(2, seed=2)
    for _ in range(4):
        assert learner.update(samples, [1.0, -1.0])["nonfinite_grad_steps"] == 1.0
    assert learner.nonfinite_streak == 4


def test_negative_limit_is_refused():
    with pytest.raises(ValueError, match="max_nonfinite_grad_steps"):
        learner_config(total_steps=1, max_nonfinite_grad_steps=-1)
