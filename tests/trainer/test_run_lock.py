"""One writer per run: a second `pettingllms train` resuming a run that another process is writing is refused at
start, naming that process; a lock left by a process that died is taken over with a warning."""

from __future__ import annotations

import subprocess
import sys

from pettingllms.cli import main
from pettingllms.entry.train import run_training

TINY = ["base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
        "training.train_batch_size=2", "rollout.branching=2", "training.max_response_length=4",
        "training.val_freq=0", "training.val_before_train=false", "training.export_hf=false", "training.plot=false",
        "resources.use_ray=false", "agents.alice.train_sampling.max_tokens=4", "agents.bob.train_sampling.max_tokens=4"]


def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(tmp_path, capsys, caplog):
    common = TINY + [f"training.log_dir={tmp_path}", "training.resume=auto"]
    first, _ = run_training("train", common + ["training.total_training_steps=2", "training.stop_after_steps=1"])
    run_dir = first.run_dir
    holder = subprocess.Popen(  # another process writing the run (as a `pettingllms train` would hold it)
        [sys.executable, "-c", "import sys, time; from pettingllms.trainer.run_lock import RunLock; "
         f"RunLock.acquire({str(run_dir)!r}); print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["train", *common, "training.total_training_steps=2"]) == 2
        err = capsys.readouterr().err
        assert f"is being written by another `pettingllms train` (PID {holder.pid})" in err, err
    finally:
        holder.kill()
        holder.wait()
    # the holder died without releasing: its PID is still in the file, and the kernel dropped its lock
    assert (run_dir / ".lock").read_text().strip() == str(holder.pid)
    second, _ = run_training("train", common + ["training.total_training_steps=2"])
    assert second.run_dir == run_dir and second.step_done == 2
    assert f"taking over the lock of PID {holder.pid}, which is no longer running" in caplog.text
    assert (run_dir / ".lock").read_text() == ""  # a run that ended normally leaves no PID behind
