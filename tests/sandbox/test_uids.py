"""Private uid slots: exclusive across holders (flock), reused after release, refused when exhausted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pettingllms.core.errors import InfrastructureError
from pettingllms.sandbox.uids import acquire_uid_slot

BASE = 1_900_000_000


def test_slots_are_exclusive_and_reused(tmp_path):
    lock_dir = str(tmp_path / "locks")
    first = acquire_uid_slot(base=BASE, slots=4, lock_dir=lock_dir)
    second = acquire_uid_slot(base=BASE, slots=4, lock_dir=lock_dir)
    assert (first.uid, second.uid) == (BASE, BASE + 1)
    first.release()
    again = acquire_uid_slot(base=BASE, slots=4, lock_dir=lock_dir)
    assert again.uid == BASE
    again.release()
    second.release()


def test_slot_held_by_another_process_is_skipped(tmp_path):
    lock_dir = str(tmp_path / "locks")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nsys.path.insert(0, sys.argv[2])\n"
         "from pettingllms.sandbox.uids import acquire_uid_slot\n"
         f"s = acquire_uid_slot(base={BASE}, slots=4, lock_dir=sys.argv[1])\n"
         "print(s.uid, flush=True)\ntime.sleep(30)\n",
         lock_dir, os.getcwd()],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == str(BASE)
        beside = acquire_uid_slot(base=BASE, slots=4, lock_dir=lock_dir)
        assert beside.uid == BASE + 1
        beside.release()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # The holder died: the kernel dropped its lock, the slot is free again.
    freed = acquire_uid_slot(base=BASE, slots=4, lock_dir=lock_dir)
    assert freed.uid == BASE
    freed.release()


def test_exhausted_slots_raise(tmp_path):
    lock_dir = str(tmp_path / "locks")
    held = [acquire_uid_slot(base=BASE, slots=2, lock_dir=lock_dir) for _ in range(2)]
    with pytest.raises(InfrastructureError, match="in use"):
        acquire_uid_slot(base=BASE, slots=2, lock_dir=lock_dir)
    for slot in held:
        slot.release()


def test_lock_dir_writable_by_others_is_refused(tmp_path):
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    os.chmod(lock_dir, 0o777)
    with pytest.raises(InfrastructureError, match="not group/world"):
        acquire_uid_slot(base=BASE, slots=2, lock_dir=str(lock_dir))


def test_a_slot_whose_uid_still_runs_processes_is_skipped(tmp_path):
    """Survivors of a run whose runner died keep their uid: a new run under it could be signalled by them."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another uid")
    survivor = subprocess.Popen(["sleep", "30"], user=BASE, group=BASE, extra_groups=[])
    try:
        slot = acquire_uid_slot(base=BASE, slots=4, lock_dir=str(tmp_path / "locks"))
        assert slot.uid == BASE + 1
        slot.release()
    finally:
        survivor.kill()
        survivor.wait()
