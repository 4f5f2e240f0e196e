"""The checkpoint format, in one place: step directories for the run, and each policy's state within them.

    <run>/checkpoints/
        latest                      the name of the newest complete step directory (replaced atomically)
        step_000010/
            trainer_state.json      step, data cursor, config hash (the trainer's part)
            policies/<policy>/
                learner/            torch.distributed.checkpoint (DCP): trained weights (LoRA: the adapters) and
                                    AdamW state; every rank writes its own shards, a single process writes them all
                learner.json        the state every rank shares: step, LR schedule, KL coefficients, adapters, which
                                    parameters have optimizer state, how many ranks wrote it, the format version
                rank_<r>.pt         rank r's RNG state (torch's, and its engine's on engine hosts); plain tensors and
                                    numbers, loaded with ``torch.load(weights_only=True)``

Nothing in a checkpoint can run code when it is loaded: the DCP shards are read through ``learner/safe_dcp.py``
(its pickled index admits only DCP's own classes, its other entries load weights-only), the rank files load
weights-only, and the rest is JSON. Checkpoints are shared and downloaded; a tampered one is refused.

A step directory is built under a temporary name and renamed into place, then ``latest`` moves (both atomic), so
a crash at any point leaves either the old or the new checkpoint, never a half-written one that ``latest`` names.
A crash leaves the hidden temporary folder (``.step_N.tmp-*``) behind; ``remove_unfinished`` clears such folders when
the run resumes. A write that runs out of room raises ``DiskFullError`` (the cause, where, the free bytes), removes
its temporary folder and leaves ``latest`` as it was.
With ``training.async_checkpoint`` the two halves are apart: ``begin_checkpoint`` makes the temporary folder and
starts every policy's save (each rank copies its state into host buffers and writes the copy in a thread of its
own, ``start_worker_save``), the trainer trains on, and ``PendingCheckpoint.finish`` waits for the writes, then
renames the folder into place; ``latest`` moves after that. A crash while the writes run leaves ``latest`` on the
previous checkpoint.
``prune_checkpoints`` keeps the newest N (``training.max_ckpt_to_keep``). DCP writes tensors from where they live
(no device-side copy of the optimizer state) and reshards on load, so a checkpoint written by N ranks resumes on M
ranks, in one process, or loads into a plain model for evaluation and export (``load_trained_weights``). The trainer
writes through here and the evaluation reads through here; no other module knows these names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pettingllms.core import ConfigError, DamagedCheckpointError, DiskFullError, UnsafeCheckpointError
from pettingllms.core.atomic import atomic_directory, leftovers, remove_directory_aside, write_text_atomic
from pettingllms.core.file_modes import restrict_to_owner

if TYPE_CHECKING:
    import torch

    from pettingllms.learner import PolicyLearner

LATEST = "latest"
STATE_FILE = "trainer_state.json"
POLICIES_DIR = "policies"
_STEP_DIR = re.compile(r"step_\d{6,}")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def save_checkpoint(root: Path, step: int, trainer_state: dict[str, Any], write_payload: Callable[[Path], None],
                    *, private: bool = True) -> Path:
    """Create ``root/step_<step>`` atomically (replacing a re-run of the same step), then point ``latest`` at it.

    write_payload(step_dir): writes the policies' state into the (temporary) step directory, under
    ``POLICIES_DIR`` (each policy's folder by ``save_worker_state``). private: the step directory and everything in
    it are owner-only (0700 / 0600), so a copy of the checkpoint keeps out other users too; otherwise the umask's.
    """
    final = write_checkpoint(root, step, trainer_state, write_payload, private=private)
    publish_checkpoint(final, private=private)
    return final


def write_checkpoint(root: Path, step: int, trainer_state: dict[str, Any], write_payload: Callable[[Path], None],
                     *, private: bool = True) -> Path:
    """``save_checkpoint``'s first half: the complete step directory, which ``latest`` does not name yet. The
    trainer logs the step between the halves, so a run stopped there resumes from the previous checkpoint and
    logs the step again."""
    return begin_checkpoint(root, step, trainer_state, write_payload, private=private).finish(lambda: None)


class PendingCheckpoint:
    """A step directory whose policies are still being written (``begin_checkpoint``). ``finish(wait)`` waits
    (``wait()`` returns when every policy's save is complete, or raises its failure), writes the trainer's state,
    and renames the folder into place; ``abandon()`` removes it. Either, once. A failure removes the folder and
    leaves ``latest`` as it was; running out of room is a ``DiskFullError`` naming the checkpoint."""

    def __init__(self, final: Path, trainer_state: dict[str, Any], private: bool) -> None:
        self.final, self._state, self._private = final, trainer_state, private
        self._stack = ExitStack()
        self._stack.enter_context(_disk_full_named(final))
        self.tmp: Path = self._stack.enter_context(atomic_directory(final, replace=True))

    def finish(self, wait: Callable[[], None]) -> Path:
        """``wait`` joins every write (raising the first failure once all have ended); an interrupt while it waits
        (Ctrl-C) waits again, quietly, so the folder is never removed under a write still running."""
        with self._closing(drain=wait):
            wait()
            (self.tmp / STATE_FILE).write_text(json.dumps(self._state, indent=1, sort_keys=True))
            if self._private:
                restrict_to_owner(self.tmp)
        return self.final

    @contextmanager
    def _closing(self, drain: Callable[[], None] | None = None):
        """Close the folder after the block: renamed into place, or removed (the block's error, converted when the
        disk was full, is raised), once ``drain`` has let every write end."""
        try:
            yield
        except BaseException as exc:
            _quietly(drain)
            if not self._stack.__exit__(type(exc), exc, exc.__traceback__):
                raise
            return
        self._stack.__exit__(None, None, None)

    def abandon(self, drain: Callable[[], None] | None = None) -> None:
        """Remove the folder (after ``drain`` let its writes end); ``latest`` is untouched."""
        _quietly(drain)
        try:
            raise RuntimeError(f"checkpoint {self.final.name} abandoned")
        except RuntimeError as exc:
            try:
                self._stack.__exit__(type(exc), exc, exc.__traceback__)
            except RuntimeError:
                pass


def _quietly(call: Callable[[], None] | None) -> None:
    if call is None:
        return
    try:
        call()
    except BaseException:  # noqa: BLE001 - the caller is already handling the error that matters
        pass


def begin_checkpoint(root: Path, step: int, trainer_state: dict[str, Any], start_payload: Callable[[Path], None],
                     *, private: bool = True, drain: Callable[[], None] | None = None) -> PendingCheckpoint:
    """``write_checkpoint`` with its policies' writes left running: ``start_payload(step_dir)`` starts them (it
    returns once every policy's state is copied); finish the result once they are done. If starting fails, ``drain``
    lets the writes already started end before the folder is removed."""
    pending = PendingCheckpoint(Path(root) / step_dir_name(step), trainer_state, private)
    try:
        start_payload(pending.tmp)
    except BaseException:
        with pending._closing(drain=drain):  # removes the folder; a full disk's error named
            raise
    return pending


def publish_checkpoint(step_dir: Path, *, private: bool = True) -> None:
    """``save_checkpoint``'s second half: point ``latest`` at ``step_dir``, written by ``write_checkpoint``."""
    root = step_dir.parent
    with _disk_full_named(step_dir):
        write_text_atomic(root / LATEST, step_dir.name)
        if private:
            restrict_to_owner(root / LATEST)


@contextmanager
def _disk_full_named(step_dir: Path):
    """A write that ran out of room names the checkpoint, the one kept, and what to do."""
    try:
        yield
    except DiskFullError as exc:
        good = latest_checkpoint(step_dir.parent)
        kept = f"the last good checkpoint, {good.name}, is kept ({LATEST} is unchanged)" if good else "none was before"
        raise DiskFullError(f"checkpoint {step_dir.name} was not written: {exc}; {kept}. Free some space, then resume "
                            "(training.resume=auto)") from exc


def remove_unfinished(root: Path) -> list[tuple[str, int]]:
    """Delete the temporary and half-deleted folders (``.step_N.tmp-*``, ``.step_N.old-*``) that a process stopped
    while writing or pruning left in ``root``. Returns (name, bytes) of each. Call it before this run writes a
    checkpoint; nothing is deleted while ``latest`` names a missing step (a replaced step's only copy may be one
    of them)."""
    found = leftovers(root)
    pointer = Path(root) / LATEST
    if not found or (pointer.is_file() and latest_checkpoint(root) is None):
        return []
    removed = []
    for path in found:
        if path.is_dir():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path, ignore_errors=True)
        else:  # a half-written `latest` pointer
            size = path.stat().st_size
            path.unlink(missing_ok=True)
        removed.append((path.name, size))
    return removed


def prune_checkpoints(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` step directories (``keep <= 0``: keep every one). The checkpoint that
    ``latest`` names is never deleted. Returns the deleted directories, oldest first."""
    if keep <= 0 or not root.is_dir():
        return []
    steps = sorted((p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name)), key=lambda p: p.name)
    latest = latest_checkpoint(root)
    doomed = [p for p in steps[:-keep] if latest is None or p.name != latest.name]
    for path in doomed:
        remove_directory_aside(path)  # never a half-deleted step directory that looks like a checkpoint
    return doomed


def branch_from(checkpoint: Path, *, private: bool = True) -> list[Path]:
    """A run resumed from an earlier checkpoint than the one ``latest`` names starts a new branch there: ``latest``
    names ``checkpoint`` from now on, and the later step directories (the branch left behind) move into
    ``abandoned_after_<step>_*/``, kept, outside what a resume or ``prune_checkpoints`` looks at. Without it a stop
    before this branch's first checkpoint resumed the abandoned branch, and pruning kept its higher steps over this
    one's. Returns where the moved directories are now."""
    root = checkpoint.parent
    if latest_checkpoint(root) == checkpoint:  # the usual resume (auto): the same branch, a step written past
        return []                              # `latest` but never logged is simply written again
    later = sorted(p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name) and p.name > checkpoint.name)
    moved = []
    if later:
        aside = Path(tempfile.mkdtemp(prefix=f"abandoned_after_{checkpoint.name}_", dir=root))
        for path in later:
            os.rename(path, aside / path.name)
            moved.append(aside / path.name)
    publish_checkpoint(checkpoint, private=private)
    return moved


def latest_checkpoint(root: Path) -> Path | None:
    """The step directory ``<root>/latest`` names, or None. A pointer that leaves ``root`` (a path, ``..``, a
    symlinked step) is refused: a run's files name only what lies inside the run."""
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    path = Path(root) / name
    if not re.fullmatch(r"step_\d+", name) or not _inside(path, Path(root)):
        raise UnsafeCheckpointError(f"{pointer} points to {name!r}, not a step directory inside {root}: refused (a "
                                    f"run's checkpoint pointer names one of its own step_N folders)")
    return path if (path / STATE_FILE).is_file() else None


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path``, every symlink resolved, lies inside ``root`` (itself resolved)."""
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / STATE_FILE).read_text())


def policy_dir(checkpoint: Path, policy: str) -> Path:
    """A policy's state folder inside a step directory."""
    return Path(checkpoint) / POLICIES_DIR / policy


# ---------------------------------------------------------------------------------------------- a policy's state
FORMAT = 2
SHARDS_DIR = "learner"
META_FILE = "learner.json"
RANK_FILE = "rank_{rank}.pt"
SNAPSHOTS_DIR = "snapshots"  # an opponent-pool worker's past versions (runtime/snapshots.py), in its policy folder
OLD_FORMAT_FILES = ("worker_state.pt", "fsdp_state.pt")  # format 1 (before November 2026), not readable any more


@contextmanager
def _quiet_single_process():
    """DCP warns on every call that it saves/loads "in a single process" when no process group exists: that is
    this format's one-rank case, not a problem."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save_worker_state(folder: Path, learner: "PolicyLearner | None", rank: int, world_size: int,
                      engine_rng: Any = None) -> None:
    """Write one rank's part of a policy's state into ``folder`` (a collective when the learner is sharded)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    with _quiet_single_process():
        meta = learner.save_sharded(folder / SHARDS_DIR) if learner is not None else None
    torch.save({"torch_rng": torch.get_rng_state(), "engine_rng": engine_rng}, folder / RANK_FILE.format(rank=rank))
    if rank == 0:
        (folder / META_FILE).write_text(json.dumps({"format": FORMAT, "world_size": world_size, "learner": meta},
                                                   indent=1, sort_keys=True))


class WorkerSave:
    """One rank's save running in a thread of its own (``start_worker_save``); ``wait`` re-raises its failure."""

    def __init__(self, write: Callable[[], None], name: str) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(write,), name=name, daemon=True)
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            with _quiet_single_process():
                write()
        except BaseException as exc:  # re-raised in the waiting thread
            self._error = exc

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def start_worker_save(folder: Path, learner: "PolicyLearner | None", rank: int, world_size: int,
                      engine_rng: Any = None, process_group: Any = None) -> WorkerSave | None:
    """``save_worker_state`` whose learner shards are written in the background: the learner's state is copied into
    host buffers first (``PolicyLearner.stage_sharded``), so training may go on at once. The RNG and meta files are
    written now. None when there is nothing to write in the background (no learner).

    ``process_group``: a sharded learner's (FSDP) save is a collective; it runs as DCP's ``async_save`` on this group
    (gloo, kept for checkpoints: training's collectives never share a group with the writing thread)."""

    from pettingllms.learner.state import write_staged

    folder.mkdir(parents=True, exist_ok=True)
    if learner is not None and process_group is not None:
        saving, meta = learner.save_sharded_async(folder / SHARDS_DIR, process_group)
        try:
            _write_rank_files(folder, rank, world_size, engine_rng, meta)
        except BaseException:
            # The upload already runs: let it end before the caller removes the folder. Left running, it would write
            # on unawaited (DCP makes its folders again, under a hidden name) and its own error would go unseen.
            _quietly(saving.result)
            raise
        return WorkerSave(saving.result, f"checkpoint-{folder.name}-rank{rank}")
    staged, meta = learner.stage_sharded() if learner is not None else (None, None)
    _write_rank_files(folder, rank, world_size, engine_rng, meta)
    if staged is None:
        return None
    return WorkerSave(lambda: write_staged(staged, folder / SHARDS_DIR), f"checkpoint-{folder.name}-rank{rank}")


def _write_rank_files(folder: Path, rank: int, world_size: int, engine_rng: Any, meta: Any) -> None:
    """A rank's RNG file, and on rank 0 the policy's meta: written at once by an asynchronous save."""
    import torch

    torch.save({"torch_rng": torch.get_rng_state(), "engine_rng": engine_rng}, folder / RANK_FILE.format(rank=rank))
    if rank == 0:
        (folder / META_FILE).write_text(json.dumps({"format": FORMAT, "world_size": world_size, "learner": meta},
                                                   indent=1, sort_keys=True))


def read_meta(folder: Path, policy: str) -> dict[str, Any]:
    """``learner.json`` of a policy's checkpoint folder; a clear error for a missing or older-format one."""
    path = folder / META_FILE
    if not path.is_file():
        old = [name for name in OLD_FORMAT_FILES if (folder / name).is_file()]
        if old:
            raise ConfigError(
                f"checkpoint of policy {policy!r} in {folder} has the old format ({old[0]}); this version reads only "
                f"format {FORMAT} (DCP shards + {META_FILE}). Evaluate it with the version that wrote it, or retrain"
            )
        raise ConfigError(f"no checkpoint for policy {policy!r}: {path} does not exist")
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT:
        raise ConfigError(f"{path} has format {meta.get('format')!r}; this version reads format {FORMAT}")
    return meta


def load_worker_state(folder: Path, learner: "PolicyLearner | None", rank: int, policy: str) -> Any:
    """Restore one rank's part of a policy's state (a collective when sharded); returns its engine's RNG state
    (None when the saving run had no engine on this rank, e.g. it had fewer engines)."""
    import torch

    meta = read_meta(folder, policy)
    if learner is not None:
        if meta["learner"] is None:
            raise ConfigError(f"checkpoint of policy {policy!r} in {folder} holds no learner state (it was frozen)")
        with _quiet_single_process():
            learner.load_sharded(folder / SHARDS_DIR, meta["learner"])
    rank_path = folder / RANK_FILE.format(rank=rank)
    if not rank_path.is_file():  # a rank the saving run did not have keeps its seeded RNG
        return None
    state = read_rank_state(rank_path)
    torch.set_rng_state(state["torch_rng"])
    return state["engine_rng"]


def read_rank_state(path: Path) -> dict[str, Any]:
    """A rank's RNG state file, weights-only; one line naming the file when it is damaged or not ours."""
    import re

    import torch

    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a refused global, a truncated zip, bad bytes: torch raises many types
        named = re.search(r"GLOBAL ([\w.]+)", str(exc))  # weights_only refused to build this: not plain data
        if named:
            raise UnsafeCheckpointError(f"checkpoint file {path} refers to {named.group(1)}, which a checkpoint "
                                        "never needs: refusing to load it") from None
        raise DamagedCheckpointError(f"checkpoint file {path} cannot be read ({type(exc).__name__}; not a torch file, "
                                     "or cut short): it is damaged; resume from an earlier step") from None
    if not isinstance(state, dict) or "torch_rng" not in state or "engine_rng" not in state:
        raise DamagedCheckpointError(f"checkpoint file {path} is not a rank's RNG state (no torch_rng/engine_rng)")
    return state


def check_checkpoint(checkpoint: Path) -> None:
    """Refuse a step directory whose learner state would run code when loaded (``learner/safe_dcp.py``), before
    it is handed to the workers: a refusal raised here reaches the user as one line, not wrapped by Ray."""
    from pettingllms.learner.safe_dcp import check_dcp

    checkpoint = Path(checkpoint)
    for path in sorted(checkpoint.rglob("*")):  # nothing of a step directory may lead out of it
        if path.is_symlink() or not _inside(path, checkpoint):
            target = path.resolve() if path.exists() else "a missing file"
            raise UnsafeCheckpointError(f"{path} is a symlink to {target}: a checkpoint's files must lie inside its "
                                        f"step directory ({checkpoint}); refused")
    for shards in sorted((checkpoint / POLICIES_DIR).glob(f"*/{SHARDS_DIR}")):
        check_dcp(shards)
    for rank_path in sorted((checkpoint / POLICIES_DIR).glob("*/rank_*.pt")):
        read_rank_state(rank_path)


def load_trained_weights(model: "torch.nn.Module", folder: Path, policy: str,
                         adapters: Sequence[str] = ()) -> dict[str, Any] | None:
    """Load a policy checkpoint's trained weights into a plain (unsharded) model built like the trainer's: the same
    base, and LoRA adapters named like the trained ones (all of them, or the subset an evaluation runs).

    Returns ``{"step": learner step, "adapters": [...]}``, or None when the policy was never trained in that run
    (frozen): the model keeps its base weights. For evaluation and export.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    from pettingllms.learner.safe_dcp import load_dcp
    from pettingllms.learner.weights import trained_parameter_names

    meta = read_meta(folder, policy)
    if meta["learner"] is None:
        return None
    saved = list(meta["learner"].get("adapter_names", []))
    missing = [a for a in adapters if a not in saved]
    if missing:
        raise ConfigError(f"the model needs LoRA adapters {missing} of policy {policy!r}, but the checkpoint in {folder} "
                          f"trained {saved}")
    if saved and not adapters:
        raise ConfigError(f"policy {policy!r} was trained with LoRA adapters {saved}; build the model with them")
    if adapters and not saved:
        raise ConfigError(f"policy {policy!r} is set up with LoRA adapters {list(adapters)} but {folder} holds full "
                          "weights")
    names = set(trained_parameter_names(model, list(adapters)))
    state = {"model": {k: v for k, v in get_model_state_dict(model).items() if k in names}}
    try:
        with _quiet_single_process():
            load_dcp(state, folder / SHARDS_DIR)
    except UnsafeCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - DCP raises several types for a mismatch
        raise ConfigError(f"checkpoint weights of policy {policy!r} in {folder} do not fit the model: {exc}") from exc
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=False))
    return {"step": meta["learner"]["step"], "adapters": list(adapters), "tensors": len(state["model"])}
