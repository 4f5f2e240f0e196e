"""A native crash names where it happened: in the CLI, and in the rehearsal's vLLM reload (its own process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pettingllms.core import ConfigError
from pettingllms.core.native_crashes import exit_status, report_native_crashes
from pettingllms.eval.reload import generate_with_vllm, vllm_process_failure

ROOT = Path(__file__).resolve().parents[2]


def check_env_of_a_crashing_module(tmp_path, **env) -> subprocess.CompletedProcess:
    """``pettingllms check-env`` importing a user's module that segfaults in its own function, at line 5."""
    (tmp_path / "crashing_env.py").write_text(
        "import ctypes\n\n\ndef crash():\n    ctypes.string_at(0)\n\n\ncrash()\n")
    base = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    return subprocess.run([sys.executable, "-m", "pettingllms.cli", "check-env", "--imports", "crashing_env", "math"],
                          cwd=tmp_path, env={**base, **env}, capture_output=True, text=True, timeout=120)


def test_a_segfault_in_a_users_env_module_prints_its_stack(tmp_path):
    run = check_env_of_a_crashing_module(tmp_path)
    assert run.returncode == -11, run.stderr[-2000:]
    assert "Segmentation fault" in run.stderr
    assert 'crashing_env.py", line 5 in crash' in run.stderr  # the user's line, in the Python stack


def test_children_inherit_the_crash_report_and_a_users_setting_is_kept(monkeypatch):
    monkeypatch.delenv("PYTHONFAULTHANDLER", raising=False)
    report_native_crashes()
    assert os.environ["PYTHONFAULTHANDLER"] == "1"
    monkeypatch.setenv("PYTHONFAULTHANDLER", "yes")
    report_native_crashes()
    assert os.environ["PYTHONFAULTHANDLER"] == "yes"


def test_an_empty_pythonfaulthandler_turns_the_report_off(tmp_path):
    run = check_env_of_a_crashing_module(tmp_path, PYTHONFAULTHANDLER="")
    assert run.returncode == -11 and "Fatal Python error" not in run.stderr


def test_exit_status_in_words():
    assert exit_status(1) == "exit code 1"
    assert exit_status(-11) == "signal SIGSEGV"
    assert exit_status(-9) == "signal SIGKILL"


def test_a_crash_after_generating_is_still_a_failure_and_says_when():
    message = vllm_process_failure(Path("/x/export/policy_0"), -11, "hi")
    assert message.startswith("vLLM's process reloading the export in /x/export/policy_0 ended with signal SIGSEGV "
                              "after generating 'hi'")
    assert "before generating" in vllm_process_failure(Path("/x"), -6, None)


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_reload_runs_in_its_own_process_and_its_failure_is_raised(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"reloading the export in .* ended with exit code 1 before generating"):
        generate_with_vllm(tmp_path)
