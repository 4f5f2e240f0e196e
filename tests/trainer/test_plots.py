"""Curves from a summary.log written by the real SummaryFile tracker with the real metric functions' keys."""

from __future__ import annotations

import json
import struct

import pytest

from pettingllms.core import DataError, EpisodeRecord, Sample
from pettingllms.trainer.metrics import episode_metrics, prefixed, sample_metrics
from pettingllms.trainer.plots import PANELS, plot_run, read_summary
from pettingllms.trainer.tracking import SummaryFile

AGENTS = {"alice": "policy_0", "bob": "policy_1"}  # L3-like: one policy per agent


def rollout_metrics(step: int, prefix: str = "") -> dict[str, float]:
    samples, episodes = [], []
    for e in range(2):
        for agent, policy in AGENTS.items():
            for turn in range(2):
                for branch in range(2):
                    samples.append(Sample(
                        policy=policy, agent=agent, turn=turn, group=(e, turn, agent), episode=f"e{e}",
                        problem_id=f"p{e}", branch=branch, prompt_ids=(1,) * 10, response_ids=(2,) * (5 + step),
                        response_logprobs=(), reward=0.1 * step + branch, chosen=branch == 1))
        episodes.append(EpisodeRecord(f"e{e}", f"p{e}", 2, e == 0, e == 1, e == 0, 1.0))
    if prefix:
        return {**episode_metrics(episodes, prefix=prefix), **prefixed(prefix, sample_metrics(samples))}
    return {**episode_metrics(episodes), **sample_metrics(samples)}


def write_run(run_dir, steps=3):
    """What Trainer.fit logs: validation at step 0, training steps, validation again at the last step."""
    summary = SummaryFile(run_dir)
    summary.log(0, rollout_metrics(0, "val/procedural"))
    for step in range(1, steps + 1):
        metrics = rollout_metrics(step)
        for policy in set(AGENTS.values()):
            metrics.update(prefixed(f"{policy}/actor", {"kl": 0.01 * step, "ppo_kl": 0.001, "pg_loss": 0.1}))
            metrics.update(prefixed(f"{policy}/grpo", {"groups": 4.0, "groups_zero_std": 1.0}))
        metrics["timing/step_s"] = 1.0
        if step == steps:
            metrics.update(rollout_metrics(step, "val/procedural"))
        summary.log(step, metrics)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_plot_draws_every_panel_per_policy_and_agent(tmp_path):
    write_run(tmp_path)
    result = plot_run(tmp_path)
    assert result.path == tmp_path / "curves.png"
    width, height = png_size(result.path)
    assert width > 300 and height > 300
    drawn = [p for p in PANELS if not p.optional]  # a run without games draws no win-rate panel
    assert list(result.panels) == [p.title for p in drawn]
    reward, success, turns, length, kl, step_time = (result.panels[p.title] for p in drawn)
    assert reward == ["policy_0/alice/reward_mean", "policy_1/bob/reward_mean",
                      "val/procedural/policy_0/alice/reward_mean", "val/procedural/policy_1/bob/reward_mean"]
    assert success == ["episode/success_rate", "val/procedural/success_rate"]
    assert turns == ["episode/turns_mean", "val/procedural/turns_mean"]
    assert length == ["policy_0/alice/response_length_mean", "policy_1/bob/response_length_mean",
                      "val/procedural/policy_0/alice/response_length_mean",
                      "val/procedural/policy_1/bob/response_length_mean"]
    assert kl == ["policy_0/actor/kl", "policy_0/actor/ppo_kl", "policy_1/actor/kl", "policy_1/actor/ppo_kl"]
    assert step_time == []  # this run logged timing/step_s but none of its parts


def test_plot_to_another_file_and_a_killed_runs_last_line(tmp_path):
    write_run(tmp_path, steps=2)
    with (tmp_path / "summary.log").open("a") as fh:
        fh.write('{"step": 3, "policy_0/alice/rew')  # the process died mid-write
    assert [r["step"] for r in read_summary(tmp_path)] == [0, 1, 2]
    result = plot_run(tmp_path, tmp_path / "out" / "c.png")
    png_size(tmp_path / "out" / "c.png")
    assert result.panels["success rate"] == ["episode/success_rate", "val/procedural/success_rate"]


def test_missing_or_empty_summary_is_a_clear_error(tmp_path):
    run = tmp_path / "exp" / "2026-01-01" / "00-00-00"
    run.mkdir(parents=True)
    with pytest.raises(DataError, match="no summary.log.*pettingllms train"):
        plot_run(run)
    (run / "summary.log").write_text("")
    with pytest.raises(DataError, match="empty"):
        plot_run(run)
    with pytest.raises(DataError, match="run directories below it.*00-00-00"):  # pointed at the experiment dir
        plot_run(tmp_path / "exp")


def test_a_games_run_draws_each_seats_win_rate(tmp_path):
    rows = [{"step": s, "episode/success_rate": 0.5, "episode/first/win_rate": 0.25 * s,
             "episode/second/win_rate": 1 - 0.25 * s, "val/procedural/first/win_rate": 0.3} for s in (1, 2)]
    (tmp_path / "summary.log").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = plot_run(tmp_path)
    assert result.panels["win rate per seat (games)"] == ["episode/first/win_rate", "episode/second/win_rate",
                                                          "val/procedural/first/win_rate"]
