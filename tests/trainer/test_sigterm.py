"""SIGTERM (a scheduler's preemption) stops a training run cleanly: exit code 143, one line saying where it stopped,
the workers and Ray shut down (no C++ stack dump from Ray's own handler), and the run resumes from its checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_sigterm_ends_the_run_with_143_and_it_resumes(tmp_path):
    args = ["base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
            "training.total_training_steps=100000", "training.train_batch_size=2", "rollout.branching=2",
            "training.max_response_length=4", "training.val_freq=0", "training.val_before_train=false",
            "training.export_hf=false", "training.plot=false", "training.save_freq=2", f"training.log_dir={tmp_path}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pettingllms.cli", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list(tmp_path.glob("default/*/*/checkpoints/latest")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert list(tmp_path.glob("default/*/*/checkpoints/latest")), "no checkpoint within 240 s"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-2000:]
    assert "stopped: SIGTERM received during" in err and "training.resume=auto continues" in err
    assert "SIGTERM received at time=" not in err, "Ray's handler ran instead of ours"
    (run_dir,) = tmp_path.glob("default/*/*")
    assert "the run stopped during" in (run_dir / "train.log").read_text()
    from pettingllms.entry.train import run_training

    done = int((run_dir / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    trainer, _ = run_training("train", [*args[:3], *args[4:], f"training.total_training_steps={done + 1}",
                                        "training.resume=auto"])
    assert trainer.run_dir == Path(run_dir) and trainer.step_done == done + 1
