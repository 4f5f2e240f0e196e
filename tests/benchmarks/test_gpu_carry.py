"""benchmarks/gpu_carry.py: what is carried to a lent GPU machine, and the parts' round trip there, one device call
per part, with nothing lost or altered on the way (offline: a small site folder stands in for vLLM's)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_carry  # noqa: E402


def test_carried_are_what_the_machine_lacks_or_holds_at_another_version():
    pinned = ["vllm==0.26.0", "Typing_Extensions==4.16.0", "torch==2.11.0", "PyNvVideoCodec==2.0.4",
              "transformers==5.10.4", "pydantic-core==2.50.5", "numpy==2.3.5", "flashinfer-python==0.6.14"]
    assert gpu_carry.to_carry(pinned) == ["pydantic-core==2.50.5", "transformers==5.10.4", "vllm==0.26.0"]


def test_the_project_requirements_take_the_machine_torch():
    requirements = gpu_carry.project_requirements()
    assert gpu_carry.MACHINE_TORCH in requirements
    assert not [r for r in requirements if r.startswith("torch==") and r != gpu_carry.MACHINE_TORCH]
    assert "verl==0.9.1" in requirements and "ray==2.60.0" in requirements


def _site(root: Path) -> Path:
    site = root / "site"
    (site / "pkg" / "sub").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("VALUE = 7\n")
    (site / "pkg" / "sub" / "data.bin").write_bytes(os.urandom(300_000))  # incompressible: several parts
    binary = site / "pkg" / "server"
    binary.write_bytes(b"#!/bin/sh\necho served\n")
    binary.chmod(0o755)
    return site


def _carry(manifest: dict, packed: Path, call: Path, names: list[str]) -> Path:
    """What one device call brings: the manifest and the named parts."""
    call.mkdir()
    (call / gpu_carry.MANIFEST).write_text(json.dumps(manifest))
    for name in names:
        (call / name).write_bytes((packed / name).read_bytes())
    return call


def test_parts_received_one_call_at_a_time_unpack_to_the_same_site(tmp_path):
    site = _site(tmp_path)
    packed = tmp_path / "packed"
    packed.mkdir()
    manifest = gpu_carry.write_parts(site, packed, 100_000, tmp_path / "site.tar.xz", {"vllm": "test"})
    names = [part["name"] for part in manifest["parts"]]
    assert len(names) >= 3 and all((packed / n).stat().st_size <= 100_000 for n in names)

    spool, there = tmp_path / "spool", tmp_path / "there"
    assert not gpu_carry.receive(_carry(manifest, packed, tmp_path / "call1", names[:1]), spool, there)
    assert not (there / ".gpu-carry-complete").exists()
    assert gpu_carry.receive(_carry(manifest, packed, tmp_path / "call2", names[1:]), spool, there)
    for path in site.rglob("*"):
        copy = there / path.relative_to(site)
        if path.is_file():
            assert copy.read_bytes() == path.read_bytes()
    assert stat.S_IMODE((there / "pkg" / "server").stat().st_mode) == 0o755  # Ray's servers must stay executable
    assert gpu_carry.receive(_carry(manifest, packed, tmp_path / "call3", []), spool, there)  # already complete


def test_a_part_altered_on_the_way_is_refused(tmp_path):
    packed = tmp_path / "packed"
    packed.mkdir()
    manifest = gpu_carry.write_parts(_site(tmp_path), packed, 100_000, tmp_path / "site.tar.xz", {})
    call = _carry(manifest, packed, tmp_path / "call", [p["name"] for p in manifest["parts"]])
    damaged = call / manifest["parts"][1]["name"]
    data = bytearray(damaged.read_bytes())
    data[10] ^= 1
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum differs"):
        gpu_carry.receive(call, tmp_path / "spool", tmp_path / "there")
    assert not (tmp_path / "there" / ".gpu-carry-complete").exists()


def test_a_stripped_file_missing_from_the_build_is_an_error_not_a_silent_skip(tmp_path):
    (tmp_path / "vllm").mkdir()
    with pytest.raises(FileNotFoundError, match="STRIPPED is out of date"):
        gpu_carry.strip(tmp_path)


def test_check_names_each_import_that_fails():
    assert gpu_carry.check(["json", "a_module_nobody_has", "email.parser"]) == [
        "a_module_nobody_has: ModuleNotFoundError: No module named 'a_module_nobody_has'"]
    assert gpu_carry.check(["json"]) == []


@pytest.mark.bench
def test_gpu_carry_quick_receives_and_checks_through_its_command_line(tmp_path):
    """The commands a lent machine runs: one ``receive`` per call, then ``check``, as processes."""
    import subprocess

    packed = tmp_path / "packed"
    packed.mkdir()
    manifest = gpu_carry.write_parts(_site(tmp_path), packed, 200_000, tmp_path / "site.tar.xz", {})
    script = str(ROOT / "benchmarks" / "gpu_carry.py")
    spool, there = tmp_path / "spool", tmp_path / "there"
    for index, part in enumerate(manifest["parts"]):
        call = _carry(manifest, packed, tmp_path / f"call{index}", [part["name"]])
        run = subprocess.run([sys.executable, script, "receive", str(call), "--spool", str(spool), "--site",
                              str(there), "--no-check"], capture_output=True, text=True, timeout=120)
        last = index == len(manifest["parts"]) - 1
        assert run.returncode == (0 if last else 3), run.stdout + run.stderr  # 3: parts still to come
    assert (there / "pkg" / "__init__.py").read_text() == "VALUE = 7\n"
    check = subprocess.run([sys.executable, script, "check", "pkg"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(there)})
    assert check.returncode == 0 and "all 1 imports succeed" in check.stdout, check.stdout + check.stderr
