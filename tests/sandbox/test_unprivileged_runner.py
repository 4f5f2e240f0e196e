"""The code paths of a runner that is not root (strong layer in a user namespace, fallback without a private
uid), exercised here by running a small script as an unprivileged uid. Only possible when the tests run as
root and a system python the unprivileged uid can reach exists."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import tempfile

import pytest

from pettingllms.sandbox.uids import DEFAULT_UID_BASE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNPRIVILEGED_UID = DEFAULT_UID_BASE - 7  # outside the slot range, no account

SCRIPT = r'''
import os, sys, textwrap
sys.path.insert(0, REPO)
from pettingllms.core.errors import InfrastructureError
from pettingllms.sandbox import Limits, Sandbox
from pettingllms.sandbox.diagnostics import processes_with_marker
limits = Limits(wall_timeout_s=3, cpu_time_s=2, address_space_bytes=512 << 20, max_processes=8)
fork_counter = textwrap.dedent("""
    import os, sys, time
    forks = 0
    for _ in range(100):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            if forks == 0:
                os.setsid()  # one escapee in its own session
            time.sleep(60)
            os._exit(0)
        forks += 1
    print(forks)
""")
out = {}
for layer in ("strong", "fallback"):
    sandbox = Sandbox(layer, limits)
    try:
        sandbox.plan()
    except InfrastructureError as exc:
        out[layer] = "unavailable: " + str(exc)[:300]
        continue
    forks = sandbox.run(fork_counter, argv=(MARKER,))
    ids = sandbox.run("import os\nprint(os.getuid())")
    out[layer] = {"forks": forks.stdout.strip(), "verdict": forks.verdict, "uid": ids.stdout.strip(),
                  "survivors": processes_with_marker(MARKER), "net": ids.network_isolated}
print(repr(out))
'''


def test_unprivileged_runner_caps_processes_and_kills_escapees():
    if os.geteuid() != 0:
        pytest.skip("needs root to start the unprivileged runner")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 in /usr/bin for the unprivileged uid")
    home = tempfile.mkdtemp(prefix="sbx-unpriv-")
    os.chown(home, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    script = SCRIPT.replace("REPO", repr(REPO)).replace("MARKER", repr(f"sbx-unpriv-{os.getpid()}"))
    try:
        proc = subprocess.run([python, "-c", script], user=UNPRIVILEGED_UID, group=UNPRIVILEGED_UID, extra_groups=[],
                              env={"PATH": "/usr/bin:/bin", "HOME": home}, cwd=home, capture_output=True, text=True,
                              timeout=120)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if proc.returncode != 0 and ("ModuleNotFoundError" in proc.stderr or "Permission denied" in proc.stderr):
        pytest.skip(f"the unprivileged uid cannot import the checkout with {python}: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr
    out = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    fallback = out["fallback"]
    assert isinstance(fallback, dict), fallback
    assert fallback["verdict"] == "ok" and fallback["uid"] == str(UNPRIVILEGED_UID)
    assert int(fallback["forks"]) == 7  # max_processes=8, the program included; exact when nothing else runs
    assert fallback["survivors"] == []
    strong = out["strong"]
    if isinstance(strong, str):
        pytest.skip(f"strong layer without root {strong}")
    assert strong["verdict"] == "ok" and strong["net"] is True
    assert int(strong["forks"]) == 7  # counted in the sandbox's own user namespace
    assert strong["survivors"] == []
