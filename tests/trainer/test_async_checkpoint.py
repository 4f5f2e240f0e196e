"""``training.async_checkpoint``: a checkpoint written while training goes on is the same checkpoint. Runs with
asynchronous saves log exactly what synchronous ones do, resume exactly, publish ``latest`` only once a save is
complete (a kill -9 while one is written resumes from the one before), and a write that fails stops the run with
its cause, leaving ``latest`` on the last complete checkpoint."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pettingllms.core import DiskFullError
from pettingllms.entry.train import run_training
from test_kill_resume import latest, train_process
from test_resume_and_bad_input import BASE, comparable

ASYNC = ["training.save_freq=1", "training.async_checkpoint=true"]


def test_asynchronous_checkpoints_log_and_resume_exactly_as_synchronous_ones(tmp_path):
    sync, _ = run_training("train", BASE + ["training.save_freq=1", f"training.log_dir={tmp_path}/sync",
                                            "training.resume=none"])
    first, _ = run_training("train", BASE + ASYNC + [f"training.log_dir={tmp_path}/async", "training.resume=auto",
                                                     "training.stop_after_steps=2"])
    checkpoints = first.run_dir / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step_000002"  # waited for at the stop
    resumed, _ = run_training("train", BASE + ASYNC + [f"training.log_dir={tmp_path}/async", "training.resume=auto"])
    assert resumed.run_dir == first.run_dir
    assert comparable(resumed.run_dir) == comparable(sync.run_dir)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", *(f"step_00000{s}" for s in (1, 2, 3, 4))]
    assert (checkpoints / "latest").read_text().strip() == "step_000004"  # the last one, waited for at the end


# The shards' write starts 1.5 s late, so a kill lands while a checkpoint is being written.
SLOW_WRITES = ("-c", "import sys, time; import pettingllms.learner.state as s; write = s.write_staged; "
                     "s.write_staged = lambda *a: (time.sleep(1.5), write(*a)); "
                     "from pettingllms.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.timeout(900)
def test_a_kill_while_a_checkpoint_is_written_resumes_from_the_one_before(tmp_path):
    straight, _ = run_training("train", BASE + ASYNC + [f"training.log_dir={tmp_path}/straight",
                                                        "training.resume=none"])
    killed = tmp_path / "killed"
    process = train_process(killed, "training.resume=auto", overrides=(*BASE, *ASYNC), launch=SLOW_WRITES)
    deadline = time.monotonic() + 600
    while not (latest(killed) == "step_000002" and list(killed.glob("*/*/*/checkpoints/.step_000003.tmp-*"))):
        assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "no step-3 checkpoint in flight within 600 s"
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    (run_dir,) = killed.glob("*/*/*")
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000002"
    resumed, _ = run_training("train", BASE + ASYNC + [f"training.log_dir={killed}", "training.resume=auto"])
    assert resumed.run_dir == run_dir
    assert comparable(resumed.run_dir) == comparable(straight.run_dir)
    assert not list((run_dir / "checkpoints").glob(".step_*"))  # the unfinished folder was removed on resume


def test_a_failed_background_write_stops_the_run_and_latest_stays_on_the_last_complete_one(tmp_path, monkeypatch):
    import pettingllms.learner.state as state

    write = state.write_staged
    calls = []

    def failing(staged, directory):
        calls.append(directory)
        if len(calls) == 2:  # the step-2 checkpoint's shards
            raise OSError(28, "No space left on device")
        write(staged, directory)

    monkeypatch.setattr(state, "write_staged", failing)
    with pytest.raises(DiskFullError, match="checkpoint step_000002 was not written: no space left on device"):
        run_training("train", BASE + ASYNC + [f"training.log_dir={tmp_path}", "training.resume=none"])
    (run_dir,) = tmp_path.glob("*/*/*")
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step_000001"
    assert not list(checkpoints.glob(".step_*")) and not (checkpoints / "step_000002").exists()
    assert "checkpoint step_000002 was not written" in (run_dir / "train.log").read_text()


def test_a_rank_file_that_fails_after_a_sharded_save_started_waits_for_that_save_before_the_folder_goes(tmp_path,
                                                                                                         monkeypatch):
    """An FSDP save's upload starts before the rank's small files are written; when those fail (a full disk), the
    upload must end before the folder is removed, or it writes on, unawaited, into a folder it makes again."""
    import errno
    import threading
    from concurrent.futures import Future

    from pettingllms.runtime import checkpoints

    upload: Future = Future()

    class ShardedLearner:  # DCP's async_save: the upload runs in a thread and makes its folders as it writes
        def save_sharded_async(self, directory, group):
            def write():
                time.sleep(0.5)
                directory.mkdir(parents=True, exist_ok=True)
                (directory / "__0_0.distcp").write_bytes(b"shard")
                upload.set_result(None)

            threading.Thread(target=write).start()
            return upload, {"step": 3}

    def full_disk(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints, "_write_rank_files", full_disk)
    saving = []

    def start(folder):
        saving.append(checkpoints.start_worker_save(folder / "policies" / "p", ShardedLearner(), 0, 2, None,
                                                    process_group=object()))

    with pytest.raises(DiskFullError, match="step_000003 was not written"):
        checkpoints.begin_checkpoint(tmp_path, 3, {"step": 3}, start)
    assert upload.done() and not saving
    assert list(tmp_path.iterdir()) == []  # no hidden folder the upload made again


def test_a_stopping_run_waits_for_its_checkpoint_a_bounded_time_and_keeps_the_previous_one(tmp_path, monkeypatch,
                                                                                            caplog):
    """After a rank failed, a peer stuck in a collective holds its ``save_wait`` until nccl's or gloo's timeout: the
    stop waits at most ``STOP_SAVE_WAIT_S`` in all, then reports its error; ``latest`` does not move."""
    import logging
    import types

    from pettingllms.runtime import checkpoints
    from pettingllms.trainer import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "STOP_SAVE_WAIT_S", 1.0)
    timeouts = []

    class StuckRanks:
        def save_wait(self, timeout=None):
            timeouts.append(timeout)
            time.sleep(timeout)
            raise TimeoutError(f"1 of 2 rank call(s) did not answer within {timeout:.0f} s")

    checkpoints.save_checkpoint(tmp_path, 1, {"step": 1}, lambda folder: None)
    published = []
    stopping = types.SimpleNamespace(policies=StuckRanks(), _pending_logged=True, _publish_checkpoint=published.append,
                                     _pending_checkpoint=checkpoints.begin_checkpoint(tmp_path, 2, {"step": 2},
                                                                                      lambda folder: None))
    stopping._complete_pending_checkpoint = types.MethodType(trainer_module.Trainer._complete_pending_checkpoint,
                                                             stopping)
    started = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="pettingllms.trainer"):
        trainer_module.Trainer._settle_pending_checkpoint(stopping)
    assert time.perf_counter() - started < 3
    assert timeouts and timeouts[0] <= 1.0 and sum(timeouts) <= 1.5  # the second wait (the folder's drain) is cut
    assert "waiting up to 1 s for checkpoint step_000002" in caplog.text
    assert "was not completed (TimeoutError" in caplog.text
    assert not published and (tmp_path / "latest").read_text().strip() == "step_000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000001"]
