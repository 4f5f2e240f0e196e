"""The sandbox contract on ordinary programs, input validation, layer choice and infrastructure errors."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile

import pytest

from pettingllms.core.errors import ConfigError, InfrastructureError
from pettingllms.sandbox import FALLBACK, STRONG, Limits, Sandbox, run_program
from pettingllms.sandbox import layers as layers_module
from pettingllms.sandbox.verdict import decide_verdict
from pettingllms.sandbox.workdir import program_files

from sandbox_test_support import TEST_LIMITS, sandbox_for


@pytest.fixture(params=[STRONG, FALLBACK])
def sandbox(request):
    return sandbox_for(request.param)


def test_stdin_argv_files_and_exit_code_pass_through(sandbox):
    source = (
        "import sys, os\n"
        "print(input()[::-1], sys.argv[1:], open('data/in.txt').read(), open('blob.bin', 'rb').read())\n"
        "print(os.getcwd() == os.environ['HOME'])\n"
        "sys.exit(7)\n"
    )
    files = {"data/in.txt": "hello", "blob.bin": b"\x00\x01"}
    result = sandbox.run(source, stdin="abc\n", argv=("x", "y z"), files=files, limits=TEST_LIMITS)
    assert result.verdict == "ok"
    assert result.exit_code == 7
    assert result.stdout == "cba ['x', 'y z'] hello b'\\x00\\x01'\nTrue\n"
    assert result.layer == sandbox.layer


def test_program_given_as_files_main(sandbox):
    result = sandbox.run(files={"main.py": "import helper\nhelper.hi()\n", "helper.py": "def hi():\n    print('hi')\n"},
                         limits=TEST_LIMITS)
    assert (result.verdict, result.exit_code, result.stdout) == ("ok", 0, "hi\n")
    assert result.succeeded


def test_runtime_error_is_ok_verdict_with_nonzero_exit(sandbox):
    result = sandbox.run("raise ValueError('boom')", limits=TEST_LIMITS)
    assert result.verdict == "ok" and result.exit_code == 1
    assert "ValueError: boom" in result.stderr
    assert not result.succeeded


def test_program_killed_by_a_signal(sandbox):
    result = sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", limits=TEST_LIMITS)
    assert result.verdict == "killed"
    assert result.exit_code is None and result.signal == signal.SIGKILL


def test_environment_is_the_allow_list(sandbox):
    result = sandbox.run("import os\nprint(sorted(os.environ))\n", limits=TEST_LIMITS)
    assert result.stdout.strip() == str(sorted(layers_module.program_env("h", "t")))


@pytest.fixture
def reachable_dir():
    """A fresh dir that a private uid can traverse (pytest's tmp_path sits under a 0700 dir)."""
    path = tempfile.mkdtemp(prefix="sbx-test-root-")
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_work_dir_is_removed_afterwards(sandbox, reachable_dir):
    own = Sandbox(sandbox.requested_layer, TEST_LIMITS, workdir_root=reachable_dir)
    result = own.run("open('left-behind', 'w').write('x')\nimport os\nprint(os.getcwd())\n")
    assert result.verdict == "ok" and result.stdout.strip()
    assert os.listdir(reachable_dir) == []


def test_unreachable_work_dir_root_is_named(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root drops programs to a private uid")
    sandbox_for(FALLBACK)
    os.chmod(tmp_path, 0o700)
    with pytest.raises(InfrastructureError, match="not reachable by the program's private uid"):
        Sandbox(FALLBACK, TEST_LIMITS, workdir_root=str(tmp_path)).run("print(1)")


def test_run_program_uses_production_defaults():
    result = run_program("print(sum(range(10)))")
    assert (result.verdict, result.stdout) == ("ok", "45\n")
    assert result.layer in (STRONG, FALLBACK)


# ---------------------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("name", ["../escape.py", "/etc/passwd", "a/../../b", "", "a//b", "./x"])
def test_file_names_that_could_escape_are_refused(name):
    with pytest.raises(ConfigError):
        program_files("print(1)", {name: "x"})


def test_program_must_be_given_exactly_once():
    with pytest.raises(ConfigError, match="no program"):
        program_files(None, {"other.py": "x"})
    with pytest.raises(ConfigError, match="not both"):
        program_files("print(1)", {"main.py": "x"})


@pytest.mark.parametrize("field", ["wall_timeout_s", "cpu_time_s", "max_processes", "max_output_bytes"])
def test_limits_reject_non_positive_values(field):
    with pytest.raises(ConfigError, match=field):
        Limits(**{field: 0})


def test_limits_reject_values_python_cannot_start_with():
    with pytest.raises(ConfigError, match="address_space_bytes"):
        Limits(address_space_bytes=1 << 20)


def test_unknown_layer_and_language_are_refused():
    with pytest.raises(ConfigError, match="layer"):
        Sandbox("docker")
    with pytest.raises(ConfigError, match="language"):
        Sandbox().run("print(1)", language="cobol")


# ---------------------------------------------------------------------------------------------- verdict logic

def verdict(kill_reason=None, stderr="", **exit_fields):
    event = {"exit_code": None, "signal": None, "cpu_s": 0.1, **exit_fields} if exit_fields else None
    return decide_verdict(kill_reason=kill_reason, exit_event=event, stderr=stderr, limits=TEST_LIMITS)


def test_verdict_rules():
    assert verdict(exit_code=0) == "ok"
    assert verdict(exit_code=1) == "ok"
    assert verdict(exit_code=1, stderr="Traceback\nMemoryError\n") == "memory"
    assert verdict(exit_code=0, stderr="MemoryError\n") == "ok"  # printed, not raised
    assert verdict(signal=signal.SIGXCPU) == "timeout"
    assert verdict(signal=signal.SIGKILL, cpu_s=2.5) == "timeout"  # past the hard CPU limit
    assert verdict(signal=signal.SIGKILL, cpu_s=0.1) == "killed"
    assert verdict(signal=signal.SIGSEGV) == "killed"
    assert verdict(kill_reason="timeout", exit_code=0) == "timeout"
    assert verdict(kill_reason="output-limit", exit_code=0) == "output-limit"
    assert verdict() == "killed"  # launcher gone after the start: never "ok", never infrastructure


# ---------------------------------------------------------------------------------------------- infrastructure

def test_sandbox_that_cannot_start_raises_infrastructure_error():
    broken = Sandbox(FALLBACK, TEST_LIMITS, python="/nonexistent/python3")
    with pytest.raises(InfrastructureError, match="/nonexistent/python3"):
        broken.run("print(1)")


def test_infrastructure_error_as_a_verdict_when_asked():
    broken = Sandbox(FALLBACK, TEST_LIMITS, python="/nonexistent/python3", infrastructure_errors="verdict")
    result = broken.run("print(1)")
    assert result.verdict == "infrastructure-error"
    assert "/nonexistent/python3" in result.infrastructure_message


def test_setup_failure_inside_the_launcher_is_infrastructure(sandbox, monkeypatch):
    # A program path the launcher cannot exec: the program never ran, so this is not a verdict.
    def bad_argv(interpreter, main_path, argv):
        return ["/nonexistent/interpreter", main_path, *argv]

    monkeypatch.setattr(layers_module, "program_argv", bad_argv)
    with pytest.raises(InfrastructureError, match="setup-error"):
        sandbox.run("print(1)", limits=TEST_LIMITS)


@pytest.fixture
def fresh_layer_cache():
    layers_module.clear_layer_cache()
    yield
    layers_module.clear_layer_cache()


def test_strong_layer_without_bwrap_fails_closed(monkeypatch, fresh_layer_cache):
    monkeypatch.setattr(layers_module, "find_bwrap", lambda: None)
    with pytest.raises(InfrastructureError, match="bubblewrap"):
        Sandbox(STRONG).plan()


def test_auto_layer_falls_back_with_a_logged_reason(monkeypatch, caplog, fresh_layer_cache):
    if os.geteuid() != 0:
        pytest.skip("auto falls back only for a root runner")
    monkeypatch.setattr(layers_module, "find_bwrap", lambda: None)
    with caplog.at_level(logging.WARNING, logger="pettingllms.sandbox"):
        plan = Sandbox("auto").plan()
    assert plan.name == FALLBACK
    assert any("bubblewrap" in record.getMessage() for record in caplog.records)


def test_auto_layer_falls_back_when_bwrap_is_broken(monkeypatch, caplog, fresh_layer_cache):
    if os.geteuid() != 0:
        pytest.skip("auto falls back only for a root runner")
    monkeypatch.setattr(layers_module, "find_bwrap", lambda: "/bin/false")
    with caplog.at_level(logging.WARNING, logger="pettingllms.sandbox"):
        plan = Sandbox("auto").plan()
    assert plan.name == FALLBACK
    assert any("does not work here" in record.getMessage() for record in caplog.records)


def test_auto_without_root_and_without_strong_layer_fails_closed(monkeypatch, fresh_layer_cache):
    monkeypatch.setattr(layers_module, "find_bwrap", lambda: None)
    monkeypatch.setattr(layers_module, "_runner_is_root", lambda: False)
    with pytest.raises(InfrastructureError, match="PETTINGLLMS_SANDBOX_LAYER=fallback"):
        Sandbox("auto").plan()


def test_auto_prefers_the_strong_layer_where_bwrap_works(fresh_layer_cache):
    if layers_module.find_bwrap() is None:
        pytest.skip("bubblewrap is not installed (scripts/install_system_deps.sh installs it)")
    sandbox_for(STRONG)  # skips with the reason when bwrap is installed but cannot work here
    assert Sandbox("auto").layer == STRONG


def test_fallback_as_root_needs_an_interpreter_the_private_uid_can_reach(fresh_layer_cache):
    if os.geteuid() != 0:
        pytest.skip("only root drops programs to a private uid")
    root_only = os.path.realpath(sys.executable)
    reachable = all(os.stat(d).st_mode & 0o001 for d in layers_module._parents(root_only))
    if reachable:
        pytest.skip(f"{root_only} is reachable by other uids here")
    with pytest.raises(InfrastructureError, match="fallback layer with"):
        Sandbox(FALLBACK, python=root_only).plan()


def test_tiny_output_limit_is_enforced_from_the_first_bytes(sandbox):
    tiny = Limits(wall_timeout_s=2.0, cpu_time_s=1.0, max_output_bytes=10)
    result = sandbox.run("print('x' * 100000)", limits=tiny)
    assert result.verdict == "output-limit"
    assert result.stdout == "x" * 10 and result.stdout_truncated


@pytest.mark.parametrize("privileged", [True, False])
def test_strong_command_isolates_and_binds_nothing_writable(privileged):
    interpreter = layers_module.Interpreter("/opt/py/bin/python3", ("/opt/py",))
    config = layers_module.launcher_config(layer=STRONG, interpreter=interpreter, limits=TEST_LIMITS, argv=("a",),
                                           host_work_dir="/host/run/work", uid=1234 if privileged else None,
                                           report_fd=5, lifeline_fd=6)
    argv = layers_module.bwrap_argv(bwrap="/usr/bin/bwrap", interpreter=interpreter, limits=TEST_LIMITS,
                                    host_work_dir="/host/run/work", privileged=privileged, config_fd=7)
    for flag in ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert "--bind" not in argv and "--dev-bind" not in argv  # every host path is read-only
    assert ("--unshare-user" in argv) is not privileged
    binds = {argv[i + 2]: argv[i + 1] for i, arg in enumerate(argv) if arg == "--ro-bind"}
    assert binds["/opt/py"] == "/opt/py" and binds[layers_module.SANDBOX_INPUT] == "/host/run/work"
    assert "/" not in binds and "/root" not in binds and "/home" not in binds
    size = str(TEST_LIMITS.max_disk_bytes)
    for tmpfs in ("/tmp", layers_module.SANDBOX_WORK):
        i = argv.index(tmpfs)
        assert argv[i - 1] == "--tmpfs" and argv[i - 2] == size
    assert config["kill_mode"] == "namespace" and config["nproc_relative"] is (not privileged)
    assert config["env"] == layers_module.program_env(home=layers_module.SANDBOX_WORK, tmpdir="/tmp")


def test_lone_surrogates_in_model_text_are_a_program_error_not_a_crash():
    from pettingllms.sandbox import run_program

    result = run_program("print('ok')  # \ud800")
    assert result.verdict == "ok" and result.exit_code != 0  # the interpreter rejects the bytes itself
