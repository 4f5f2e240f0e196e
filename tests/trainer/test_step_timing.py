"""Every step's timing/* breakdown: its parts add up to timing/step_s, on a real tiny run and by hand."""

from __future__ import annotations

import json

import pytest

from pettingllms.trainer.step_timing import BREAKDOWN_KEYS, PARTS, breakdown, slowest_update, step_line

TINY = [
    "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
    "env.max_val_problems=2", "training.train_batch_size=1", "training.max_response_length=4",
    "training.export_hf=false", "rollout.branching=2", "resources.use_ray=false",
    "training.total_training_steps=2", "training.save_freq=0", "training.val_freq=2",
    "training.val_before_train=false", "training.plot=false",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """2 steps: step 1 plain, step 2 with validation and the final checkpoint."""
    from pettingllms.entry.train import run_training

    trainer, _ = run_training("train", TINY + [f"training.log_dir={tmp_path_factory.mktemp('logs')}"])
    rows = [json.loads(line) for line in (trainer.run_dir / "summary.log").read_text().splitlines()]
    return trainer.run_dir, {row["step"]: row for row in rows}


def test_every_step_has_every_part_and_they_add_up_to_the_step(tiny_run):
    _, rows = tiny_run
    assert sorted(rows) == [1, 2]
    for step, row in rows.items():
        parts = [row[k] for k in BREAKDOWN_KEYS]
        assert all(v >= 0 for v in parts), (step, {k: row[k] for k in BREAKDOWN_KEYS})
        assert sum(parts) == pytest.approx(row["timing/step_s"], rel=0.01)
        assert row["timing/generate_s"] > 0 and row["timing/env_s"] > 0 and row["timing/update_s"] > 0
        assert row["timing/generate_s"] + row["timing/env_s"] <= row["timing/rollout_s"]


def test_checkpoint_and_validation_time_only_in_their_steps(tiny_run):
    run_dir, rows = tiny_run
    assert rows[1]["timing/checkpoint_s"] == 0.0 and rows[1]["timing/validation_s"] == 0.0
    assert rows[2]["timing/checkpoint_s"] > 0 and rows[2]["timing/validation_s"] > 0
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_000002"]


def test_the_step_line_shows_the_breakdown(tiny_run):
    run_dir, rows = tiny_run
    lines = [line for line in (run_dir / "train.log").read_text().splitlines() if "step 2/2" in line]
    assert len(lines) == 1
    assert step_line(rows[2]) in lines[0]
    assert f"{rows[2]['timing/step_s']:.1f} s (gen " in lines[0] and ", ckpt " in lines[0]


def test_curves_have_the_stacked_step_time_panel(tiny_run):
    from pettingllms.trainer.plots import STEP_TIME, plot_run

    run_dir, _ = tiny_run
    result = plot_run(run_dir)
    assert result.path.is_file()
    assert result.panels[STEP_TIME.title] == list(BREAKDOWN_KEYS)


def test_breakdown_adds_up_exactly_and_names_a_missing_part_zero():
    out = breakdown({"generate": 2.0, "env": 0.5, "update": 3.0, "checkpoint": 1.25}, 7.0)
    assert out["timing/sync_s"] == 0.0 and out["timing/validation_s"] == 0.0
    assert out["timing/other_s"] == pytest.approx(0.25)
    assert sum(out[k] for k in BREAKDOWN_KEYS) == pytest.approx(out["timing/step_s"]) == 7.0
    with pytest.raises(ValueError, match="unknown step parts \\['rollout'\\]"):
        breakdown({"rollout": 1.0}, 2.0)
    assert step_line(out) == "7.0 s (gen 2.0, env 0.5, update 3.0, sync 0.0, ckpt 1.2, val 0.0)"
    assert [label for _, label in PARTS] == ["gen", "env", "update", "sync", "ckpt", "val"]


def test_update_and_sync_come_from_the_policy_the_step_waited_for():
    # Policies update in parallel: the step waits 9 s (b), and the slowest update plus the slowest sync of two
    # different policies (5 + 8) would not fit in it.
    updates = {"a": {"timing/update_s": 5.0, "timing/sync_s": 1.0}, "b": {"timing/update_s": 1.0, "timing/sync_s": 8.0}}
    assert slowest_update(updates) == {"update": 1.0, "sync": 8.0}
    assert slowest_update({}) == {"update": 0.0, "sync": 0.0}


def test_episodes_an_error_ended_are_named_in_a_line_and_on_the_step_line(capsys):
    from pettingllms.core.types import EpisodeRecord
    from pettingllms.trainer.metrics import episode_errors, episode_metrics
    from pettingllms.trainer.progress import StepProgress

    def episode(error):
        return EpisodeRecord(episode="e", problem_id="p", turns=2, terminated=False, truncated=error is not None,
                             success=False, team_reward=0.0, agent_rewards={}, error=error)

    clean = [episode(None), episode(None)]
    assert episode_errors(clean) is None
    cut = [episode(None), episode("prompt of agent 'plan_agent' at turn 1 ... > training.max_prompt_length=512")]
    assert episode_errors(cut) == ("1 of 2 episodes ended early on an error; the first: prompt of agent 'plan_agent' "
                                   "at turn 1 ... > training.max_prompt_length=512")
    metrics = {**episode_metrics(cut), **episode_metrics(cut, prefix="val/procedural")}
    with StepProgress(total=1, done=0) as progress:
        progress.advance(1, metrics)
    line = capsys.readouterr().out
    assert "| error_ratio 0.500" in line and "val/procedural/error_ratio 0.500" in line
    with StepProgress(total=1, done=0) as progress:
        progress.advance(1, episode_metrics(clean))
    assert "error_ratio" not in capsys.readouterr().out


def test_a_streamed_run_keeps_its_parts_adding_up_and_reports_the_engines_idle_share(tmp_path):
    from pettingllms.entry.train import run_training

    trainer, _ = run_training("train", [*TINY, "training.total_training_steps=1", "training.val_freq=0",
                                        "rollout.streaming=true", "env.max_turns=2", f"training.log_dir={tmp_path}"])
    (row,) = [json.loads(line) for line in (trainer.run_dir / "summary.log").read_text().splitlines()]
    assert sum(row[k] for k in BREAKDOWN_KEYS) == pytest.approx(row["timing/step_s"], rel=0.01)
    assert all(row[k] >= 0 for k in BREAKDOWN_KEYS)
    assert row["timing/generate_s"] + row["timing/env_s"] <= row["timing/rollout_s"]
    assert 0.0 < row["timing/engine_idle_fraction"] < 1.0
