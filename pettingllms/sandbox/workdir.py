"""The private directory of one run: the program's files, its stdin, handing them to the run's uid, and removing
everything the run left behind.

A run dir ``pettingllms-sbx-*`` holds ``work/`` (the program's files; its cwd and HOME) and ``stdin``. File names
may come from the model, so they are validated as relative paths without escapes.

Privacy between runs: run dirs are created in ``runs_root`` (by default one directory per runner uid in the temp
dir, ours and mode 0711: another run's uid can pass through it but not list it), a run dir is 0711 as root (its
uid passes through to ``work/``) and 0700 otherwise, ``work/`` and everything in it belong to the run's uid alone
(0700 / 0600), and ``stdin`` stays ours (0600; the program gets it as an open fd).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile

from pettingllms.core.errors import ConfigError, InfrastructureError

from . import layers
from .layers import MAIN_FILE
from .uids import ensure_private_dir

logger = logging.getLogger("pettingllms.sandbox")

RUN_DIR_PREFIX = "pettingllms-sbx-"
RUNS_ROOT_PREFIX = "pettingllms-sandbox-runs-"  # + the runner's uid, in the temp dir


def validate_file_name(name: str) -> str:
    """A relative path inside the work dir; the names may come from the model, so no escapes."""
    if not isinstance(name, str) or not name or "\x00" in name or name.startswith("/"):
        raise ConfigError(f"sandbox file name {name!r} must be a non-empty relative path")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise ConfigError(f"sandbox file name {name!r} may not contain empty, '.' or '..' parts")
    return name


def model_text_bytes(text: str) -> bytes:
    """UTF-8, keeping lone surrogates (model text can hold them): the program then fails like any bad program
    (a SyntaxError, say) instead of the sandbox raising before it runs."""
    return text.encode("utf-8", "surrogatepass")


def program_files(source: str | None, files: dict[str, str | bytes] | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, content in (files or {}).items():
        validate_file_name(name)
        if not isinstance(content, (str, bytes)):
            raise ConfigError(f"sandbox file {name!r} must be str or bytes, got {type(content).__name__}")
        out[name] = model_text_bytes(content) if isinstance(content, str) else content
    if source is not None:
        if MAIN_FILE in out:
            raise ConfigError(f"give the program either as source or as files[{MAIN_FILE!r}], not both")
        out[MAIN_FILE] = model_text_bytes(source)
    if MAIN_FILE not in out:
        raise ConfigError(f"no program: pass source or files[{MAIN_FILE!r}]")
    return out


# ------------------------------------------------------------------------------------------ one run dir

def default_runs_root() -> str:
    """The runner's own parent for run dirs: listable by nobody else, so runs cannot find each other."""
    root = os.path.join(tempfile.gettempdir(), f"{RUNS_ROOT_PREFIX}{os.geteuid()}")
    ensure_private_dir(root, 0o711, what="sandbox runs dir")
    return root


def create_run_dir(workdir_root: str | None) -> str:
    return tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=workdir_root or default_runs_root())


def work_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "work")


def stdin_path(run_dir: str) -> str:
    return os.path.join(run_dir, "stdin")


def write_inputs(run_dir: str, files: dict[str, bytes], stdin: str | bytes) -> None:
    """The program's files into ``work/`` and its stdin into ``stdin``."""
    work = work_dir(run_dir)
    os.mkdir(work, 0o700)
    for name, data in files.items():
        path = os.path.join(work, name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(data)
    with open(os.open(stdin_path(run_dir), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(model_text_bytes(stdin) if isinstance(stdin, str) else stdin)


def give_inputs_to(run_dir: str, uid: int) -> None:
    """The run's private uid owns ``work/``; the run dir and ``stdin`` stay ours."""
    _chown_tree(work_dir(run_dir), uid)


def _chown_tree(root: str, uid: int) -> None:
    os.chown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


def check_reachable_by_others(path: str) -> None:
    for parent in layers._parents(os.path.join(path, "x")):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            raise InfrastructureError(
                f"sandbox work dir {path} is not reachable by the program's private uid: {parent} lacks o+x; "
                "pass a workdir_root whose parents are world-traversable (the default, the system temp dir, is)"
            )


# ------------------------------------------------------------------------------------------ clean-up

def remove_tree(path: str) -> None:
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
