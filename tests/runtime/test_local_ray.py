"""The Ray instance a run starts keeps its session files in an owner-only directory of its own (Ray makes its
folders world-writable), removed when the run stops Ray."""

from __future__ import annotations

import stat
from pathlib import Path

import ray

from pettingllms.assembly.plan import plan
from pettingllms.entry.train import load_config
from pettingllms.runtime.group import PolicyGroup
from pettingllms.runtime.local_ray import private_ray_parent


def test_policy_group_starts_ray_under_a_private_directory_and_removes_it(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not ray.is_initialized()
    cfg = load_config("train", ["base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets"])
    group = PolicyGroup(plan(cfg).worker_specs, use_ray=True, namespace="pettingllms-test-temp",
                        setup=False)
    try:
        session = Path(ray._private.worker._global_node.get_session_dir_path())
        private = group._own_ray.private_dir
        assert session.is_relative_to(private) and private.parent == private_ray_parent()
        assert private.name.startswith("pettingllms-ray-")
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert len(str(session / "sockets" / "plasma_store")) < 108  # a unix socket path's limit
    finally:
        group.shutdown()
    assert not ray.is_initialized()
    assert not private.exists()


def test_a_killed_drivers_directory_is_removed_at_the_next_start_and_a_live_ones_kept(tmp_path):
    """A driver killed by SIGKILL never stops Ray: its private directory stays until the next start removes it."""
    import os
    import subprocess
    import sys

    from pettingllms.runtime.local_ray import OWNER_FILE, remove_stale_ray_dirs

    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    killed.wait()
    prefix = f"pettingllms-ray-{os.getuid()}-"
    dead, live, unowned = (tmp_path / f"{prefix}dead", tmp_path / f"{prefix}live", tmp_path / f"{prefix}old")
    for folder, pid in ((dead, killed.pid), (live, os.getpid()), (unowned, None)):
        (folder / "r" / "session_x").mkdir(parents=True)
        if pid is not None:
            (folder / OWNER_FILE).write_text(str(pid))
    other = tmp_path / "pettingllms-ray-someone-else"
    other.mkdir()
    assert remove_stale_ray_dirs(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and unowned.exists() and other.exists()
