"""The opponent pool on Ray with an FSDP2 worker group (2 gloo ranks): every rank copies its shard of each adapter
into the slot (``PolicyWorker.snapshot``), the engine serves the copies, and the run's checkpoint records the slots.
Slow lane (``make test-slow``): four minutes or so on two busy cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pettingllms.entry.train import run_training
from pettingllms.runtime import checkpoints as ckpt

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1800)
def test_fsdp_ranks_snapshot_their_shards_and_the_engine_serves_the_past_versions(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # tests/lenient_nim.py
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))  # and the Ray workers
    trainer, _ = run_training("train", [
        "base_models.policy_0.path=tiny-random-smollm2", "base_models.policy_0.num_ranks=2", "specialization=L2",
        "env.name=lenient_nim:LenientNim", "training.total_training_steps=2", "training.train_batch_size=4",
        "rollout.branching=2", "training.max_response_length=3", "training.val_freq=0", "training.plot=false",
        "training.export_hf=false", "optim.lr=1e-2", "resources.use_ray=true", "resources.num_cpus=2",
        "self_play.pool_size=1", "self_play.snapshot_every=1", "self_play.live_prob=0",
        f"training.log_dir={tmp_path}"])
    rows = {r["step"]: r for r in map(json.loads, (trainer.run_dir / "summary.log").read_text().splitlines())}
    assert rows[1]["self_play/vs_pool_share"] == 0.0 and rows[2]["self_play/vs_pool_share"] == 1.0
    assert rows[2]["self_play/pool_filled"] == 1.0
    state = ckpt.read_trainer_state(ckpt.latest_checkpoint(trainer.run_dir / "checkpoints"))
    assert state["opponent_pool"] == {"slots": [2]}


@pytest.mark.timeout(1800)
def test_fsdp_ranks_send_a_full_model_snapshot_to_the_pool_worker_which_plays_it(tmp_path, monkeypatch):
    """L1 without LoRA: both ranks all-gather the weights, rank 0's actor hands them to the ``policy_0-pool`` actor
    through the object store; the run stops after step 1 and resumes, and the actor's engine plays the restored past
    version in step 2."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    run = ["base_models.policy_0.path=tiny-random-smollm2", "base_models.policy_0.num_ranks=2", "specialization=L1",
           "env.name=lenient_nim:LenientNim", "training.total_training_steps=2", "training.train_batch_size=4",
           "rollout.branching=2", "training.max_response_length=3", "training.val_freq=0", "training.plot=false",
           "training.export_hf=false", "optim.lr=1e-2", "resources.use_ray=true", "resources.num_cpus=2",
           "self_play.pool_size=1", "self_play.snapshot_every=1", "self_play.live_prob=0",
           f"training.log_dir={tmp_path}", "training.resume=auto"]
    run_training("train", [*run, "training.stop_after_steps=1"])  # step 1 fills the slot; the checkpoint holds it
    trainer, _ = run_training("train", run)  # resumed: the pool actor's slots are loaded and checked, then played
    rows = {r["step"]: r for r in map(json.loads, (trainer.run_dir / "summary.log").read_text().splitlines())}
    assert rows[1]["self_play/vs_pool_share"] == 0.0 and rows[2]["self_play/vs_pool_share"] == 1.0
    latest = ckpt.latest_checkpoint(trainer.run_dir / "checkpoints")
    assert ckpt.read_trainer_state(latest)["opponent_pool"] == {"slots": [2]}
    held = latest / ckpt.POLICIES_DIR / "policy_0-pool" / "snapshots"
    assert json.loads((held / "slots.json").read_text()) == {"slots": [0]}
    from safetensors.torch import load_file

    from pettingllms.models import load_model
    from pettingllms.models.resolve import resolve_model

    names = {n for n, _ in load_model(resolve_model("tiny-random-smollm2"), "float32").named_parameters()}
    assert set(load_file(str(held / "slot0.safetensors"))) == names  # the whole model, gathered from both shards
