"""The trainer's set-up/tear-down lifecycle, train.log, checkpoint retention and W&B resume."""

from __future__ import annotations

import json
import logging
import warnings

import pytest

from pettingllms.cli import main
from pettingllms.entry.train import load_config, run_training
from pettingllms.runtime import checkpoints as ckpt
from pettingllms.assembly.run_log import STEP_LOGGER

TINY = [
    "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
    "training.train_batch_size=1", "training.max_response_length=4", "training.val_freq=0",
    "training.export_hf=false", "training.plot=false", "rollout.branching=2", "resources.use_ray=false",
]


def file_handlers() -> list[logging.Handler]:
    """Handlers writing a run's train.log, wherever they hang (pytest's own capture handlers are not ours)."""
    loggers = [logging.getLogger(), logging.getLogger("pettingllms"), logging.getLogger(STEP_LOGGER)]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.FileHandler) and h.baseFilename.endswith("train.log")]


def test_a_setup_that_fails_after_the_workers_started_releases_them(tmp_path, monkeypatch):
    from pettingllms.runtime.group import PolicyGroup

    shutdowns = []
    real_shutdown = PolicyGroup.shutdown
    monkeypatch.setattr(PolicyGroup, "shutdown", lambda self: shutdowns.append(self) or real_shutdown(self))
    # The prompt preflight now runs before the workers start (assembly/preflight.py); the executor is built after.
    def broken_executor(*args, **kwargs):
        raise RuntimeError("the executor could not be built")

    monkeypatch.setattr("pettingllms.trainer.trainer.rollout_for", broken_executor)
    before = file_handlers()
    with pytest.raises(RuntimeError, match="the executor could not be built"):
        run_training("train", TINY + [f"training.log_dir={tmp_path}"])
    assert len(shutdowns) == 1
    assert file_handlers() == before
    (run_dir,) = tmp_path.glob("default/*/*")
    record = (run_dir / "train.log").read_text()  # the stop's record, and no other traceback (e.g. from the release)
    assert record.count("Traceback") == 1 and "the run stopped during setup: RuntimeError: the executor could not be built" in record


def test_the_trainer_is_a_context_manager_that_closes_once(tmp_path):
    from pettingllms.trainer.trainer import Trainer

    cfg = load_config("train", TINY + [f"training.log_dir={tmp_path}", "training.total_training_steps=1"])
    with Trainer(cfg) as trainer:
        assert trainer.policies is not None and len(file_handlers()) == 2  # root (warnings) and the step lines
    assert trainer.policies is None and file_handlers() == []
    trainer.close()  # idempotent


def test_train_log_holds_every_step_line_and_the_warnings_the_console_keeps_the_bar(tmp_path, monkeypatch, capsys):
    from pettingllms.trainer.trainer import Trainer

    real_step = Trainer.step

    def step_with_warnings(self, step):
        warnings.warn(f"python warning at step {step}", UserWarning)
        logging.getLogger("some.library").warning("library warning at step %d", step)
        logging.getLogger("some.library").info("library info at step %d", step)  # below WARNING: not kept
        return real_step(self, step)

    monkeypatch.setattr(Trainer, "step", step_with_warnings)
    trainer, _ = run_training("train", TINY + [f"training.log_dir={tmp_path}", "training.total_training_steps=3"])
    log = (trainer.run_dir / "train.log").read_text()
    for step in (1, 2, 3):
        assert f"pettingllms.steps: step {step}/3 | reward" in log
        assert f"python warning at step {step}" in log and f"library warning at step {step}" in log
    assert "library info" not in log and "checkpoint written" in log
    console = capsys.readouterr()
    assert (console.out + console.err).count("step 2/3 | reward") == 1  # printed once, above the progress bar
    assert file_handlers() == []


def test_prune_keeps_the_newest_and_never_the_latest_pointer(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        ckpt.save_checkpoint(root, step, {"step": step}, lambda d: (d / "w").write_text("x"))
    assert ckpt.prune_checkpoints(root, 0) == [] and len(list(root.glob("step_*"))) == 4
    removed = ckpt.prune_checkpoints(root, 2)
    assert [p.name for p in removed] == ["step_000001", "step_000002"]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000003", "step_000004"]
    (root / "latest").write_text("step_000003")  # a resumed run pointing at an older step keeps it
    ckpt.save_checkpoint(root, 5, {"step": 5}, lambda d: None)
    (root / "latest").write_text("step_000003")
    ckpt.prune_checkpoints(root, 1)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000003", "step_000005"]


def test_training_keeps_max_ckpt_to_keep_checkpoints(tmp_path):
    trainer, _ = run_training("train", TINY + [f"training.log_dir={tmp_path}", "training.total_training_steps=4",
                                               "training.save_freq=1", "training.max_ckpt_to_keep=2"])
    root = trainer.run_dir / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000003", "step_000004"]
    assert ckpt.latest_checkpoint(root).name == "step_000004"


@pytest.mark.slow
def test_a_resumed_run_continues_its_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    common = TINY + [f"training.log_dir={tmp_path}", "training.total_training_steps=2", "training.resume=auto",
                     "training.logger=[console,wandb]"]
    first, _ = run_training("train", common + ["training.stop_after_steps=1"])
    run_id = (first.run_dir / "wandb_run_id").read_text().strip()
    resumed, _ = run_training("train", common)
    assert resumed.run_dir == first.run_dir and resumed.step_done == 2
    assert (resumed.run_dir / "wandb_run_id").read_text().strip() == run_id
    offline_runs = sorted(p.name for p in (first.run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2 and all(name.endswith(f"-{run_id}") for name in offline_runs)
    other, _ = run_training("train", [o for o in common if not o.startswith("training.resume")] +
                            ["training.resume=none"])
    assert (other.run_dir / "wandb_run_id").read_text().strip() != run_id  # a new run directory: a new W&B run


# Slow lane (24 s): a setup failing after the workers started releases them in the default lane.
@pytest.mark.slow
def test_a_failing_multirun_job_leaves_no_actors_placement_groups_or_log_handlers(tmp_path, capsys):
    """Job 0 fails in its worker after its Ray actor and placement group started (a LoRA target module the model
    lacks: only the model's load finds it; the prompt preflight, which failed job 0 here before, now runs before the
    workers start and in every job's check before the first trains); job 1 trains. Afterwards nothing of job 0 is
    alive (checked on a Ray instance the test owns, which the jobs join)."""
    import ray
    from ray.util import placement_group_table

    ray.init(address="local", num_cpus=2, namespace="pettingllms-test-lifecycle", include_dashboard=False,
             log_to_driver=False)
    try:
        code = main(["train", "-m", *[o for o in TINY if not o.startswith("resources.")], "resources.use_ray=true",
                     "training.total_training_steps=1", "base_models.policy_0.lora.target_modules=[no_such_module]",
                     "base_models.policy_0.lora.rank=4,0", f"training.log_dir={tmp_path}"])
        out = capsys.readouterr().out
        assert code == 1 and "2 job(s), 1 ok" in out and "no_such_module" in out
        jobs = [json.loads(line) for line in next(tmp_path.glob("multirun/*/*/jobs.jsonl")).read_text().splitlines()]
        assert [j["status"] for j in jobs] == ["failed", "ok"]
        actors = ray._private.state.actors()  # every actor this instance ever ran, with its state
        assert len(actors) == 2 and {a["State"] for a in actors.values()} == {"DEAD"}
        groups = placement_group_table()
        assert len(groups) == 2 and {g["state"] for g in groups.values()} == {"REMOVED"}
        assert file_handlers() == []
    finally:
        ray.shutdown()
