"""The run directory is the record of a run: train.log says why and where a run stopped (with the traceback) and
starts with the plan; config.yaml holds the config the run last started with, the earlier ones kept beside it, and
the agent -> policy (adapter) map; summary.log survives a torn last line."""

from __future__ import annotations

import inspect
import json
import logging

import pytest
import yaml

from pettingllms.cli import main
from pettingllms.core import DataError
from pettingllms.entry.train import run_training
from pettingllms.envs.toy.env import TargetsEnv
from pettingllms.assembly.run_log import attach_file_logger, detach_file_logger
from pettingllms.trainer.run_dir import truncate_summary
from test_lifecycle_and_logs import TINY


class CrashingTargets(TargetsEnv):
    """The toy env with a bug: its step raises on the second problem it sees, i.e. in the second training step
    (one problem per step; the preflight only resets)."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.seen: set[str] = set()

    def step(self, state, agent, action):
        self.seen.add(state.problem_id)
        if len(self.seen) > 1:
            raise ZeroDivisionError("the env's own bug")
        return super().step(state, agent, action)


def crash_line() -> int:
    lines, first = inspect.getsourcelines(CrashingTargets.step)
    return first + next(i for i, line in enumerate(lines) if "raise ZeroDivisionError" in line)


def test_an_env_crash_mid_run_leaves_the_traceback_and_the_step_in_train_log(tmp_path, capsys):
    code = main(["train", *TINY, f"env.name={__name__}:CrashingTargets", "training.total_training_steps=3",
                 f"training.log_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and "error: CrashingTargets.step crashed" in err
    assert "Traceback" not in err  # the console keeps its one line
    (run_dir,) = tmp_path.glob("default/*/*")
    assert f"the run's record, with the traceback: {run_dir / 'train.log'}" in err  # the one line says where to look
    record = (run_dir / "train.log").read_text()
    assert "the run stopped during step 2 (last completed step: 1): EnvError: CrashingTargets.step crashed" in record
    assert f'test_run_record.py", line {crash_line()}, in step' in record  # the env's own line
    assert "ZeroDivisionError: the env's own bug" in record


def test_a_resume_with_changed_keys_names_them_and_keeps_each_earlier_config(tmp_path):
    common = TINY + [f"training.log_dir={tmp_path}", "training.resume=auto"]
    first, _ = run_training("train", common + ["optim.lr=0.001", "training.total_training_steps=2",
                                               "training.stop_after_steps=1"])
    second, _ = run_training("train", common + ["optim.lr=0.002", "training.total_training_steps=2"])
    third, _ = run_training("train", common + ["optim.lr=0.003", "training.total_training_steps=3"])
    run_dir = first.run_dir
    assert second.run_dir == run_dir == third.run_dir and third.step_done == 3
    record = (run_dir / "train.log").read_text()
    applied = "resuming with this start's values (optimizer and schedule settings apply from step {} on)"
    assert "optim.lr: 0.001 -> 0.002; " + applied.format(2) in record
    assert "optim.lr: 0.002 -> 0.003, training.total_training_steps: 2 -> 3; " + applied.format(3) in record
    assert "the previous one is kept as config.1.yaml" in record and "kept as config.2.yaml" in record

    def lr(name: str) -> float:
        return yaml.safe_load((run_dir / name).read_text())["optim"]["lr"]

    assert (lr("config.1.yaml"), lr("config.2.yaml"), lr("config.yaml")) == (0.001, 0.002, 0.003)
    assert sorted(p.name for p in run_dir.glob("config*.yaml")) == ["config.1.yaml", "config.2.yaml", "config.yaml"]


def test_config_yaml_and_train_log_show_the_agent_policy_adapter_map_and_the_file_still_composes(tmp_path):
    from pettingllms.eval.checkpoints import read_run_config

    trainer, _ = run_training("train", TINY + [f"training.log_dir={tmp_path}", "training.total_training_steps=1",
                                               "specialization=L2", "base_models.policy_0.lora.rank=4"])
    text = (trainer.run_dir / "config.yaml").read_text()
    assert text.startswith("# the resolved plan (L2): agent -> policy (LoRA adapter)\n"
                           "# agent:    alice -> policy_0 (adapter alice), trainable\n"
                           "# agent:    bob -> policy_0 (adapter bob), trainable\n")
    assert read_run_config(trainer.run_dir).specialization == "L2"  # a comment: the file is still a config
    first_record = (trainer.run_dir / "train.log").read_text().splitlines()[0]
    assert "pettingllms.record: run plan" in first_record


def test_a_torn_last_summary_line_is_dropped_on_resume_with_a_warning(tmp_path, caplog):
    rows = [json.dumps({"step": s, "x": float(s)}) + "\n" for s in (1, 2, 3)]
    path = tmp_path / "summary.log"
    path.write_text(rows[0] + rows[1] + rows[2][:9])  # a stop while step 3 was written
    with caplog.at_level(logging.WARNING, logger="pettingllms"):
        truncate_summary(tmp_path, 2)
    assert path.read_text() == rows[0] + rows[1]
    assert f"{path}: dropping its torn last line 3" in caplog.text
    path.write_text(rows[0] + rows[1][:-1])  # the newline itself was lost: the row is whole, the next one starts anew
    truncate_summary(tmp_path, 2)
    assert path.read_text() == rows[0] + rows[1]


def test_a_damaged_summary_line_before_the_last_names_the_file_and_line(tmp_path):
    path = tmp_path / "summary.log"
    path.write_text('{"step": 1}\n{"step": 2, "x": \n{"step": 3}\n')
    with pytest.raises(DataError, match=r"summary.log line 2 is not JSON .*delete that line"):
        truncate_summary(tmp_path, 3)


def test_a_train_log_that_cannot_be_written_says_so_once(tmp_path, capsys):
    file_log = attach_file_logger(tmp_path)
    try:
        file_log.handler.stream = (tmp_path / "train.log").open("rb")  # refuses every write, as a full disk would
        for n in range(3):
            logging.getLogger("pettingllms.trainer").warning("record %d", n)
    finally:
        detach_file_logger(file_log)
    err = capsys.readouterr().err
    assert err.count(f"warning: cannot write {tmp_path / 'train.log'}") == 1 and "Logging error" not in err
