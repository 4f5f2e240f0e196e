"""A write that runs out of room is named (cause, path, free bytes), and a line log never keeps a torn line.
EFBIG is a real OS fault: a child process with a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

from pettingllms.core.disk_full import disk_full_error

# Appends two lines to argv[1] under a 100-byte file size limit: the first fits, the second does not.
APPEND_PAST_THE_LIMIT = """
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
from pettingllms.core.atomic import append_whole
append_whole(sys.argv[1], "x" * 60 + "\\n")
try:
    append_whole(sys.argv[1], "y" * 60 + "\\n")
except Exception as exc:
    print(json.dumps([type(exc).__name__, str(exc)]))
"""


def test_an_append_past_a_file_size_limit_is_named_and_leaves_no_torn_line(tmp_path):
    path = tmp_path / "summary.log"
    child = subprocess.run([sys.executable, "-c", APPEND_PAST_THE_LIMIT, str(path)], capture_output=True, text=True,
                           timeout=60)
    kind, message = json.loads(child.stdout)
    assert kind == "DiskFullError"
    assert message.startswith("file too large (this process may not write a file past 100 bytes: RLIMIT_FSIZE")
    assert f"while writing {path} (" in message and "bytes free there)" in message
    assert path.read_text() == "x" * 60 + "\n"  # the part of the second line that fit was cut back


def test_other_errors_are_not_called_a_full_disk(tmp_path):
    assert disk_full_error(PermissionError(errno.EACCES, "Permission denied"), tmp_path) is None
    assert disk_full_error(RuntimeError("CUDA error: device-side assert triggered"), tmp_path) is None
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert str(disk_full_error(wrapped, tmp_path)).startswith(f"no space left on device while writing {tmp_path} (")
