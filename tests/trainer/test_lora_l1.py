"""LoRA under L1: every agent shares one adapter, and generation uses the adapter being trained."""

from __future__ import annotations

from pettingllms.entry.train import run_training


def test_l1_with_lora_trains_the_shared_adapter(tmp_path):
    trainer, results = run_training("train", [
        "base_models.policy_0.path=tiny-random-smollm2",
        "base_models.policy_0.lora.rank=4",
        "env.name=toy_targets",
        "env.max_turns=1",
        "training.total_training_steps=1",
        "training.train_batch_size=1",
        "training.max_response_length=4",
        "training.val_freq=0",
        "training.plot=false",
        "rollout.branching=2",
        "resources.use_ray=false",
        f"training.log_dir={tmp_path}",
    ])
    metrics = results[0].metrics
    assert metrics["policy_0/actor/adapter/shared/num_sequences"] == 4.0  # alice's 2 + bob's 2
    assert (trainer.run_dir / "hf" / "policy_0" / "shared" / "adapter_config.json").is_file()
