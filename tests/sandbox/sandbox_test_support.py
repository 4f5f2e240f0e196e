"""Shared helpers for the sandbox tests (a plain module: the tests dir has no conftest by design)."""

from __future__ import annotations

import time
import uuid

import pytest

from pettingllms.core.errors import InfrastructureError
from pettingllms.sandbox import Limits, Sandbox
from pettingllms.sandbox.diagnostics import processes_with_marker, zombie_children

MIB = 1 << 20

# Small limits so adversarial programs end fast; the margins below absorb a loaded 2-core CI machine.
TEST_LIMITS = Limits(
    wall_timeout_s=2.0,
    cpu_time_s=1.0,
    address_space_bytes=512 * MIB,
    max_processes=12,
    max_file_size_bytes=1 * MIB,
    max_open_files=64,
    max_output_bytes=64 * 1024,
    max_disk_bytes=8 * MIB,
)
# Start-up (bwrap + launcher + interpreter) and tear-down on top of the limit.
MARGIN_S = 3.0

_sandboxes: dict[str, Sandbox | str] = {}


def sandbox_for(layer: str) -> Sandbox:
    """A probed sandbox of exactly that layer, or a pytest skip that says why the layer is unavailable."""
    if layer not in _sandboxes:
        sandbox = Sandbox(layer, TEST_LIMITS)
        try:
            sandbox.plan()
            _sandboxes[layer] = sandbox
        except InfrastructureError as exc:
            _sandboxes[layer] = str(exc)
    found = _sandboxes[layer]
    if isinstance(found, str):
        pytest.skip(f"{layer} sandbox layer unavailable on this machine: {found}")
    return found


def new_marker() -> str:
    return f"sbx-test-marker-{uuid.uuid4().hex}"


def timed_run(sandbox: Sandbox, source: str, **kwargs):
    start = time.monotonic()
    result = sandbox.run(source, **kwargs)
    return result, time.monotonic() - start


def assert_nothing_left(marker: str) -> None:
    """No process carrying the marker survives, and we hold no zombie children."""
    deadline = time.monotonic() + 2.0  # SIGKILLed tasks can take a moment to leave /proc
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with_marker(marker) == [], "sandboxed processes survived the run"
    assert zombie_children() == [], "the runner holds zombie children"
