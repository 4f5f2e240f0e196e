"""A real one-step training run (tiny random model, CPU, no Ray) on an env whose team reward is NaN after
unparseable output, which is most of what a fresh model writes: it stops naming the agent, turn, problem and NaN,
or with reward.non_finite=drop it trains on the finite samples and says how many it dropped."""

from __future__ import annotations

import json
import math

import pytest
from nonfinite_support import NaNOnGarbageEnv

from pettingllms.cli import main
from pettingllms.entry.train import run_training

BASE = [
    "base_models.policy_0.path=tiny-random-smollm2",
    f"env.name={NaNOnGarbageEnv.__module__}:NaNOnGarbageEnv",
    "env.max_turns=1",
    "training.total_training_steps=1",
    "training.train_batch_size=2",
    "training.max_response_length=4",
    "training.export_hf=false",
    "training.plot=false",
    "rollout.branching=4",
    "resources.use_ray=false",
]


def test_a_nan_reward_stops_training_naming_agent_turn_problem_and_output(tmp_path, capsys):
    code = main(["train", *BASE, f"training.log_dir={tmp_path}", "training.val_before_train=false",
                 "training.val_freq=0"])
    err = capsys.readouterr().err
    assert code != 0
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert "team_reward=nan" in line and "NaNOnGarbageEnv on problem 'toy-train-" in line, line
    assert ", turn 0, agent '" in line and "after output '" in line and "reward.non_finite=drop" in line, line
    assert not list(tmp_path.glob("**/checkpoints/step_*"))  # nothing was trained on a NaN


def test_drop_trains_on_the_finite_samples_and_counts_the_dropped_ones(tmp_path):
    trainer, _ = run_training("train", [*BASE, f"training.log_dir={tmp_path}", "reward.non_finite=drop",
                                        "training.save_samples_freq=1", "training.val_freq=1",
                                        "env.max_val_problems=2", "rollout.val_samples=2"])
    run = trainer.run_dir
    rows = {r["step"]: r for r in map(json.loads, (run / "summary.log").read_text().splitlines())}
    step = rows[1]
    assert all(math.isfinite(v) for v in step.values() if isinstance(v, float)), step
    dropped = step["episode/nonfinite_rewards"]
    assert dropped > 0
    assert dropped == sum(v for k, v in step.items() if k.endswith("/nonfinite_rewards") and k.count("/") == 2
                          and not k.startswith(("episode/", "val/")))  # per agent: policy_0/<agent>/...
    (val_key,) = [k for k in step if k.startswith("val/") and k.count("/") == 2 and k.endswith("/nonfinite_rewards")]
    assert step[val_key] > 0  # validation drops by the same rule: its success rate and rewards stay numbers
    step_line = next(x for x in (run / "train.log").read_text().splitlines() if "step 1/1 |" in x)
    assert f"nonfinite_rewards {dropped:.0f}" in step_line and f"{val_key} {step[val_key]:.0f}" in step_line
    assert (run / "checkpoints" / "step_000001").is_dir()

    # The GRPO groups as trained: a dropped member is out of the loss and never continued; the finite members'
    # advantages are GRPO's over the finite members alone, (r - mean) / (std + eps), unbiased std.
    groups = [json.loads(line) for line in (run / "samples" / "step_000001.jsonl").read_text().splitlines()]
    checked = 0
    for group in groups:
        members = group["candidates"]
        for c in members:
            if c["nonfinite_reward"]:
                assert not c["in_loss"] and c["advantage"] == 0.0 and not c["chosen"] and c["reward"] == 0.0
        finite = [c["reward"] for c in members if not c["nonfinite_reward"]]
        if len(finite) == len(members) or len(set(finite)) < 2:
            continue
        mean = sum(finite) / len(finite)
        std = math.sqrt(sum((r - mean) ** 2 for r in finite) / (len(finite) - 1))
        got = [c["advantage"] for c in members if not c["nonfinite_reward"]]
        assert got == pytest.approx([(r - mean) / (std + 1e-6) for r in finite])
        assert any(a != 0.0 for a in got)
        checked += 1
    assert checked, "no group mixed dropped and distinct finite rewards; the run no longer exercises this"
