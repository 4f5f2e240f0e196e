"""The rollout check stops a run whose engine does not sample from the policy being trained.

The transformers engine normally generates with the learner's own module (nothing to sync), so here each policy's
engine gets its own copy of the model, refreshed after every update exactly as an FSDP group's engine copies are
(``PolicyWorker._push_weights``). Then one push is dropped (a stale engine), or alice's adapter is delivered into
bob's slot (L2 routing): the next update stops with the agreement error before touching the weights. Without a
fault, the same runs train and log a tiny agreement metric.
"""

from __future__ import annotations

import json

import pytest

from pettingllms.core.errors import RolloutMismatchError
from pettingllms.entry.train import run_training
from pettingllms.runtime.worker import PolicyWorker

BASE = [
    "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
    "training.total_training_steps=3", "training.train_batch_size=2", "training.max_response_length=6",
    "training.val_freq=0", "training.export_hf=false", "training.plot=false", "training.resume=none",
    "rollout.branching=4", "optim.lr=5e-2", "optim.min_lr_ratio=1.0", "resources.use_ray=false",
    "+agents.alice.train_sampling.max_tokens=6", "+agents.bob.train_sampling.max_tokens=6",
    "+agents.alice.train_sampling.top_k=16", "+agents.bob.train_sampling.top_k=16",
]
L2 = ["specialization=L2", "base_models.policy_0.lora.rank=8", "base_models.policy_0.lora.target_modules=[q_proj,v_proj,lm_head]"]


@pytest.fixture
def engine_with_its_own_copy(monkeypatch):
    """Every engine keeps a full copy of the weights that the worker refreshes after each update."""
    original = PolicyWorker._build_engine

    def build(self, device, given=None):
        from pettingllms.models import load_model, resolve_model

        spec = self.spec
        self._engine_model = load_model(resolve_model(spec.model_path), spec.dtype, spec.lora, spec.lora_names)
        original(self, device, given)
        from pettingllms.rollout.hf_engine import HFEngine

        self.engine = HFEngine(self._engine_model, self.codec, seed=spec.seed)
        self._push_weights(trained_only=False)

    monkeypatch.setattr(PolicyWorker, "_build_engine", build)
    pushes = {"count": 0}
    return monkeypatch, pushes


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "summary.log").read_text().splitlines()]


def test_with_a_faithful_sync_the_run_trains_and_the_metric_is_tiny(engine_with_its_own_copy, tmp_path):
    trainer, _ = run_training("train", BASE + [f"training.log_dir={tmp_path}"])
    steps = [r for r in rows(trainer.run_dir) if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for row in steps:
        for policy in ("policy_0",):
            assert row[f"{policy}/actor/rollout/kl_k3"] < 1e-6 and row[f"{policy}/actor/rollout/tokens"] > 0


def test_a_skipped_weight_sync_stops_the_run_at_the_next_step(engine_with_its_own_copy, tmp_path):
    monkeypatch, pushes = engine_with_its_own_copy
    push = PolicyWorker._push_weights

    def skip_the_first_update(self, trained_only):
        if trained_only:
            pushes["count"] += 1
            if pushes["count"] == 1:
                return  # the engine keeps the pre-update weights
        push(self, trained_only)

    monkeypatch.setattr(PolicyWorker, "_push_weights", skip_the_first_update)
    with pytest.raises(RolloutMismatchError, match=r"policy 'policy_0': the rollout engine's logprobs disagree") as err:
        run_training("train", BASE + [f"training.log_dir={tmp_path}"])
    assert "weight sync" in str(err.value) and "not applied" in str(err.value)
    (run_dir,) = tmp_path.glob("default/*/*")
    assert [r["step"] for r in rows(run_dir)] == [1]  # step 1 trained; step 2 stopped before its update


def test_an_adapter_delivered_to_the_wrong_agent_stops_the_run(engine_with_its_own_copy, tmp_path):
    monkeypatch, _ = engine_with_its_own_copy

    def swapped(self, trained_only):
        """alice's trained LoRA tensors go into bob's slot and bob's into alice's."""
        swap = {".alice.": ".bob.", ".bob.": ".alice."}

        def renamed(name):
            for old, new in swap.items():
                if old in name:
                    return name.replace(old, new)
            return name

        from pettingllms.learner.weights import load_weights_into

        load_weights_into(self._engine_model, ((renamed(n), t) for n, t in self.full_weights(trained_only)))

    monkeypatch.setattr(PolicyWorker, "_push_weights", swapped)
    with pytest.raises(RolloutMismatchError, match=r"policy 'policy_0', adapter '(alice|bob)'"):
        run_training("train", BASE + L2 + [f"training.log_dir={tmp_path}"])
    (run_dir,) = tmp_path.glob("default/*/*")
    assert [r["step"] for r in rows(run_dir)] == [1]  # fresh adapters (B = 0) look alike; trained ones do not
