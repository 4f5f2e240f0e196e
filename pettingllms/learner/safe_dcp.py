"""Loading torch.distributed.checkpoint (DCP) folders without running code from them, and writing them without
losing a write (``CheckedWriter``, below).

DCP stores a checkpoint's index (``.metadata``) with plain pickle and loads its non-tensor entries (the optimiser's
hyper-parameters) with ``torch.load(weights_only=False)``, so a crafted checkpoint runs any command it likes when
it is loaded. Checkpoints are shared and downloaded, so every DCP load of this project goes through ``load_dcp``:
the index is unpickled admitting only the classes a DCP index is made of (found by unpickling the indexes our own
saves write: full model, LoRA, with and without optimiser state), every non-tensor entry is loaded weights-only
(DCP already loads tensor entries weights-only), and every shard file must lie inside the checkpoint's folder.
Anything else is refused with an ``UnsafeCheckpointError`` that names the file and what it referred to.
"""

from __future__ import annotations

import io
import pickle
import re
import threading
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

from pettingllms.core.errors import DamagedCheckpointError, UnsafeCheckpointError

METADATA_FILE = ".metadata"
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
# (module, name) of every global a DCP index refers to; torch's dtypes, layouts and memory formats are added below.
SAFE_GLOBALS = frozenset({
    *((_DCP_METADATA, name) for name in (
        "Metadata", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "_MEM_FORMAT_ENCODING",
    )),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # how a torch.layout pickles: a lookup in torch's own table
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # StorageMeta.checkpoint_id
    ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset"),
})
_TORCH_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format)


def _refusal(path: Path, what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(f"checkpoint {path} refers to {what}, which a checkpoint never needs: refusing to "
                                 "load it")


class _IndexUnpickler(pickle.Unpickler):
    """Unpickles only what a DCP index is made of; ``find_class`` is the only way pickle reaches code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_CONSTANTS):
            return getattr(torch, name)
        raise _Refused(f"{module}.{name}")


class _Refused(pickle.UnpicklingError):
    pass


def read_metadata(path: str | Path) -> Metadata:
    """The DCP index at ``path``, unpickled without running code from it; raises ``UnsafeCheckpointError``."""
    path = Path(path)
    try:
        with open(path, "rb") as stream:
            metadata = _IndexUnpickler(stream).load()
    except _Refused as exc:
        raise _refusal(path, str(exc)) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise UnsafeCheckpointError(f"checkpoint {path} is not a DCP index ({exc}): refusing to load it") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"checkpoint {path} holds a {type(metadata).__name__}, not a DCP index: refusing "
                                    "to load it")
    for info in (metadata.storage_data or {}).values():
        relative = getattr(info, "relative_path", None)
        if not isinstance(relative, str) or Path(relative).name != relative or relative in ("", ".", ".."):
            raise _refusal(path, f"the file {relative!r} outside its folder")
    return metadata


def load_entry(stream: BinaryIO, where: str) -> Any:
    """One non-tensor DCP entry, loaded weights-only (plain values: numbers, strings, tuples, lists, tensors)."""
    try:
        return torch.load(stream, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        named = re.search(r"GLOBAL ([\w.]+)", str(exc))
        raise _refusal(Path(where), named.group(1) if named else "objects that are not plain data") from None


class SafeFileSystemReader(FileSystemReader):
    """DCP's file-system reader, reading the index with ``read_metadata`` above instead of plain pickle."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(self._get_metadata_path(kwargs.get("rank")))
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that non-tensor entries are loaded weights-only."""

    def __init__(self, directory: Path):
        super().__init__()
        self._directory = directory

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        entry = load_entry(value, f"{self._directory} entry {read_item.dest_index.fqn!r}")
        # The default planner knows where the entry goes in a nested state dict; it unpickles it without
        # restrictions, so it is handed our own pickle of the plain value just loaded.
        safe = io.BytesIO()
        torch.save(entry, safe)
        safe.seek(0)
        super().load_bytes(read_item, safe)


def check_dcp(directory: str | Path) -> None:
    """Refuse a DCP folder that would run code when loaded, or whose shards are truncated, without loading its
    tensors: the index and every non-tensor entry are read as ``load_dcp`` reads them, and every entry's bytes must
    lie in its shard file. For a process that hands the folder to others (Ray workers), so the refusal is reported
    where the user sees it."""
    directory = Path(directory)
    metadata = read_metadata(directory / METADATA_FILE)
    sizes: dict[str, int] = {}
    for index, info in metadata.storage_data.items():  # every entry's bytes are there: no truncated or missing shard
        if info.relative_path not in sizes:
            shard = directory / info.relative_path
            sizes[info.relative_path] = shard.stat().st_size if shard.is_file() else -1
        if sizes[info.relative_path] < info.offset + info.length:
            state = "missing" if sizes[info.relative_path] < 0 else f"{sizes[info.relative_path]:,} bytes"
            raise DamagedCheckpointError(
                f"checkpoint shard {directory / info.relative_path} is {state}, but its index places "
                f"{index.fqn!r} at bytes {info.offset:,}..{info.offset + info.length:,}: the checkpoint is truncated "
                "or incomplete (a full disk, an interrupted copy); resume from an earlier step")
    for index, info in metadata.storage_data.items():
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        with open(directory / info.relative_path, "rb") as stream:
            stream.seek(info.offset)
            load_entry(io.BytesIO(stream.read(info.length)), f"{directory} entry {index.fqn!r}")


def load_dcp(state: dict[str, Any], directory: str | Path) -> None:
    """``dcp.load(state, checkpoint_id=directory)`` that cannot run code from the checkpoint (a collective when a
    process group exists, like ``dcp.load``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    directory = Path(directory)
    # Read once here first: inside dcp.load a failed index read is logged, retried with per-rank index files and
    # wrapped, which would bury the refusal.
    read_metadata(directory / METADATA_FILE)
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(directory), planner=WeightsOnlyLoadPlanner(directory))
    except CheckpointException as exc:
        refused = [error for error, _ in exc.failures.values() if isinstance(error, UnsafeCheckpointError)]
        if refused:
            raise refused[0] from None
        raise


# Writer threads per rank: torch's default is one, which wrote a Qwen3-1.7B full fine-tune's weights and AdamW state
# (24.4 GB as stored) in 42.6 s on an H100, where 8 threads took 24.2 s (benchmarks/gpu_probe.py --parts checkpoint).
WRITE_THREADS = 8


_ONE_SAVE_AT_A_TIME = threading.Lock()


class CheckedWriter(FileSystemWriter):
    """``FileSystemWriter`` with ``thread_count`` writer threads that cannot lose a write. torch's writer threads
    (2.11-2.13) report a failure only by printing it: that thread's results are missing, the save completes, and the
    index simply lacks those entries (a file-size limit hit by one thread published such a checkpoint as good). Here
    a writer thread's exception is re-raised in the saving thread, as one thread's would be (so a full disk is still
    a ``DiskFullError`` upstream), and a save whose results do not cover every planned item is refused."""

    def __init__(self, path: str | Path, thread_count: int = WRITE_THREADS) -> None:
        super().__init__(str(path), thread_count=thread_count)

    def write_data(self, plan, planner):
        # One save's writer threads at a time in a process: the failures are caught through the process-wide
        # threading.excepthook, which two overlapping saves (two policies' background checkpoints) would swap under
        # each other, losing or misfiling a failure.
        with _ONE_SAVE_AT_A_TIME, _WriterThreadFailures() as failures:
            try:
                future = super().write_data(plan, planner)
            except BaseException:
                # torch's saving thread writes too, and a failure of its own (a full disk) leaves without joining
                # the writer threads: they would go on writing into the folder the caller is about to remove.
                _join_writer_threads()
                raise
        failures.raise_first()
        results = future.wait()
        missing = {item.index for item in plan.items} - {result.index for result in results}
        if missing:
            raise OSError(f"{len(missing)} of {len(plan.items)} checkpoint entries were not written to {self.path} "
                          f"(e.g. {sorted(index.fqn for index in missing)[:3]})")
        return future


def _join_writer_threads() -> None:
    """Wait for every DCP writer thread still running (one save at a time: they are this save's)."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and _is_writer_thread(thread):
            thread.join()


def _is_writer_thread(thread: threading.Thread | None) -> bool:
    return thread is not None and "_write_files_from_queue" in thread.name


class _WriterThreadFailures:
    """Within the block, exceptions of torch's DCP writer threads are kept, not printed; other threads' pass on."""

    def __init__(self) -> None:
        self.failures: list[BaseException] = []
        self._previous = threading.excepthook

    def _keep(self, args) -> None:
        if _is_writer_thread(args.thread):
            self.failures.append(args.exc_value)
        else:
            self._previous(args)

    def __enter__(self) -> "_WriterThreadFailures":
        threading.excepthook = self._keep
        return self

    def __exit__(self, *exc: object) -> None:
        threading.excepthook = self._previous

    def raise_first(self) -> None:
        if self.failures:
            raise self.failures[0]
