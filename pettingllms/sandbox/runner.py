"""Run one untrusted program: prepare a private work dir, start the launcher, watch the clock and the output.

The runner never trusts anything the program controls. It keeps the clock itself (the wall timeout is
measured here, from the moment the launcher reports the exec), reads the output with a hard cap while the
program runs, and decides the verdict from what the launcher observed (exit status, rusage) -- the launcher
is out of the program's reach (another uid, or non-dumpable in the same namespace).

Failures of the sandbox itself -- bwrap cannot mount, the launcher cannot drop privileges, the program
never started -- raise InfrastructureError. Anything that the program could cause after it started is a
verdict, never an InfrastructureError: otherwise a model could learn to turn its failures into
"infrastructure" and escape the penalty.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from pettingllms.core.errors import ConfigError, InfrastructureError

from . import layers
from .layers import FALLBACK, STRONG, Interpreter
from .limits import Limits
from .result import INFRASTRUCTURE_ERROR, KILLED, MEMORY, OK, OUTPUT_LIMIT, TIMEOUT, RunResult
from .uids import DEFAULT_LOCK_DIR, DEFAULT_SLOTS, DEFAULT_UID_BASE, UidSlot, acquire_uid_slot

logger = logging.getLogger("pettingllms.sandbox")

STARTUP_TIMEOUT_S = 30.0  # bwrap + launcher start; generous because a loaded trainer node can be slow
KILL_GRACE_S = 5.0  # after asking the launcher to kill the tree, before we kill the launcher itself
READ_CHUNK = 1 << 16
MAIN_FILE = "main.py"
WORLD_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_MEMORY_ERROR = re.compile(r"^MemoryError\b", re.MULTILINE)
SUPPORTED_LANGUAGES = ("python",)
DEFAULT_LAYER_ENV = "PETTINGLLMS_SANDBOX_LAYER"


@dataclass(frozen=True)
class LayerPlan:
    name: str
    interpreter: Interpreter
    bwrap: str | None
    privileged: bool  # runner is root: the program runs as a private slot uid


# ------------------------------------------------------------------------------------------ pure helpers

def validate_file_name(name: str) -> str:
    """A relative path inside the work dir; the names may come from the model, so no escapes."""
    if not isinstance(name, str) or not name or "\x00" in name or name.startswith("/"):
        raise ConfigError(f"sandbox file name {name!r} must be a non-empty relative path")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise ConfigError(f"sandbox file name {name!r} may not contain empty, '.' or '..' parts")
    return name


def _model_text_bytes(text: str) -> bytes:
    """UTF-8, keeping lone surrogates (model text can hold them): the program then fails like any bad program
    (a SyntaxError, say) instead of the sandbox raising before it runs."""
    return text.encode("utf-8", "surrogatepass")


def program_files(source: str | None, files: dict[str, str | bytes] | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, content in (files or {}).items():
        validate_file_name(name)
        if not isinstance(content, (str, bytes)):
            raise ConfigError(f"sandbox file {name!r} must be str or bytes, got {type(content).__name__}")
        out[name] = _model_text_bytes(content) if isinstance(content, str) else content
    if source is not None:
        if MAIN_FILE in out:
            raise ConfigError(f"give the program either as source or as files[{MAIN_FILE!r}], not both")
        out[MAIN_FILE] = _model_text_bytes(source)
    if MAIN_FILE not in out:
        raise ConfigError(f"no program: pass source or files[{MAIN_FILE!r}]")
    return out


def decide_verdict(*, kill_reason: str | None, exit_event: dict | None, stderr: str,
                   limits: Limits) -> str:
    if kill_reason == OUTPUT_LIMIT:
        return OUTPUT_LIMIT
    if kill_reason == TIMEOUT:
        return TIMEOUT
    if exit_event is None or exit_event.get("exit_code") is None and exit_event.get("signal") is None:
        return KILLED  # the launcher vanished after the start: only the program or an escalation did that
    sig = exit_event.get("signal")
    cpu_soft = limits.rlimits()["CPU"][0]
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and (exit_event.get("cpu_s") or 0) >= cpu_soft):
        return TIMEOUT
    if exit_event.get("exit_code") not in (None, 0) and _MEMORY_ERROR.search(stderr):
        return MEMORY
    if sig is not None:
        return KILLED
    return OK


def _parse_event(line: bytes) -> dict:
    try:
        event = ast.literal_eval(line.decode())
    except (ValueError, SyntaxError, UnicodeDecodeError) as exc:
        raise InfrastructureError(f"sandbox launcher sent an unreadable report line {line[:200]!r}") from exc
    if not isinstance(event, dict):
        raise InfrastructureError(f"sandbox launcher sent a report that is not a dict: {line[:200]!r}")
    return event


class _Capped:
    """Keeps the first ``limit`` bytes of a stream and remembers whether more came."""

    def __init__(self, limit: int):
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> bool:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.data += chunk[: max(room, 0)]
            self.truncated = True
        else:
            self.data += chunk
        return self.truncated

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------------ file system

def _write_files(work: str, contents: dict[str, bytes]) -> None:
    for name, data in contents.items():
        path = os.path.join(work, name)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def _chown_tree(root: str, uid: int) -> None:
    os.chown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


def _remove_tree(path: str) -> None:
    root = os.path.abspath(path)

    def make_writable_and_retry(func, failed_path, exc_info):
        # A non-root fallback program may have chmod-ed its own dirs to 000; we own them, so undo that --
        # but only inside the tree we are removing, and only for a permission problem.
        parent = os.path.dirname(os.path.abspath(failed_path))
        if not issubclass(exc_info[0], PermissionError) or not (parent == root or parent.startswith(root + "/")):
            raise exc_info[1]
        os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(failed_path) and not os.path.islink(failed_path):
            os.chmod(failed_path, stat.S_IRWXU)
        func(failed_path)

    try:
        shutil.rmtree(path, onerror=make_writable_and_retry)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.error("sandbox could not remove its work dir %s: %s", path, exc)


def _sweep_world_writable(uid: int) -> None:
    """Remove what the run's private uid left in world-writable dirs (fallback layer: shared /tmp)."""
    for top in WORLD_WRITABLE_DIRS:
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    _remove_tree(entry.path)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def pids_of_uid(uid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            found.append(int(name))
                        break
        except OSError:
            continue
    return found


# ------------------------------------------------------------------------------------------ one run

class _Run:
    def __init__(self, plan: LayerPlan, limits: Limits, uid_slot: UidSlot | None, run_dir: str):
        self.plan = plan
        self.limits = limits
        self.slot = uid_slot
        self.run_dir = run_dir
        self.work = os.path.join(run_dir, "work")
        self.stdout = _Capped(limits.max_output_bytes)
        self.stderr = _Capped(limits.max_output_bytes)
        self.events: list[dict] = []
        self.kill_reason: str | None = None
        self.started_at: float | None = None
        self.finished_at: float | None = None

    def command(self, argv: tuple[str, ...], report_fd: int, lifeline_fd: int) -> list[str]:
        uid = self.slot.uid if self.slot else None
        config = layers.launcher_config(layer=self.plan.name, interpreter=self.plan.interpreter, limits=self.limits,
                                        argv=argv, host_work_dir=self.work, uid=uid, report_fd=report_fd,
                                        lifeline_fd=lifeline_fd)
        if self.plan.name == STRONG:
            return layers.bwrap_argv(bwrap=self.plan.bwrap, interpreter=self.plan.interpreter, limits=self.limits,
                                     host_work_dir=self.work, privileged=self.plan.privileged, config=config)
        return layers.fallback_argv(interpreter=self.plan.interpreter, config=config)

    def execute(self, argv: tuple[str, ...], stdin_path: str) -> RunResult:
        report_r, report_w = os.pipe()
        lifeline_r, self._lifeline_w = os.pipe()
        pass_fds = [report_w, lifeline_r] + ([self.slot.lock_fd] if self.slot else [])
        cmd = self.command(argv, report_w, lifeline_r)
        env = layers.program_env(home=self.work, tmpdir=self.work)
        try:
            with open(stdin_path, "rb") as stdin:
                proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        pass_fds=pass_fds, env=env, cwd=self.run_dir, start_new_session=True)
        except OSError as exc:
            self._close_lifeline()
            for fd in (report_r, report_w, lifeline_r):
                os.close(fd)
            raise InfrastructureError(f"sandbox ({self.plan.name}) could not start {cmd[0]!r}: {exc}") from exc
        os.close(report_w)
        os.close(lifeline_r)
        try:
            self._watch(proc, report_r)
        finally:
            # Every fd is closed exactly once: a second close could hit another thread's new fd.
            self._close_lifeline()
            os.close(report_r)
            proc.stdout.close()
            proc.stderr.close()
            self._reap(proc)
        return self._result()

    def _close_lifeline(self) -> None:
        """Closing our end of the lifeline is the kill request: the launcher sees the hang-up."""
        if self._lifeline_w >= 0:
            os.close(self._lifeline_w)
            self._lifeline_w = -1

    def _request_kill(self, reason: str) -> float:
        self.kill_reason = reason
        self._close_lifeline()
        return time.monotonic() + KILL_GRACE_S

    def _watch(self, proc: subprocess.Popen, report_fd: int) -> None:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, self.stdout)
        sel.register(proc.stderr, selectors.EVENT_READ, self.stderr)
        sel.register(report_fd, selectors.EVENT_READ, "report")
        report_buf = b""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        try:
            while sel.get_map():
                now = time.monotonic()
                if now >= deadline:
                    if self.kill_reason is not None:
                        self._escalate(proc)
                        return
                    deadline = self._request_kill(TIMEOUT if self.started_at is not None else "startup-timeout")
                    continue
                for key, _ in sel.select(deadline - now):
                    chunk = os.read(key.fd, READ_CHUNK)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif key.data == "report":
                        report_buf += chunk
                        *lines, report_buf = report_buf.split(b"\n")
                        for line in lines:
                            event = _parse_event(line)
                            self.events.append(event)
                            if event.get("event") == "started":
                                self.started_at = time.monotonic()
                                if self.kill_reason is None:  # else a kill is already under way
                                    deadline = self.started_at + self.limits.wall_timeout_s
                            elif event.get("event") == "exit":
                                self.finished_at = time.monotonic()
                    elif key.data.add(chunk) and self.kill_reason is None:
                        deadline = self._request_kill(OUTPUT_LIMIT)
        finally:
            sel.close()

    def _escalate(self, proc: subprocess.Popen) -> None:
        """The launcher did not finish within the grace period: kill it, then everything of the run's uid."""
        logger.error("sandbox launcher (pid %d) did not end %.0fs after the kill request; killing it",
                     proc.pid, KILL_GRACE_S)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap's pid 1 dies with it (--die-with-parent)
        except ProcessLookupError:
            pass
        if self.slot is not None:
            try:
                subprocess.run([self.plan.interpreter.executable, "-I", "-S", "-c",
                                "import os, signal; os.kill(-1, signal.SIGKILL)"],
                               user=self.slot.uid, group=self.slot.gid, extra_groups=[], env={}, timeout=30)
            except (OSError, subprocess.SubprocessError) as exc:
                logger.error("sandbox emergency kill of uid %d failed: %s", self.slot.uid, exc)

    def _reap(self, proc: subprocess.Popen) -> None:
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            self._escalate(proc)
            proc.wait()

    def _event(self, name: str) -> dict | None:
        return next((e for e in self.events if e.get("event") == name), None)

    def _result(self) -> RunResult:
        stderr = self.stderr.text()
        for failure in ("setup-error", "launcher-error"):
            event = self._event(failure)
            if event is not None:
                raise InfrastructureError(f"sandbox ({self.plan.name}) {failure}: {event.get('message')}"
                                          + (f"; stderr: {stderr[-2000:]}" if stderr else ""))
        started = self._event("started")
        if started is None or self.kill_reason == "startup-timeout":
            timed_out = self.kill_reason == "startup-timeout"
            why = "did not start in time" if timed_out else "failed before the program started"
            raise InfrastructureError(f"sandbox ({self.plan.name}) {why}; stderr: {stderr[-2000:]!r}")
        exit_event = self._event("exit")
        if exit_event is not None and not exit_event.get("tree_gone", False):
            raise InfrastructureError(f"sandbox ({self.plan.name}) could not kill the program's process tree")
        if self.slot is not None and self.plan.name == FALLBACK:
            leftovers = pids_of_uid(self.slot.uid)
            if leftovers:
                self.slot.quarantined = True  # never hand this uid to another run of this process
                raise InfrastructureError(f"sandbox processes of uid {self.slot.uid} survived the run: {leftovers}")
        verdict = decide_verdict(kill_reason=self.kill_reason, exit_event=exit_event, stderr=stderr,
                                 limits=self.limits)
        exit_event = exit_event or {}
        net = started.get("net_isolated")
        end = self.finished_at or time.monotonic()
        return RunResult(
            verdict=verdict,
            exit_code=exit_event.get("exit_code") if self.kill_reason is None else None,
            stdout=self.stdout.text(),
            stderr=stderr,
            stdout_truncated=self.stdout.truncated,
            stderr_truncated=self.stderr.truncated,
            wall_time_s=end - self.started_at,
            layer=self.plan.name,
            network_isolated=True if self.plan.name == STRONG else bool(net),
            signal=exit_event.get("signal"),
            cpu_time_s=exit_event.get("cpu_s"),
            max_rss_kib=exit_event.get("maxrss_kb"),
        )


def _check_reachable_by_others(path: str) -> None:
    for parent in layers._parents(os.path.join(path, "x")):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            raise InfrastructureError(
                f"sandbox work dir {path} is not reachable by the program's private uid: {parent} lacks o+x; "
                "pass a workdir_root whose parents are world-traversable (the default, the system temp dir, is)"
            )


def run_in_plan(plan: LayerPlan, *, files: dict[str, bytes], stdin: str | bytes, argv: tuple[str, ...],
                limits: Limits, workdir_root: str | None, uid_base: int, uid_slots: int, lock_dir: str) -> RunResult:
    run_dir = tempfile.mkdtemp(prefix="pettingllms-sbx-", dir=workdir_root)
    slot = None
    try:
        work = os.path.join(run_dir, "work")
        os.mkdir(work, 0o755)
        _write_files(work, files)
        stdin_path = os.path.join(run_dir, "stdin")
        with open(stdin_path, "wb") as f:
            f.write(_model_text_bytes(stdin) if isinstance(stdin, str) else stdin)
        if plan.privileged:
            # The run dir stays ours (so the sweep of the uid's leftovers never touches it) but traversable;
            # the program's uid owns what is inside.
            os.chmod(run_dir, 0o711)
            if plan.name == FALLBACK:  # in the strong layer bwrap (root) mounts the dir for the program
                _check_reachable_by_others(run_dir)
            slot = acquire_uid_slot(base=uid_base, slots=uid_slots, lock_dir=lock_dir)
            _chown_tree(work, slot.uid)
            os.chown(stdin_path, slot.uid, slot.uid)
        return _Run(plan, limits, slot, run_dir).execute(tuple(argv), stdin_path)
    finally:
        if slot is not None:
            if plan.name == FALLBACK:
                _sweep_world_writable(slot.uid)
            slot.release()
        _remove_tree(run_dir)


# ------------------------------------------------------------------------------------------ layer choice

def default_interpreters() -> list[str]:
    """The runner's own interpreter (its real binary: no venv packages), then the system python3."""
    seen: list[str] = []
    for candidate in (os.path.realpath(sys.executable), shutil.which("python3", path=layers.PROGRAM_PATH)):
        if candidate and os.path.realpath(candidate) not in seen:
            seen.append(os.path.realpath(candidate))
    return seen


PROBE_SOURCE = "import sys\nsys.stdout.write('sandbox-probe-' + str(6 * 7))\n"
PROBE_LIMITS = Limits(wall_timeout_s=30.0, cpu_time_s=10.0)


def probe(plan: LayerPlan, **run_kwargs) -> str | None:
    """Run a tiny program through the whole layer. None when it works, else why it does not."""
    try:
        result = run_in_plan(plan, files={MAIN_FILE: PROBE_SOURCE.encode()}, stdin="", argv=(), limits=PROBE_LIMITS,
                             **run_kwargs)
    except InfrastructureError as exc:
        return str(exc)
    if result.verdict != OK or result.exit_code != 0 or result.stdout != "sandbox-probe-42":
        return (f"probe program gave verdict={result.verdict} exit_code={result.exit_code} "
                f"stdout={result.stdout[:200]!r} stderr={result.stderr[-500:]!r}")
    return None


_plan_cache: dict[tuple, LayerPlan] = {}
_plan_lock = threading.Lock()


def resolve_plan(layer: str, python: str | None, run_kwargs: dict) -> LayerPlan:
    """Pick and probe a layer once per (layer, interpreter, uid settings); cached for the process."""
    if layer not in ("auto", *layers.LAYERS):
        raise ConfigError(f"sandbox layer must be 'auto', 'strong' or 'fallback', got {layer!r}")
    key = (layer, python, tuple(sorted(run_kwargs.items())))
    with _plan_lock:
        if key in _plan_cache:
            return _plan_cache[key]
        plan = _choose_plan(layer, python, run_kwargs)
        _plan_cache[key] = plan
        return plan


def clear_layer_cache() -> None:
    """Forget probed layers (tests; or after installing bubblewrap in a running process)."""
    with _plan_lock:
        _plan_cache.clear()


def _runner_is_root() -> bool:
    return os.geteuid() == 0


def _choose_plan(layer: str, python: str | None, run_kwargs: dict) -> LayerPlan:
    privileged = _runner_is_root()
    interpreters = [python] if python else default_interpreters()
    problems: list[str] = []
    if layer in ("auto", STRONG):
        bwrap = layers.find_bwrap()
        if bwrap is None:
            problems.append("strong layer: bubblewrap (bwrap) is not installed; run scripts/install_system_deps.sh")
        else:
            plan = LayerPlan(STRONG, layers.describe_interpreter(interpreters[0]), bwrap, privileged)
            why = probe(plan, **run_kwargs)
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
            plan = LayerPlan(FALLBACK, layers.describe_interpreter(executable), None, privileged)
        except InfrastructureError as exc:
            problems.append(str(exc))
            continue
        why = probe(plan, **run_kwargs)
        if why is None:
            if not privileged:
                logger.warning("sandbox fallback layer runs programs as this user (uid %d): no private uid, "
                               "no network isolation, approximate process limit", os.geteuid())
            return plan
        problems.append(f"fallback layer with {executable}: {why}")
    raise InfrastructureError("no sandbox layer works: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------ public API

class Sandbox:
    """Holds the layer choice and the default limits; ``run`` executes one program.

    layer: "auto" (strong if it works here, else -- as root -- fallback with a logged warning; without root an
    InfrastructureError, since the fallback then has no private uid), "strong" or "fallback"
    (InfrastructureError if that layer does not work). python: interpreter for the program; by default the
    real binary behind sys.executable (standard library only), or the system python3 where the fallback
    layer's private uid cannot reach the former. infrastructure_errors: "raise" (default) or "verdict" to
    get a RunResult with verdict "infrastructure-error" instead.
    """

    def __init__(self, layer: str = "auto", limits: Limits | None = None, *, python: str | None = None,
                 workdir_root: str | None = None, infrastructure_errors: str = "raise",
                 uid_base: int = DEFAULT_UID_BASE, uid_slots: int = DEFAULT_SLOTS, lock_dir: str = DEFAULT_LOCK_DIR):
        if infrastructure_errors not in ("raise", "verdict"):
            raise ConfigError(f"infrastructure_errors must be 'raise' or 'verdict', got {infrastructure_errors!r}")
        if layer not in ("auto", *layers.LAYERS):
            raise ConfigError(f"sandbox layer must be 'auto', 'strong' or 'fallback', got {layer!r}")
        self.requested_layer = layer
        self.limits = limits or Limits()
        self.python = python
        self.infrastructure_errors = infrastructure_errors
        self._run_kwargs = {"workdir_root": workdir_root, "uid_base": uid_base, "uid_slots": uid_slots,
                            "lock_dir": lock_dir}

    def plan(self) -> LayerPlan:
        return resolve_plan(self.requested_layer, self.python, self._run_kwargs)

    def with_workdir_root(self, workdir_root: str | None) -> "Sandbox":
        """The same sandbox, with its per-run directories created under ``workdir_root``."""
        kwargs = {**self._run_kwargs, "workdir_root": workdir_root}
        return Sandbox(self.requested_layer, self.limits, python=self.python,
                       infrastructure_errors=self.infrastructure_errors, **kwargs)

    @property
    def layer(self) -> str:
        return self.plan().name

    def run(self, source: str | None = None, *, argv=(), stdin: str | bytes = "",
            files: dict[str, str | bytes] | None = None, limits: Limits | None = None,
            language: str = "python") -> RunResult:
        if language not in SUPPORTED_LANGUAGES:
            raise ConfigError(f"sandbox language {language!r} is not supported; supported: {SUPPORTED_LANGUAGES}")
        contents = program_files(source, files)
        if not all(isinstance(a, str) and "\x00" not in a for a in argv):
            raise ConfigError("sandbox argv must be strings without NUL bytes")
        limits = limits or self.limits
        try:
            return run_in_plan(self.plan(), files=contents, stdin=stdin, argv=tuple(argv), limits=limits,
                               **self._run_kwargs)
        except InfrastructureError as exc:
            if self.infrastructure_errors == "raise":
                raise
            logger.error("sandbox infrastructure error: %s", exc)
            return RunResult(verdict=INFRASTRUCTURE_ERROR, exit_code=None, stdout="", stderr="",
                             stdout_truncated=False, stderr_truncated=False, wall_time_s=0.0,
                             layer=self.requested_layer, network_isolated=False, infrastructure_message=str(exc))


_default_sandbox: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """The process-wide sandbox of run_program; its layer comes from $PETTINGLLMS_SANDBOX_LAYER (default auto)."""
    global _default_sandbox
    with _default_lock:
        if _default_sandbox is None:
            _default_sandbox = Sandbox(os.environ.get(DEFAULT_LAYER_ENV, "auto"))
        return _default_sandbox


def run_program(source: str | None = None, *, argv=(), stdin: str | bytes = "",
                files: dict[str, str | bytes] | None = None, limits: Limits | None = None,
                language: str = "python") -> RunResult:
    """Run one program in the default sandbox (layer "auto") under ``limits`` (production defaults)."""
    return default_sandbox().run(source, argv=argv, stdin=stdin, files=files, limits=limits or Limits(),
                                 language=language)
