"""The one data layout: ``<data_root>/<domain>/<split>/<name>.parquet``, what the loaders write and runs read."""

from __future__ import annotations

import re
from pathlib import Path

from pettingllms.core import DataError

SPLITS = ("train", "test")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def dataset_path(data_root: str | Path, domain: str, split: str, name: str) -> Path:
    """Where dataset ``name`` of ``domain`` and ``split`` lives; the name must be a plain file name."""
    if split not in SPLITS:
        raise DataError(f"split must be one of {SPLITS}, got {split!r}")
    if not _NAME.fullmatch(name):
        raise DataError(f"dataset name {name!r} must be letters, digits, '_', '-' or '.' (it becomes a file name)")
    return Path(data_root) / domain / split / f"{name}.parquet"
