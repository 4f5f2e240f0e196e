"""A resume continues the same run: ``resume=auto`` never continues another task's run, and no resume loads a
checkpoint shaped for other models, levels or agents. Both refused in one line, before anything is written into the
run they would continue (a user trial once saw a second program silently continue the first one's weights, and a
changed agent list crash 15 frames deep after rewriting the old run's config.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pettingllms.cli import main
from pettingllms.core import ConfigError
from pettingllms.entry.train import run_training
from pettingllms.trainer.resume_identity import resume_refusal

CONFIG = {"specialization": "L1", "env": {"name": "program", "options": {"program": "a"}, "agents": ["x", "y"]},
          "base_models": {"policy_0": {"path": "m", "lora": {"rank": 8, "target_modules": ["q"]}}},
          "optim": {"lr": 1e-3}, "training": {"resume": "auto", "total_training_steps": 2}}


def changed(**sections) -> dict:
    out = {**CONFIG}
    for key, value in sections.items():
        out[key] = {**CONFIG[key], **value} if isinstance(value, dict) else value
    return out


def test_what_a_resume_may_change_and_what_makes_it_another_run():
    at = Path("/runs/r/checkpoints/step_000002")
    # free: the step budget, resume itself, the learning rate
    assert resume_refusal(CONFIG, changed(optim={"lr": 2e-3}, training={"resume": str(at), "total_training_steps": 9}),
                          at, auto=True) is None
    # another task: refused under auto, continued when the checkpoint is named
    task = changed(env={"options": {"program": "b"}})
    refusal = resume_refusal(CONFIG, task, at, auto=True)
    assert "a run of another task (env.options.program: 'a' -> 'b')" in refusal
    assert f"training.resume={at}" in refusal and "training.resume=none" in refusal
    assert resume_refusal(CONFIG, task, at, auto=False) is None
    # other weights' shapes: refused however the checkpoint was found
    for other in (changed(env={"agents": ["x", "z"]}), changed(specialization="L2"),
                  changed(base_models={"policy_0": {"path": "m2", "lora": CONFIG["base_models"]["policy_0"]["lora"]}}),
                  changed(base_models={"policy_0": {"path": "m", "lora": {"rank": 16, "target_modules": ["q"]}}})):
        for auto in (True, False):
            assert "holds weights, adapters and optimizer state for other" in resume_refusal(CONFIG, other, at, auto)


TINY = ["base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
        "training.total_training_steps=1", "training.train_batch_size=1", "training.max_response_length=4",
        "training.val_freq=0", "training.val_before_train=false", "training.export_hf=false", "training.plot=false",
        "rollout.branching=2", "resources.use_ray=false"]


def test_auto_resume_refuses_another_tasks_run_before_touching_it_and_a_named_checkpoint_continues(tmp_path, capsys):
    logs = f"training.log_dir={tmp_path}"
    first, _ = run_training("train", [*TINY, logs])
    config = (first.run_dir / "config.yaml").read_text()
    other_task = [*TINY, logs, "+env.options.threshold=0.5", "training.total_training_steps=2"]
    with pytest.raises(ConfigError, match=r"training.resume=auto found .*step_000001, a run of another task "
                                          r"\(env.options.threshold: \(absent\) -> 0.5\)"):
        run_training("train", other_task)
    assert (first.run_dir / "config.yaml").read_text() == config and not list(first.run_dir.glob("config.*.yaml"))
    assert main(["train", "--dry-run", *other_task]) != 0  # the dry run says so too
    assert "a run of another task" in capsys.readouterr().err
    named, _ = run_training("train", [*other_task, f"training.resume={first.run_dir / 'checkpoints' / 'step_000001'}"])
    assert named.run_dir == first.run_dir and named.step_done == 2
    # the same command again: the run is complete, so there is nothing to resume, and it is said (it used to train
    # nothing, rewrite config.yaml and exit 0)
    config = (first.run_dir / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"step 2 of a run that has trained its training.total_training_steps=2: "
                                          r"nothing is left to train"):
        run_training("train", [*other_task, f"training.resume={first.run_dir / 'checkpoints' / 'step_000002'}",
                               "optim.lr=1e-4"])
    assert (first.run_dir / "config.yaml").read_text() == config


def test_a_latest_that_names_a_missing_step_is_refused_not_trained_over_from_step_0(tmp_path):
    """A kill between the two renames of a re-written step leaves `latest` naming nothing, its only copy aside in a
    .old- folder; an auto resume used to train from step 0 inside that run (and its next start deleted the copy)."""
    from pettingllms.core import DamagedCheckpointError
    from pettingllms.trainer.run_dir import resume_point

    checkpoints = tmp_path / "exp" / "2026-12-08" / "01-00-00" / "checkpoints"
    (checkpoints / ".step_000004.old-x1" / "step_000004").mkdir(parents=True)
    (checkpoints / "latest").write_text("step_000004")
    with pytest.raises(DamagedCheckpointError, match=r"names 'step_000004', which is missing.*\.step_000004\.old-x1"):
        resume_point(tmp_path, "exp", "auto")
    assert resume_point(tmp_path, "exp", "none") is None


def test_resuming_an_earlier_checkpoint_branches_there_and_keeps_the_later_ones_aside(tmp_path):
    """`latest` stayed on the abandoned branch's step 4 until this branch's first save: a stop before it resumed step
    4, and pruning kept the old branch's higher steps over this one's."""
    from pettingllms.runtime import checkpoints as ckpt

    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        ckpt.save_checkpoint(root, step, {"step": step}, lambda folder: None)
    assert ckpt.branch_from(root / "step_000004") == []  # resume=auto: the latest, nothing moves
    moved = ckpt.branch_from(root / "step_000002")
    assert [p.name for p in moved] == ["step_000003", "step_000004"]
    assert ckpt.latest_checkpoint(root) == root / "step_000002"
    assert moved[0].parent.name.startswith("abandoned_after_step_000002_") and (moved[1] / "trainer_state.json").is_file()
    ckpt.save_checkpoint(root, 3, {"step": 3}, lambda folder: None)  # this branch's own step 3
    assert ckpt.prune_checkpoints(root, 2) == [root / "step_000001"]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == ["step_000002", "step_000003"]
    assert ckpt.remove_unfinished(root) == []  # the abandoned branch is kept, not swept as a leftover
