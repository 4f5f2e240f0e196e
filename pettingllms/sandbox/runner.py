"""Run one untrusted program: the public API (``Sandbox``, ``run_program``, ``default_sandbox``) and
``run_in_plan``, which runs one program in a layer already chosen.

The runner never trusts anything the program controls. It keeps the clock itself (the wall timeout is
measured here, from the moment the launcher reports the exec), reads the output with a hard cap while the
program runs, and decides the verdict from what the launcher observed (exit status, rusage) -- the launcher
is out of the program's reach (another uid, or non-dumpable in the same namespace).

Failures of the sandbox itself -- bwrap cannot mount, the launcher cannot drop privileges, the program
never started -- raise InfrastructureError. Anything that the program could cause after it started is a
verdict, never an InfrastructureError: otherwise a model could learn to turn its failures into
"infrastructure" and escape the penalty.

The pieces: ``layers`` (which layer, its command line, and choosing one), ``workdir`` (the run's private
directory), ``watcher`` (the launched run: clock, output, kill, reap), ``verdict`` (naming the outcome).
"""

from __future__ import annotations

import logging
import os
import threading

from pettingllms.core.errors import ConfigError, InfrastructureError

from . import layers, leftovers, workdir
from .layers import DEFAULT_LAYER_ENV, FALLBACK, LayerPlan
from .limits import Limits
from .result import INFRASTRUCTURE_ERROR, RunResult
from .uids import DEFAULT_LOCK_DIR, DEFAULT_SLOTS, DEFAULT_UID_BASE, REFERENCE_UID_BASE, acquire_uid_slot
from .watcher import WatchedRun

logger = logging.getLogger("pettingllms.sandbox")

SUPPORTED_LANGUAGES = ("python",)


def run_in_plan(plan: LayerPlan, *, files: dict[str, bytes], stdin: str | bytes, argv: tuple[str, ...],
                limits: Limits, workdir_root: str | None, uid_base: int, uid_slots: int, lock_dir: str) -> RunResult:
    run_dir = workdir.create_run_dir(workdir_root)
    slot = watched = None
    try:
        workdir.write_inputs(run_dir, files, stdin)
        if plan.privileged:
            # The run dir stays ours (so the sweep of the uid's leftovers never touches it) but traversable;
            # the program's uid owns what is inside.
            os.chmod(run_dir, 0o711)
            if plan.name == FALLBACK:  # in the strong layer bwrap (root) mounts the dir for the program
                workdir.check_reachable_by_others(run_dir)
            slot = acquire_uid_slot(base=uid_base, slots=uid_slots, lock_dir=lock_dir)
            workdir.give_inputs_to(run_dir, slot.uid)
        watched = WatchedRun(plan, limits, slot, run_dir)
        return watched.execute(tuple(argv), workdir.stdin_path(run_dir))
    finally:
        if slot is not None:
            if plan.name == FALLBACK:
                leftovers.sweep(slot.uid, private_dirs=watched.private_dirs() if watched else ())
            slot.release()
        workdir.remove_tree(run_dir)


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
        self.requested_layer = layers.check_layer_name(layer)
        self.limits = limits or Limits()
        self.python = python
        self.infrastructure_errors = infrastructure_errors
        self._run_kwargs = {"workdir_root": workdir_root, "uid_base": uid_base, "uid_slots": uid_slots,
                            "lock_dir": lock_dir}

    def plan(self) -> LayerPlan:
        return layers.resolve_plan(self.requested_layer, self.python, self._run_kwargs, run_in_plan)

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
        contents = workdir.program_files(source, files)
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


_reference_sandbox: Sandbox | None = None


def reference_sandbox() -> Sandbox:
    """The process-wide sandbox for trusted reference programs (a dataset's golden solutions): the layer of
    ``default_sandbox``, uids from a range of their own, so a model-written program never runs as a uid that a
    reference program used (nor beside one under the same uid)."""
    global _reference_sandbox
    with _default_lock:
        if _reference_sandbox is None:
            _reference_sandbox = Sandbox(os.environ.get(DEFAULT_LAYER_ENV, "auto"), uid_base=REFERENCE_UID_BASE)
        return _reference_sandbox


def run_program(source: str | None = None, *, argv=(), stdin: str | bytes = "",
                files: dict[str, str | bytes] | None = None, limits: Limits | None = None,
                language: str = "python") -> RunResult:
    """Run one program in the default sandbox (layer "auto") under ``limits`` (production defaults)."""
    return default_sandbox().run(source, argv=argv, stdin=stdin, files=files, limits=limits or Limits(),
                                 language=language)
