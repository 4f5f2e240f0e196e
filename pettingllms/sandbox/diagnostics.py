"""Measurements of the runner process itself, for soak tests and benchmarks: open fds, RSS, zombie children,
leftover processes (by an argv marker) and leftover work dirs."""

from __future__ import annotations

import collections
import datetime
import gc
import glob
import os
import platform
import shutil
import tempfile
import time
import uuid

from .limits import Limits
from .pool import SandboxPool
from .runner import Sandbox
from .uids import proc_files
from .workdir import RUN_DIR_PREFIX, default_runs_root


def machine_info() -> dict:
    """What a benchmark figure needs next to it to mean anything."""
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "euid": os.geteuid(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def open_fd_count() -> int:
    return len(open_fds())


def open_fds() -> dict[int, str]:
    """This process's open file descriptors and what each points to (a path, ``pipe:[…]``, ``socket:[…]``)."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            continue
    return fds


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def zombie_children(parent: int | None = None) -> list[int]:
    """Pids of zombie processes whose parent is ``parent`` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    zombies = []
    for pid, stat in proc_files("stat"):
        # Fields after the command name (which may contain spaces) start after the last ')'.
        state, ppid = stat.rsplit(b")", 1)[1].split()[:2]
        if state == b"Z" and int(ppid) == parent:
            zombies.append(pid)
    return zombies


def processes_with_marker(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (pass it in a program's argv to track its tree)."""
    needle = marker.encode()
    return [pid for pid, cmdline in proc_files("cmdline") if pid != os.getpid() and needle in cmdline]


def leftover_work_dirs(root: str | None = None) -> list[str]:
    return glob.glob(os.path.join(root or default_runs_root(), RUN_DIR_PREFIX + "*"))


SOAK_PROGRAMS = (
    ("print(sum(map(int, input().split())))", "3 4\n", "7"),
    ("import sys\nprint(sys.stdin.read().upper(), end='')", "abc\n", "ABC"),
    ("import sys\nsys.exit(3)", "", ""),
    ("raise ValueError('boom')", "", ""),
    ("import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('forked')", "", "forked"),
)


# Other threads of this process (a library's log file, a writer thread a test left behind) may open a descriptor or
# two while the soak runs; a leak of one per program shows as hundreds. (The mid-run samples include the pipes of
# the programs in flight, so they move by a few either way and are for reading, not judging.)
FD_SLACK = 2


def fd_count_is_flat(figures: dict) -> bool:
    """Whether a soak left at most ``FD_SLACK`` more descriptors open than it found."""
    return figures["open_fds_after"] - figures["open_fds_before"] <= FD_SLACK


def soak(n_programs: int, max_workers: int = 2, sandbox: Sandbox | None = None,
         limits: Limits | None = None) -> dict:
    """Run ``n_programs`` short programs through a pool and report resource figures before and after.

    Every program's output is checked, so a broken sandbox cannot pass as a "flat" one. The runs use a work
    dir root of their own, so other sandbox users on the machine cannot make the leftover count wrong."""
    root = tempfile.mkdtemp(prefix="pettingllms-soak-")
    os.chmod(root, 0o711)  # a private uid must be able to traverse it (fallback layer as root)
    try:
        return _soak(n_programs, max_workers, sandbox or Sandbox(), limits, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _soak(n_programs: int, max_workers: int, sandbox: Sandbox, limits: Limits | None, root: str) -> dict:
    sandbox = sandbox.with_workdir_root(root)
    limits = limits or Limits(wall_timeout_s=10.0, cpu_time_s=5.0)
    marker = f"pettingllms-soak-{uuid.uuid4().hex}"
    wrong: list[str] = []
    with SandboxPool(max_workers, sandbox=sandbox) as pool:
        pool.run("print('warm-up')", limits=limits)  # first run pays for probing the layer
        gc.collect()  # files that earlier work left for the collector must not close mid-soak and hide a leak
        fds_before, rss_before = open_fds(), rss_kib()
        start = time.monotonic()
        futures = collections.deque()
        for i in range(n_programs):
            source, stdin, expected = SOAK_PROGRAMS[i % len(SOAK_PROGRAMS)]
            futures.append((pool.submit(source, stdin=stdin, argv=(marker,), limits=limits), expected, i))
        samples = []  # (programs done, open fds, RSS KiB) at every tenth: a leak shows as a steady climb
        while futures:
            future, expected, i = futures.popleft()  # drop each result once checked: measure the sandbox, not us
            result = future.result()
            if result.verdict != "ok" or result.stdout.strip() != expected:
                wrong.append(f"program {i}: verdict={result.verdict} stdout={result.stdout[:80]!r}")
            if (i + 1) % max(1, n_programs // 10) == 0:
                samples.append((i + 1, open_fd_count(), rss_kib()))
        elapsed = time.monotonic() - start
        metrics = pool.metrics
    gc.collect()
    fds_after = open_fds()
    return {
        "programs": n_programs,
        "workers": max_workers,
        "layer": sandbox.layer,
        "elapsed_s": round(elapsed, 3),
        "programs_per_s": round(n_programs / elapsed, 2),
        "open_fds_before": len(fds_before),
        "open_fds_after": len(fds_after),
        # What the after-count holds that the before-count did not: a leak names itself here.
        "fds_opened_meanwhile": sorted(set(fds_after.values()) - set(fds_before.values()))[:20],
        "rss_kib_before": rss_before,
        "rss_kib_after": rss_kib(),
        "samples_done_fds_rss_kib": samples,
        "zombie_children_after": len(zombie_children()),
        "surviving_marked_processes": len(processes_with_marker(marker)),
        "leftover_work_dirs": len(leftover_work_dirs(root)),
        "wrong_results": wrong[:10],
        "wrong_result_count": len(wrong),
        "pool_metrics": metrics,
    }
