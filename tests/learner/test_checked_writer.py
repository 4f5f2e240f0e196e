"""Checkpoint shards written by several threads per rank (``safe_dcp.CheckedWriter``) without losing a write: torch's
own writer threads only print a failure, complete the save and leave the index without that thread's entries (the
bug this writer exists for, shown first); ours re-raise the thread's error as the saving thread's, and a save whose
results miss planned entries is refused. A good save loads back equal, from any number of files."""

from __future__ import annotations

import errno
import shutil
import threading
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

from pettingllms.learner.safe_dcp import WRITE_THREADS, CheckedWriter, check_dcp, load_dcp


def _state() -> dict:
    generator = torch.Generator().manual_seed(0)
    return {"model": {f"layer{i}.weight": torch.randn(64, 64, generator=generator) for i in range(16)},
            "step": torch.tensor(3)}


def _failing_in_writer_threads(writer: FileSystemWriter) -> FileSystemWriter:
    """Every file a writer thread (not the saving thread) opens fails as a file-size limit would."""
    create = writer.fs.create_stream

    def create_stream(path, mode):
        if threading.current_thread() is not threading.main_thread():
            raise OSError(errno.EFBIG, "File too large", str(path))
        return create(path, mode)

    writer.fs.create_stream = create_stream
    return writer


def test_torch_writer_threads_lose_their_failure(tmp_path):
    """The behaviour CheckedWriter exists for: the save completes, and the index lacks the failed thread's entries."""
    writer = _failing_in_writer_threads(FileSystemWriter(str(tmp_path), thread_count=4))
    dcp.save(_state(), storage_writer=writer)
    loaded = {"model": {k: torch.empty(64, 64) for k in _state()["model"]}, "step": torch.tensor(0)}
    with pytest.raises(CheckpointException, match="KeyError"):  # the index has no entry for the lost tensors
        dcp.load(loaded, checkpoint_id=str(tmp_path))


def test_a_writer_threads_failure_is_the_saves_failure(tmp_path):
    writer = _failing_in_writer_threads(CheckedWriter(tmp_path, thread_count=4))
    # DCP wraps a rank's failure; inside it is the thread's own error, so a full disk is still named upstream
    with pytest.raises(CheckpointException, match=r"OSError: \[Errno 27\] File too large"):
        dcp.save(_state(), storage_writer=writer)
    assert not (tmp_path / ".metadata").exists()  # nothing published an index


def test_a_save_with_missing_results_is_refused(tmp_path, monkeypatch):
    """Whatever the cause: results that do not cover every planned entry refuse the save."""
    writer = CheckedWriter(tmp_path, thread_count=2)
    original = FileSystemWriter.write_data

    def drop_one(self, plan, planner):
        future = original(self, plan, planner)
        results = future.wait()[1:]
        future = torch.futures.Future()
        future.set_result(results)
        return future

    monkeypatch.setattr(FileSystemWriter, "write_data", drop_one)
    with pytest.raises(CheckpointException, match=r"1 of \d+ checkpoint entries were not written"):
        dcp.save(_state(), storage_writer=writer)


def test_a_good_save_loads_back_equal_from_several_files(tmp_path):
    state = _state()
    dcp.save(state, storage_writer=CheckedWriter(tmp_path))
    assert len(list(tmp_path.glob("*.distcp"))) == WRITE_THREADS
    check_dcp(tmp_path)
    loaded = {"model": {k: torch.empty(64, 64) for k in state["model"]}, "step": torch.tensor(0)}
    load_dcp(loaded, tmp_path)
    for name, tensor in state["model"].items():
        assert torch.equal(loaded["model"][name], tensor)
    assert int(loaded["step"]) == 3


def test_two_overlapping_saves_take_turns_so_the_excepthook_is_theirs_and_restored():
    """Two policies' background checkpoints in one process: their writes take turns (the failures of torch's writer
    threads are caught through the process-wide threading.excepthook, which overlapping saves would swap under each
    other), and the hook is the original once both are done."""
    import threading
    import time

    from pettingllms.learner import safe_dcp

    original = threading.excepthook
    inside, overlaps = [0], []

    def write_data(self, plan, planner):  # stands in for torch's writer: records overlap
        inside[0] += 1
        overlaps.append(inside[0])
        time.sleep(0.05)
        inside[0] -= 1
        raise OSError("stop here")

    writer = safe_dcp.CheckedWriter.__new__(safe_dcp.CheckedWriter)
    base = safe_dcp.FileSystemWriter.write_data
    safe_dcp.FileSystemWriter.write_data = write_data
    try:
        def save():
            try:
                writer.write_data(None, None)
            except OSError:
                pass

        threads = [threading.Thread(target=save) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        safe_dcp.FileSystemWriter.write_data = base
    assert overlaps == [1, 1, 1]
    assert threading.excepthook is original


def test_a_failing_save_returns_only_once_its_writer_threads_have_stopped(tmp_path):
    """torch's saving thread writes files too, and a failure of its own leaves without joining the writer threads: they
    went on writing into the folder the caller then removed (under load, a full disk's partial checkpoint was left
    behind, its DiskFullError saying it had been removed)."""
    writer = CheckedWriter(tmp_path / "partial", thread_count=4)
    create = writer.fs.create_stream

    def create_stream(path, mode):
        if threading.current_thread() is threading.main_thread():
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        time.sleep(0.3)  # the writer threads are still at work when the saving thread fails
        return create(path, mode)

    writer.fs.create_stream = create_stream
    with pytest.raises(CheckpointException, match="No space left on device"):
        dcp.save(_state(), storage_writer=writer)
    assert not [t for t in threading.enumerate() if "_write_files_from_queue" in t.name]
    shutil.rmtree(tmp_path / "partial")
    time.sleep(0.5)  # a writer thread still running would write again here
    assert not (tmp_path / "partial").exists()
