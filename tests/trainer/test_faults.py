"""Faults leave a clean, resumable run: a checkpoint's temporary folder left by a stop is removed at the next start;
a full disk (real OS faults: a small tmpfs for ENOSPC, RLIMIT_FSIZE for EFBIG) says what ran out and where, keeps
the last good checkpoint and no partial folder, and the run resumes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pettingllms.entry.train import run_training
from test_kill_resume import train_process
from test_lifecycle_and_logs import TINY

HERE = Path(__file__).resolve().parent
STEPS = ["training.total_training_steps=3", "training.save_freq=1", "training.resume=auto"]

# `pettingllms train` whose step-2 checkpoint stops once the policy's state is written, its temporary folder still
# hidden: the test kills it there. argv after -c: the CLI's arguments.
HANG_IN_CHECKPOINT_2 = """
import os, sys, time
from pettingllms.runtime import checkpoints
real = checkpoints.save_worker_state
def save_then_hang(folder, *args, **kwargs):
    real(folder, *args, **kwargs)
    if any(part.startswith(".step_000002.tmp-") for part in folder.parts):
        open(os.environ["CHECKPOINT_MARKER"], "w").close()
        time.sleep(600)
checkpoints.save_worker_state = save_then_hang
from pettingllms.cli import main
sys.exit(main(sys.argv[1:]))
"""

# `pettingllms train` that may not write a file past argv[1] bytes (SIGXFSZ ignored: the write fails with EFBIG).
FILE_SIZE_LIMIT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
from pettingllms.cli import main
sys.exit(main(sys.argv[2:]))
"""


def only_run_dir(log_dir: Path) -> Path:
    (run_dir,) = log_dir.glob("default/*/*")
    return run_dir


def summary_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "summary.log").read_text().splitlines()]


def test_a_leftover_checkpoint_temp_folder_is_removed_at_the_next_start(tmp_path):
    first, _ = run_training("train", TINY + STEPS + [f"training.log_dir={tmp_path}", "training.stop_after_steps=1"])
    leftover = first.run_dir / "checkpoints" / ".step_000002.tmp-x"
    (leftover / "policies").mkdir(parents=True)
    (leftover / "policies" / "half.pt").write_bytes(b"\0" * 1000)
    resumed, _ = run_training("train", TINY + STEPS + [f"training.log_dir={tmp_path}"])
    assert resumed.run_dir == first.run_dir and resumed.step_done == 3
    assert not leftover.exists()
    assert "removed checkpoints/.step_000002.tmp-x (1,000 bytes)" in (first.run_dir / "train.log").read_text()


@pytest.mark.timeout(300)
def test_kill_9_mid_checkpoint_then_resume_is_clean(tmp_path):
    marker = tmp_path / "in-checkpoint-2"
    process = train_process(tmp_path / "logs", overrides=TINY + STEPS, launch=("-c", HANG_IN_CHECKPOINT_2),
                            env={**os.environ, "CHECKPOINT_MARKER": str(marker)})
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert process.poll() is None, f"the run ended before its step-2 checkpoint: {process.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "no step-2 checkpoint within 240 s"
        time.sleep(0.05)
    run_dir = only_run_dir(tmp_path / "logs")
    checkpoints = run_dir / "checkpoints"
    assert [p.name for p in checkpoints.glob(".step_000002.tmp-*")], "the kill must land inside the checkpoint"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)

    resumed, _ = run_training("train", TINY + STEPS + [f"training.log_dir={tmp_path / 'logs'}"])
    assert resumed.run_dir == run_dir and resumed.step_done == 3
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_000001", "step_000002", "step_000003"]
    assert summary_steps(run_dir) == [1, 2, 3]  # the killed run's step-2 line was not kept twice
    assert "removed checkpoints/.step_000002.tmp-" in (run_dir / "train.log").read_text()


# Slow lane: the full-disk test above takes the same path (an OSError mid-checkpoint, then resume).
@pytest.mark.slow
def test_a_file_size_limit_mid_checkpoint_says_file_too_large_and_the_run_resumes(tmp_path):
    first, _ = run_training("train", TINY + STEPS + [f"training.log_dir={tmp_path}", "training.stop_after_steps=1"])
    checkpoints = first.run_dir / "checkpoints"
    limited = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMIT, str(1 << 20), "train", *TINY, *STEPS,
                              f"training.log_dir={tmp_path}"], capture_output=True, text=True, timeout=300)
    error = next(line for line in limited.stderr.splitlines() if line.startswith("error: "))
    assert limited.returncode == 2, limited.stderr[-3000:]
    assert error.startswith("error: checkpoint step_000002 was not written: file too large")
    assert f"past {1 << 20:,} bytes: RLIMIT_FSIZE" in error and str(checkpoints / "step_000002") in error
    assert "the last good checkpoint, step_000001, is kept" in error
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_000001"]  # no partial folder
    assert (checkpoints / "latest").read_text() == "step_000001"
    assert "the run stopped during the checkpoint of step 2" in (first.run_dir / "train.log").read_text()

    resumed, _ = run_training("train", TINY + STEPS + [f"training.log_dir={tmp_path}"])
    assert resumed.step_done == 3 and summary_steps(first.run_dir) == [1, 2, 3]


def test_a_full_disk_mid_step_and_mid_checkpoint_says_no_space_left_and_the_run_resumes(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = 'mount -t tmpfs -o size=100m tmpfs "$1"'
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-Urm", "sh", "-c", mount, "sh", str(disk)],
                                                         capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (neither root nor user namespaces via `unshare -Urm`)")
    run = subprocess.run(["unshare", "-Urm", "sh", "-c", mount + ' && exec "$2" "$3" "$1"', "sh", str(disk),
                          sys.executable, str(HERE / "full_disk_run.py")], capture_output=True, text=True, timeout=300)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))

    assert result["first"]["error"] is None and result["first"]["latest"] == "step_000001"
    mid_step = result["mid_step"]  # the step's first write is its checkpoint: its row is logged after it
    assert mid_step["error"].startswith("DiskFullError: checkpoint step_000002 was not written: no space left on "
                                        "device while writing ")
    assert " bytes free there)" in mid_step["error"] and "step_000001, is kept" in mid_step["error"]
    assert mid_step["summary"].endswith("\n") and [json.loads(r)["step"] for r in mid_step["summary"].splitlines()] == [1]
    assert mid_step["checkpoints"] == ["latest", "step_000001"]

    mid_checkpoint = result["mid_checkpoint"]
    assert mid_checkpoint["error"].startswith("DiskFullError: checkpoint step_000002 was not written: no space left "
                                              "on device while writing ")
    assert "the partial .step_000002.tmp-" in mid_checkpoint["error"]
    assert mid_checkpoint["checkpoints"] == ["latest", "step_000001"] and mid_checkpoint["latest"] == "step_000001"
    assert "the run stopped during the checkpoint of step 2" in mid_checkpoint["train_log"]

    after = result["after"]
    assert after["error"] is None and after["latest"] == "step_000003"
    assert after["checkpoints"] == ["latest", "step_000003"]  # max_ckpt_to_keep=1; nothing hidden left over
    assert [json.loads(r)["step"] for r in after["summary"].splitlines()] == [1, 2, 3]
