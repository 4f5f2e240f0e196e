"""The real entry point on Ray: two policies (L3), each a Ray actor hosting its engine and learner."""

from __future__ import annotations

import json

import ray

from pettingllms.cli import main


def test_l3_on_ray_trains_and_stops_only_its_own_ray(tmp_path, capsys):
    assert not ray.is_initialized()
    code = main([
        "train",
        "base_models.policy_0.path=tiny-random-smollm2",
        "env.name=toy_targets",
        "specialization=L3",
        "training.total_training_steps=2",
        "training.train_batch_size=2",
        "training.max_response_length=6",
        "training.val_freq=2",
        "training.plot=false",
        "rollout.branching=2",
        "resources.use_ray=true",
        f"training.log_dir={tmp_path}",
    ])
    assert code == 0
    assert not ray.is_initialized()  # the run started Ray, so it shut its own instance down
    run_dir = next(tmp_path.glob("default/*/*"))
    rows = [json.loads(line) for line in (run_dir / "summary.log").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for policy, agent in (("policy_alice", "alice"), ("policy_bob", "bob")):
        assert rows[1][f"{policy}/actor/num_sequences"] > 0
        assert f"{policy}/{agent}/reward_mean" in rows[1]
        assert (run_dir / "hf" / policy / "config.json").is_file()
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert list((run_dir / "validate" / "step_000002").glob("*.jsonl"))
