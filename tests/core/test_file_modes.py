"""Atomic writes give the mode an ordinary open/mkdir would (the umask's), never a wider fixed one."""

from __future__ import annotations

import os
import stat

import pytest

from pettingllms.core.atomic import atomic_directory, write_text_atomic
from pettingllms.core.file_modes import current_umask, restrict_to_owner


@pytest.fixture
def umask():
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o077, 0o600, 0o700), (0o022, 0o644, 0o755),
                                                        (0o027, 0o640, 0o750)],
                         ids=["umask077", "umask022", "umask027"])
def test_atomic_writes_follow_the_umask(tmp_path, umask, mask, file_mode, dir_mode):
    umask(mask)
    assert current_umask() == mask
    written = write_text_atomic(tmp_path / "file.txt", "x")
    with atomic_directory(tmp_path / "folder", replace=True) as tmp:
        (tmp / "inner").write_text("y")
    assert stat.S_IMODE(written.stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "folder").stat().st_mode) == dir_mode


def test_restrict_to_owner_takes_group_and_other_bits_off_a_tree(tmp_path, umask):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("x")
    os.chmod(tmp_path / "a" / "b" / "f", 0o755)
    restrict_to_owner(tmp_path / "a")
    tree = (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "f")
    assert [stat.S_IMODE(p.stat().st_mode) for p in tree] == [0o700, 0o700, 0o700]
