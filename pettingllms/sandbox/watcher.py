"""Watch one launched run: start the launcher, keep the clock, read the output with a cap, kill on a limit, reap,
and turn what the launcher reported into a RunResult.

The clock is the runner's own (the wall timeout counts from the launcher's "started" report), and a kill is a
request to the launcher (closing the lifeline pipe), escalated to SIGKILL of its session -- and of every process
of the run's uid -- when the launcher does not end within ``KILL_GRACE_S``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import selectors
import signal
import subprocess
import time
from pettingllms.core.errors import InfrastructureError

from . import layers, workdir
from .layers import FALLBACK, STRONG, LayerPlan
from .limits import Limits
from .result import OUTPUT_LIMIT, TIMEOUT, RunResult
from .uids import UidSlot, pids_of_uid
from .verdict import CappedOutput, decide_verdict, parse_event

logger = logging.getLogger("pettingllms.sandbox")

STARTUP_TIMEOUT_S = 30.0  # bwrap + launcher start; generous because a loaded trainer node can be slow
KILL_GRACE_S = 5.0  # after asking the launcher to kill the tree, before we kill the launcher itself
READ_CHUNK = 1 << 16


def config_pipe(data: bytes) -> int:
    """The read end of a pipe that holds ``data`` and then EOF: the launcher's config, kept off the command line
    (``/proc/<pid>/cmdline`` is readable by every uid). Written whole before the launcher starts, so it never
    blocks; a config beyond the pipe's capacity grows the pipe or fails."""
    read_fd, write_fd = os.pipe()
    try:
        os.set_blocking(write_fd, False)
        view, grown = memoryview(data), False
        while view:
            try:
                view = view[os.write(write_fd, view):]
            except BlockingIOError:
                if grown:
                    raise
                fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, len(data))
                grown = True
    except OSError as exc:
        os.close(read_fd)
        raise InfrastructureError(f"sandbox launcher config of {len(data)} bytes does not fit a pipe: {exc}; "
                                  "pass a shorter argv") from exc
    finally:
        os.close(write_fd)
    return read_fd


class WatchedRun:
    """One run of a program in a prepared run dir under ``plan``; ``execute`` returns its RunResult."""

    def __init__(self, plan: LayerPlan, limits: Limits, uid_slot: UidSlot | None, run_dir: str):
        self.plan = plan
        self.limits = limits
        self.slot = uid_slot
        self.run_dir = run_dir
        self.work = workdir.work_dir(run_dir)
        self.stdout = CappedOutput(limits.max_output_bytes)
        self.stderr = CappedOutput(limits.max_output_bytes)
        self.events: list[dict] = []
        self.kill_reason: str | None = None
        self.started_at: float | None = None
        self.finished_at: float | None = None

    def config(self, argv: tuple[str, ...], report_fd: int, lifeline_fd: int) -> dict:
        uid = self.slot.uid if self.slot else None
        return layers.launcher_config(layer=self.plan.name, interpreter=self.plan.interpreter, limits=self.limits,
                                      argv=argv, host_work_dir=self.work, uid=uid, report_fd=report_fd,
                                      lifeline_fd=lifeline_fd)

    def command(self, config_fd: int) -> tuple[list[str], list[int]]:
        """The launch command and the extra fds it reads. bwrap takes its own arguments from a pipe (``--args``):
        they name the work dir, and its command line is world-readable too."""
        if self.plan.name == STRONG:
            args = layers.bwrap_argv(bwrap=self.plan.bwrap, interpreter=self.plan.interpreter, limits=self.limits,
                                     host_work_dir=self.work, privileged=self.plan.privileged, config_fd=config_fd)
            options, command = args[1:args.index("--")], args[args.index("--"):]  # bwrap reads only options there
            args_fd = config_pipe(b"".join(arg.encode() + b"\0" for arg in options))
            return [args[0], "--args", str(args_fd), *command], [args_fd]
        return layers.fallback_argv(interpreter=self.plan.interpreter, config_fd=config_fd), []

    def execute(self, argv: tuple[str, ...], stdin_path: str) -> RunResult:
        report_r, report_w = os.pipe()
        lifeline_r, self._lifeline_w = os.pipe()
        ours = [report_r, report_w, lifeline_r]  # closed here on a failed start
        try:
            ours.append(config_pipe(layers.encode_config(self.config(argv, report_w, lifeline_r))))
            cmd, extra_fds = self.command(ours[-1])
            ours += extra_fds
        except BaseException:
            self._close_lifeline()
            for fd in ours:
                os.close(fd)
            raise
        launch_fds = ours[1:]  # all but report_r: the launcher's (or bwrap's) to inherit, ours to close once it runs
        pass_fds = launch_fds + ([self.slot.lock_fd] if self.slot else [])
        env = layers.program_env(home=self.work, tmpdir=self.work)
        try:
            with open(stdin_path, "rb") as stdin:
                proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        pass_fds=pass_fds, env=env, cwd=self.run_dir, start_new_session=True)
        except OSError as exc:
            self._close_lifeline()
            for fd in ours:
                os.close(fd)
            raise InfrastructureError(f"sandbox ({self.plan.name}) could not start {cmd[0]!r}: {exc}") from exc
        for fd in launch_fds:
            os.close(fd)
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
                            event = parse_event(line)
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

    def private_dirs(self) -> tuple[str, ...]:
        """The shared writable dirs the launcher made private to this run (none if it never started)."""
        started = self._event("started") or {}
        return tuple(started.get("private_dirs") or ())

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
            shared_dirs_private=self.plan.name == STRONG or (
                bool(started.get("ipc_isolated")) and "/tmp" in (started.get("private_dirs") or ())),
            disk_bounded=self.plan.name == STRONG or bool(started.get("work_private")),
            signal=exit_event.get("signal"),
            cpu_time_s=exit_event.get("cpu_s"),
            max_rss_kib=exit_event.get("maxrss_kb"),
        )
