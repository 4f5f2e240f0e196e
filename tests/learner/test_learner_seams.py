"""The learner along its seams: the forward pass, the rollout check and the saved state each work on their own,
and nothing below ``PolicyLearner`` knows it (``learner/state.py`` once imported it to read its fields)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from pettingllms.algo.verl_adapter import cosine_schedule_with_warmup, fixed_kl_controller
from pettingllms.core.errors import RolloutMismatchError
from pettingllms.learner import PolicyLearner
from settings_support import learner_config
from pettingllms.learner.data_parallel import SINGLE_PROCESS
from pettingllms.learner.forward import ForwardPass
from pettingllms.learner.rollout_check import RolloutAgreement, RolloutCheck
from pettingllms.learner.state import StateView, restore, snapshot
from pettingllms.learner.streams import Streams

LEARNER_PACKAGE = Path(__file__).resolve().parents[2] / "pettingllms" / "learner"


def test_no_module_below_the_learner_imports_it():
    """``PolicyLearner`` is the top of its package: its parts take what they need as arguments (state.py a
    ``StateView``), so none imports ``learner.learner``, not even for type hints."""
    importers = []
    for path in sorted(LEARNER_PACKAGE.glob("*.py")):
        if path.name in ("__init__.py", "learner.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "pettingllms.learner.learner":
                importers.append(path.name)
    assert importers == []


def test_the_forward_pass_alone_gives_a_plain_forwards_log_probs(make_model, make_sample):
    model = make_model(0)
    forward = ForwardPass(model, learner_config(total_steps=1), Streams(()), None, pad_token_id=0,
                          data_parallel=SINGLE_PROCESS)
    prompt = [5, 6, 7, 8]
    samples = [make_sample(prompt, [9, 10, 11], index=0), make_sample(prompt, [12, 13], index=1),
               make_sample([3, 4], [20, 21, 22, 23], index=2, temperature=0.5)]
    got = forward.log_probs_no_grad(samples, {None: [0, 1, 2]})
    model.eval()
    for index, sample in enumerate(samples):
        ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(sample.prompt_ids) - 1:-1] / sample.temperature
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(sample.response_ids)[:, None])[:, 0]
        assert torch.allclose(got[index], expected, atol=1e-5), index


def _agreement(shift: float) -> RolloutAgreement:
    agreement = RolloutAgreement()
    learner = torch.full((2, 3), -1.0)
    agreement.add("bob", learner, learner - shift, torch.ones(2, 3))
    return agreement


def test_the_rollout_check_alone_stops_a_mismatch_naming_policy_and_adapter():
    check = RolloutCheck(0.05, SINGLE_PROCESS, ("alice", "bob"), "policy_0")
    check(_agreement(0.1))  # k3 ~ 0.005: within the limit
    with pytest.raises(RolloutMismatchError, match=r"policy 'policy_0', adapter 'bob': .* on the same 6 tokens"):
        check(_agreement(0.5))  # k3 = e^0.5 - 1.5 ~ 0.149
    RolloutCheck(0.0, SINGLE_PROCESS, ("alice", "bob"), "policy_0")(_agreement(0.5))  # 0 turns the stop off


def _parts(seed: int) -> StateView:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = cosine_schedule_with_warmup(optimizer, 1, 10, 0.3)
    return StateView(model, optimizer, scheduler, [fixed_kl_controller(0.1)], (), frozenset(), 0)


def test_state_round_trips_through_an_explicit_view_of_plain_parts():
    saved = _parts(0)
    saved.model(torch.ones(1, 3)).sum().backward()
    saved.optimizer.step()
    saved.scheduler.step()
    saved.kl_controllers[0].value = 0.25
    state = snapshot(StateView(*[getattr(saved, f) for f in ("model", "optimizer", "scheduler", "kl_controllers",
                                                              "adapter_names", "frozen")], step=7))

    fresh = _parts(1)
    assert restore(fresh, state) == 7  # the step comes back to the caller, which owns its counter
    assert all(torch.equal(a, b) for a, b in zip(saved.model.parameters(), fresh.model.parameters()))
    moments = [o.state_dict()["state"][0]["exp_avg"] for o in (saved.optimizer, fresh.optimizer)]
    assert torch.equal(*moments)
    assert fresh.scheduler.get_last_lr() == saved.scheduler.get_last_lr()
    assert fresh.kl_controllers[0].value == 0.25


def test_a_learner_resumes_its_step_through_its_own_view(make_model, make_samples):
    samples = make_samples(4, seed=3)
    learner = PolicyLearner(make_model(0), learner_config(total_steps=4, lr=1e-2))
    learner.update(samples, [1.0, -1.0, 0.5, -0.5])
    resumed = PolicyLearner(make_model(1), learner_config(total_steps=4, lr=1e-2))
    resumed.load_state_dict(learner.state_dict())
    assert resumed.step == learner.step == 1 and resumed.state_view().step == 1
    assert resumed.lr == learner.lr


def test_a_resume_that_changes_the_lr_and_weight_decay_trains_with_the_new_values(make_model, make_samples):
    """docs/training.md's example: a resume with optim.lr doubled (and another weight decay) applies both from the
    resumed step, at the schedule's saved position; the saved run's values do not come back."""
    samples = make_samples(4, seed=3)
    learner = PolicyLearner(make_model(0), learner_config(total_steps=6, lr=1e-2))
    learner.update(samples, [1.0, -1.0, 0.5, -0.5])
    learner.update(samples, [1.0, -1.0, 0.5, -0.5])
    resumed = PolicyLearner(make_model(1), learner_config(total_steps=6, lr=2e-2, weight_decay=0.5))
    resumed.load_state_dict(learner.state_dict())
    assert resumed.step == 2
    assert resumed.lr == pytest.approx(2 * learner.lr)  # the new peak times the factor at step 2
    assert all(group["weight_decay"] == 0.5 for group in resumed.optimizer.param_groups)
    assert resumed.scheduler.get_last_lr() == [pytest.approx(2 * learner.lr)] * len(resumed.optimizer.param_groups)
    resumed.update(samples, [1.0, -1.0, 0.5, -0.5])
    learner.update(samples, [1.0, -1.0, 0.5, -0.5])
    assert resumed.lr == pytest.approx(2 * learner.lr)  # and the schedule goes on from there
