"""Packaging: a wheel built with ``python -m build`` carries the configs and built-in envs, installs into a fresh venv,
and its ``pettingllms`` command plans the quickstart from a directory that holds no checkout (slow lane)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_declared_dependencies_are_used():
    """Every runtime dependency is imported by the package, or its pyproject comment says why it is there."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    text = (REPO / "pyproject.toml").read_text()
    deps = tomllib.loads(text)["project"]["dependencies"]
    names = [d.split("=")[0].split(">")[0].split("<")[0].strip() for d in deps]
    assert "gymnasium" not in names and "pyyaml" not in names  # declared once, never imported
    imports = {"hydra-core": "hydra", "math-verify": "math_verify"}
    source = "\n".join(p.read_text() for p in (REPO / "pettingllms").rglob("*.py"))
    for name in names:
        module = imports.get(name, name.replace("-", "_"))
        used = f"import {module}" in source or f"from {module}" in source
        explained = f"# {name}:" in text
        assert used or explained, f"{name} is declared but neither imported nor explained in pyproject.toml"
    assert "DataProto" not in text and "single controller" not in text


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_wheel_installs_into_a_fresh_venv_and_dry_runs_the_quickstart(tmp_path):
    source = tmp_path / "source"  # a clean copy: building writes egg-info and build/ next to the sources
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    for name in files:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)], check=True,
                   capture_output=True, timeout=900)
    (wheel,) = dist.glob("pettingllms-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pettingllms/configs/quickstart.yaml" in names and "pettingllms/configs/experiment/quick_test.yaml" in names
    assert "pettingllms/envs/arith/env.py" in names and not any(n.startswith(("envs/", "tests/")) for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    uv = Path(sys.executable).parent / "uv"
    find_links = os.environ.get("PIP_FIND_LINKS", "").split()
    if uv.is_file():  # the Makefile's installer (fast, warm cache); it needs pip's find-links passed explicitly
        install = [str(uv), "pip", "install", "--python", str(python), *[a for f in find_links for a in ("--find-links", f)]]
    else:
        install = [str(python), "-m", "pip", "install", "-q"]
    done = subprocess.run([*install, str(wheel)], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HF_HUB_OFFLINE"] = "1"
    where = subprocess.run([str(python), "-c", "import pettingllms; print(pettingllms.__file__)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed wheel, not the checkout
    done = subprocess.run([str(venv / "bin" / "pettingllms"), "train", "--config-name", "quickstart", "--dry-run"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "agent:    reader -> policy_0 (adapter shared), trainable" in done.stdout  # the vault quickstart
    assert "dry run: config, plan and data checked" in done.stdout
    assert not (elsewhere / "logs").exists()
