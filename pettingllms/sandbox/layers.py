"""Which isolation layer runs a program, and the command line that sets it up.

strong    bubblewrap: new pid, net, ipc, uts (and cgroup) namespaces, a root made only of read-only binds
          of /usr, /etc and the interpreter, private size-capped tmpfs for the work dir and /tmp. As root
          the program runs as a private slot uid (see uids.py); otherwise in a new user namespace.
fallback  no bubblewrap: a new session, rlimits, a subreaper launcher that kills the whole tree; as root a private
          slot uid and, where the kernel allows them, new network and IPC namespaces and a mount namespace with
          private tmpfs over the shared writable dirs (/tmp, /var/tmp, /dev/shm, ...).

The launcher's config goes through a pipe (an inherited fd), never the command line: /proc/<pid>/cmdline is
readable by every uid, and the config names the run's work dir.

The argv and config builders start nothing -- except describe_interpreter, which asks an interpreter once
where its standard library lives. Choosing a layer (``resolve_plan``) runs a tiny probe program through it,
with the run function the caller passes in (``runner.run_in_plan``), once per process and settings.
"""

from __future__ import annotations

import json
import logging
import marshal
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Callable

from pettingllms.core.errors import ConfigError, InfrastructureError

from .leftovers import SHARED_WRITABLE_DIRS
from .limits import Limits
from .result import OK, RunResult

logger = logging.getLogger("pettingllms.sandbox")

STRONG = "strong"
FALLBACK = "fallback"
LAYERS = (STRONG, FALLBACK)
DEFAULT_LAYER_ENV = "PETTINGLLMS_SANDBOX_LAYER"

MAIN_FILE = "main.py"  # the program, in the work dir

LAUNCHER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launcher.py")

# Paths as the program sees them in the strong layer.
SANDBOX_DIR = "/sandbox"
SANDBOX_WORK = SANDBOX_DIR + "/work"
SANDBOX_INPUT = SANDBOX_DIR + "/input"
SANDBOX_LAUNCHER = SANDBOX_DIR + "/launcher.py"

SYSTEM_DIRS = ("/usr", "/etc")
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
PROGRAM_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Interpreter:
    executable: str
    prefixes: tuple[str, ...]  # directories the interpreter needs, bound read-only in the strong layer


@dataclass(frozen=True)
class LayerPlan:
    name: str
    interpreter: Interpreter
    bwrap: str | None
    privileged: bool  # runner is root: the program runs as a private slot uid


@lru_cache(maxsize=None)
def describe_interpreter(executable: str) -> Interpreter:
    """Ask the interpreter where its stdlib lives. Raises InfrastructureError if it does not run."""
    query = "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"
    try:
        out = subprocess.run([executable, "-I", "-S", "-c", query], capture_output=True, text=True, timeout=60,
                             env={"PATH": PROGRAM_PATH}, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise InfrastructureError(f"sandbox interpreter {executable!r} does not run: {exc}") from exc
    dirs = {os.path.realpath(p) for p in json.loads(out)}
    dirs.add(os.path.dirname(os.path.realpath(executable)))
    return Interpreter(executable=executable, prefixes=tuple(sorted(_outermost(dirs))))


def _is_within(path: str, dirs) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _outermost(paths: set[str]) -> set[str]:
    """Drop paths the system binds already cover, and paths inside another path of the set."""
    return {p for p in paths if not _is_within(p, SYSTEM_DIRS) and not _is_within(p, paths - {p})}


def find_bwrap() -> str | None:
    return shutil.which("bwrap", path=os.environ.get("PATH", "") + os.pathsep + PROGRAM_PATH)


def program_env(home: str, tmpdir: str) -> dict[str, str]:
    """The whole environment of the program: an allow-list, nothing inherited from the runner."""
    return {
        "PATH": PROGRAM_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": tmpdir,
        "PYTHONHASHSEED": "0",  # reproducible set/dict order across runs of the same program
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


def program_argv(interpreter: Interpreter, main_path: str, argv: tuple[str, ...]) -> list[str]:
    # -s: no user site-packages. Not -I: that would also ignore PYTHONHASHSEED from program_env.
    return [interpreter.executable, "-s", main_path, *argv]


def launcher_config(*, layer: str, interpreter: Interpreter, limits: Limits, argv: tuple[str, ...],
                    host_work_dir: str, uid: int | None, report_fd: int, lifeline_fd: int) -> dict:
    strong = layer == STRONG
    cwd = SANDBOX_WORK if strong else host_work_dir
    # The fallback names the program relative to its cwd: its absolute path would show in its world-readable
    # /proc/<pid>/cmdline and tell other runs where this run's files are.
    main_path = os.path.join(cwd, MAIN_FILE) if strong else MAIN_FILE
    if strong:
        kill_mode = "namespace"  # kill(-1) inside the pid namespace reaches every process of the run
    elif uid is not None:
        kill_mode = "uid"  # kill(-1) as the run's private uid
    else:
        kill_mode = "tree"  # walk our own descendants (subreaper keeps setsid orphans in the tree)
    return {
        "argv": program_argv(interpreter, main_path, argv),
        "cwd": cwd,
        "copy_from": SANDBOX_INPUT if strong else None,
        "env": program_env(home=cwd, tmpdir="/tmp" if strong else cwd),
        "rlimits": limits.rlimits(),
        "uid": uid,
        "gid": uid,
        "kill_mode": kill_mode,
        "unshare_net": (not strong) and uid is not None,  # the fallback tries it when it is root
        # The fallback as root also tries an IPC namespace and private tmpfs over the shared writable dirs (bwrap
        # does both in the strong layer); the launcher reports what it got.
        "isolate": (not strong) and uid is not None,
        "private_dirs": SHARED_WRITABLE_DIRS,
        "disk_bytes": int(limits.max_disk_bytes),
        "nproc_relative": uid is None,  # non-root: the program shares its uid's task count (see launcher)
        "report_fd": report_fd,
        "lifeline_fd": lifeline_fd,
    }


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def bwrap_argv(*, bwrap: str, interpreter: Interpreter, limits: Limits, host_work_dir: str, privileged: bool,
               config_fd: int) -> list[str]:
    args = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if privileged:
        # No user namespace: the launcher stays root inside so it can drop the program to the slot uid,
        # which makes RLIMIT_NPROC count. These caps are the launcher's only; the program gets none.
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL"):
            args += ["--cap-add", cap]
    else:
        args += ["--unshare-user"]
    for path in SYSTEM_DIRS:
        if os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    made = set()
    for prefix in interpreter.prefixes:
        for parent in _parents(prefix):
            if parent not in made:
                # bwrap would create missing parents 0700, hiding the interpreter from the program's uid.
                args += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        args += ["--ro-bind", prefix, prefix]
    disk = str(int(limits.max_disk_bytes))
    args += [
        "--perms", "0755", "--dir", SANDBOX_DIR,
        "--ro-bind", LAUNCHER_PATH, SANDBOX_LAUNCHER,
        "--ro-bind", host_work_dir, SANDBOX_INPUT,
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "1777", "--size", disk, "--tmpfs", "/tmp",
        "--perms", "0777", "--size", disk, "--tmpfs", SANDBOX_WORK,
        "--remount-ro", "/",
        "--chdir", SANDBOX_WORK,
        "--", interpreter.executable, "-I", "-S", SANDBOX_LAUNCHER, str(config_fd),
    ]
    return args


def fallback_argv(*, interpreter: Interpreter, config_fd: int) -> list[str]:
    return [interpreter.executable, "-I", "-S", LAUNCHER_PATH, str(config_fd)]


def encode_config(config: dict) -> bytes:
    # marshal: the launcher decodes it without importing json (startup time).
    return marshal.dumps(config)


# ------------------------------------------------------------------------------------------ layer choice

def default_interpreters() -> list[str]:
    """The runner's own interpreter (its real binary: no venv packages), then the system python3."""
    seen: list[str] = []
    for candidate in (os.path.realpath(sys.executable), shutil.which("python3", path=PROGRAM_PATH)):
        if candidate and os.path.realpath(candidate) not in seen:
            seen.append(os.path.realpath(candidate))
    return seen


PROBE_SOURCE = "import sys\nsys.stdout.write('sandbox-probe-' + str(6 * 7))\n"
PROBE_LIMITS = Limits(wall_timeout_s=30.0, cpu_time_s=10.0)


def check_layer_name(layer: str) -> str:
    if layer not in ("auto", *LAYERS):
        raise ConfigError(f"sandbox layer must be 'auto', 'strong' or 'fallback', got {layer!r}")
    return layer


RunInPlan = Callable[..., RunResult]
"""``runner.run_in_plan``: (plan, *, files, stdin, argv, limits, <run dir and uid settings>) -> RunResult."""


def probe(plan: LayerPlan, run: RunInPlan) -> str | None:
    """Run a tiny program through the whole layer with ``run`` (its run dir and uid settings bound). None when
    it works, else why it does not."""
    try:
        result = run(plan, files={MAIN_FILE: PROBE_SOURCE.encode()}, stdin="", argv=(), limits=PROBE_LIMITS)
    except InfrastructureError as exc:
        return str(exc)
    if result.verdict != OK or result.exit_code != 0 or result.stdout != "sandbox-probe-42":
        return (f"probe program gave verdict={result.verdict} exit_code={result.exit_code} "
                f"stdout={result.stdout[:200]!r} stderr={result.stderr[-500:]!r}")
    return None


_plan_cache: dict[tuple, LayerPlan] = {}
_plan_lock = threading.Lock()


def resolve_plan(layer: str, python: str | None, run_kwargs: dict, run: RunInPlan) -> LayerPlan:
    """Pick and probe a layer once per (layer, interpreter, uid settings); cached for the process.

    ``run`` runs the probe (``runner.run_in_plan``; passed in because running sits above choosing),
    ``run_kwargs`` are its run dir and uid settings."""
    check_layer_name(layer)
    key = (layer, python, tuple(sorted(run_kwargs.items())))
    with _plan_lock:
        if key in _plan_cache:
            return _plan_cache[key]
        plan = _choose_plan(layer, python, partial(run, **run_kwargs))
        _plan_cache[key] = plan
        return plan


def clear_layer_cache() -> None:
    """Forget probed layers (tests; or after installing bubblewrap in a running process)."""
    with _plan_lock:
        _plan_cache.clear()


def _runner_is_root() -> bool:
    return os.geteuid() == 0


def _choose_plan(layer: str, python: str | None, run: RunInPlan) -> LayerPlan:
    privileged = _runner_is_root()
    interpreters = [python] if python else default_interpreters()
    problems: list[str] = []
    if layer in ("auto", STRONG):
        bwrap = find_bwrap()
        if bwrap is None:
            problems.append("strong layer: bubblewrap (bwrap) is not installed; run scripts/install_system_deps.sh")
        else:
            plan = LayerPlan(STRONG, describe_interpreter(interpreters[0]), bwrap, privileged)
            why = probe(plan, run)
            if why is None:
                return plan
            problems.append(f"strong layer: bubblewrap does not work here: {why}")
        if layer == STRONG:
            raise InfrastructureError("; ".join(problems))
        if not privileged:
            # Without root the fallback cannot give the program a uid of its own: the program could read
            # this user's files and kill(-1) every process of the user, the trainer included. Fail closed.
            raise InfrastructureError(
                "; ".join(problems) + "; the fallback layer without root runs programs as this user (no private "
                "uid, no network isolation), so it is only used when asked for: Sandbox(layer='fallback') or "
                f"{DEFAULT_LAYER_ENV}=fallback"
            )
        logger.warning("sandbox falls back to the weaker layer (no namespaces, see docs/sandbox.md): %s",
                       "; ".join(problems))
    for executable in interpreters:
        try:
            plan = LayerPlan(FALLBACK, describe_interpreter(executable), None, privileged)
        except InfrastructureError as exc:
            problems.append(str(exc))
            continue
        why = probe(plan, run)
        if why is None:
            if not privileged:
                logger.warning("sandbox fallback layer runs programs as this user (uid %d): no private uid, "
                               "no network isolation, approximate process limit", os.geteuid())
            return plan
        problems.append(f"fallback layer with {executable}: {why}")
    raise InfrastructureError("no sandbox layer works: " + "; ".join(problems))
