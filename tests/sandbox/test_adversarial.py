"""Adversarial programs, on every layer that works here. Each must end within its limit plus a margin,
with the stated verdict, and leave no process behind."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import textwrap
import threading
import uuid

import pytest

from pettingllms.sandbox import FALLBACK, STRONG, run_tests

from sandbox_test_support import MARGIN_S, TEST_LIMITS, assert_nothing_left, new_marker, sandbox_for, timed_run

LAYERS = [STRONG, FALLBACK]


@pytest.fixture(params=LAYERS)
def layer(request):
    return request.param


@pytest.fixture
def sandbox(layer):
    return sandbox_for(layer)


def run_marked(sandbox, source, **kwargs):
    marker = new_marker()
    result, elapsed = timed_run(sandbox, textwrap.dedent(source), argv=(marker,), **kwargs)
    return result, elapsed, marker


# ---------------------------------------------------------------------------------------------- time

def test_infinite_loop_hits_the_cpu_limit(sandbox):
    result, elapsed, marker = run_marked(sandbox, "while True:\n    pass\n")
    assert result.verdict == "timeout"
    assert result.exit_code is None
    assert elapsed < TEST_LIMITS.cpu_time_s + MARGIN_S
    assert_nothing_left(marker)


def test_sleeping_program_hits_the_wall_timeout(sandbox):
    result, elapsed, marker = run_marked(sandbox, "import time\ntime.sleep(1000)\n")
    assert result.verdict == "timeout"
    assert TEST_LIMITS.wall_timeout_s <= elapsed < TEST_LIMITS.wall_timeout_s + MARGIN_S
    assert_nothing_left(marker)


def test_program_ignoring_sigxcpu_is_still_stopped(sandbox):
    source = """
        import signal
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
        while True:
            pass
    """
    result, elapsed, marker = run_marked(sandbox, source)
    assert result.verdict == "timeout"
    assert elapsed < TEST_LIMITS.wall_timeout_s + MARGIN_S
    assert_nothing_left(marker)


def test_blocking_on_stdin_gets_end_of_file(sandbox):
    source = """
        import os, sys
        data = sys.stdin.read()
        more = os.read(0, 100)
        try:
            input()
        except EOFError:
            print("eof", len(data), len(more))
    """
    result, elapsed, marker = run_marked(sandbox, source)
    assert (result.verdict, result.exit_code, result.stdout) == ("ok", 0, "eof 0 0\n")
    assert elapsed < MARGIN_S
    assert_nothing_left(marker)


# ---------------------------------------------------------------------------------------------- memory

def test_allocating_10_gb_is_a_memory_verdict(sandbox):
    result, elapsed, marker = run_marked(sandbox, "x = bytearray(10 * 1024 ** 3)\nprint('allocated')\n")
    assert result.verdict == "memory"
    assert "allocated" not in result.stdout
    assert elapsed < MARGIN_S
    assert_nothing_left(marker)


def test_growing_allocation_stops_at_the_address_space_limit(sandbox):
    source = """
        chunks = []
        while True:
            chunks.append(bytearray(32 * 1024 * 1024))
    """
    # Zero-filling pages costs kernel CPU time: more time and less memory than the other tests, so a loaded
    # machine still reaches the memory limit before the time limits.
    limits = dataclasses.replace(TEST_LIMITS, wall_timeout_s=6.0, cpu_time_s=4.0, address_space_bytes=256 << 20)
    result, elapsed, marker = run_marked(sandbox, source, limits=limits)
    assert result.verdict == "memory"
    assert result.max_rss_kib is not None and result.max_rss_kib * 1024 <= limits.address_space_bytes
    assert elapsed < limits.wall_timeout_s + MARGIN_S
    assert_nothing_left(marker)


# ---------------------------------------------------------------------------------------------- processes

FORK_COUNTER = """
    import {module}, sys, time
    forks = 0
    for _ in range(200):
        try:
            pid = {module}.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            {module}._exit(0)
        forks += 1
    print(forks)
"""


@pytest.mark.parametrize("module", ["os", "posix"])
def test_fork_count_is_capped_and_children_die(sandbox, module):
    source = FORK_COUNTER.format(module=module)
    if module == "posix":
        source = "import os\ndel os.fork\n" + textwrap.dedent(source)
    result, elapsed, marker = run_marked(sandbox, source)
    assert result.verdict == "ok", result.stderr
    forks = int(result.stdout)
    assert 0 < forks < TEST_LIMITS.max_processes, "RLIMIT_NPROC did not cap the process count"
    assert elapsed < MARGIN_S, "the sleeping children kept the run alive"
    assert_nothing_left(marker)


def test_fork_bomb_is_contained(sandbox):
    source = """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """
    result, elapsed, marker = run_marked(sandbox, source)
    assert result.verdict == "timeout"
    assert elapsed < TEST_LIMITS.wall_timeout_s + MARGIN_S
    assert_nothing_left(marker)


def test_setsid_double_fork_does_not_outlive_the_run(sandbox):
    source = """
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)  # the escaped grandchild
            os._exit(0)
        time.sleep(0.3)
        print("parent done")
    """
    result, elapsed, marker = run_marked(sandbox, source)
    assert (result.verdict, result.exit_code, result.stdout) == ("ok", 0, "parent done\n")
    assert elapsed < MARGIN_S
    assert_nothing_left(marker)


def test_setsid_grandchild_of_a_timed_out_program_dies_too(sandbox):
    source = """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        time.sleep(120)
    """
    result, elapsed, marker = run_marked(sandbox, source)
    assert result.verdict == "timeout"
    assert elapsed < TEST_LIMITS.wall_timeout_s + MARGIN_S
    assert_nothing_left(marker)


def test_kill_everything_reaches_only_the_run(sandbox):
    canary = subprocess.Popen(["sleep", "60"])  # a process of the runner's uid, outside the run
    try:
        source = """
            import os, signal, time
            if os.fork() == 0:
                time.sleep(60)
            time.sleep(0.2)
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError as exc:
                print("kill failed", exc)
            print("still here")
        """
        result, elapsed, marker = run_marked(sandbox, source)
        assert canary.poll() is None, "the program killed a process outside its run"
        # Its own child died; whether the program itself survives depends on the layer, never "infrastructure".
        assert result.verdict in ("ok", "killed")
        assert elapsed < MARGIN_S
        assert_nothing_left(marker)
    finally:
        canary.kill()
        canary.wait()


# ---------------------------------------------------------------------------------------------- output and disk

@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_unbounded_output_is_cut(sandbox, stream):
    result, elapsed, marker = run_marked(sandbox, f"import sys\nwhile True:\n    sys.{stream}.write('x' * 1000)\n")
    assert result.verdict == "output-limit"
    assert getattr(result, f"{stream}_truncated")
    assert len(getattr(result, stream)) == TEST_LIMITS.max_output_bytes
    assert elapsed < MARGIN_S
    assert_nothing_left(marker)


def test_one_growing_file_stops_at_the_file_size_limit(sandbox):
    source = """
        import sys
        written = 0
        try:
            with open("big", "wb") as f:
                while written < 100 * 1024 * 1024:
                    f.write(b"x" * 65536)
                    f.flush()
                    written += 65536
        except OSError as exc:
            print("stopped", written, type(exc).__name__)
    """
    result, elapsed, marker = run_marked(sandbox, source)
    assert result.verdict == "ok"
    word, written, _ = result.stdout.split()
    assert word == "stopped" and int(written) <= TEST_LIMITS.max_file_size_bytes
    assert_nothing_left(marker)


@pytest.mark.parametrize("where", ["work dir", "/tmp"])
def test_many_files_cannot_fill_the_disk(sandbox, layer, where):
    """Files of 512 KiB each (under the per-file cap) until the writes fail: the total stays within
    max_disk_bytes in both layers (the fallback mounts a tmpfs over the work dir as over /tmp), and the run says
    its disk was bounded."""
    folder = "." if where == "work dir" else "/tmp"
    source = f"""
        import os
        total = 0
        try:
            for i in range(1000):
                with open(os.path.join({folder!r}, f"f{{i}}"), "wb") as f:
                    for _ in range(8):
                        f.write(b"x" * 65536)
                        f.flush()
                        total += 65536
        except OSError as exc:
            print("stopped", total, exc.errno)
        print("main.py still there:", os.path.exists("main.py"))
    """
    result, _, marker = run_marked(sandbox, source)
    if layer == FALLBACK and not result.disk_bounded:
        pytest.skip("the fallback launcher got no mount namespace here (no CAP_SYS_ADMIN): each file is capped, "
                    "not the total (docs/sandbox.md)")
    assert result.disk_bounded
    lines = result.stdout.splitlines()
    word, total, errno_ = lines[0].split()
    assert word == "stopped" and int(total) <= TEST_LIMITS.max_disk_bytes and int(errno_) == 28  # ENOSPC
    assert lines[1] == "main.py still there: True"  # the program's own files were copied into its tmpfs
    assert_nothing_left(marker)


# ---------------------------------------------------------------------------------------------- network

@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 that records whether anyone connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    connections = []
    stop = threading.Event()

    def accept_loop():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (socket.timeout, OSError):
                continue
            connections.append(conn.recv(100))
            conn.close()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    yield server.getsockname()[1], connections
    stop.set()
    thread.join()
    server.close()


def test_loopback_listener_is_unreachable(sandbox, layer, listener):
    port, connections = listener
    source = f"""
        import socket
        try:
            s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
            s.sendall(b"stolen")
            s.close()
            print("connected")
        except OSError as exc:
            print("blocked", exc.errno)
    """
    result, _, marker = run_marked(sandbox, source)
    assert result.verdict == "ok", result.stderr
    if layer == STRONG or result.network_isolated:
        assert result.network_isolated
        assert result.stdout.startswith("blocked")
        assert connections == []
    else:
        # Documented: a non-root fallback without a network namespace cannot block loopback.
        assert result.stdout.startswith("connected")
    assert_nothing_left(marker)


# ---------------------------------------------------------------------------------------------- secrets

def test_parent_environment_is_invisible(sandbox, monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("PETTINGLLMS_SANDBOX_TEST_SECRET", secret)
    source = """
        import os
        print(dict(os.environ))
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                for name in ("environ", "cmdline"):
                    try:
                        print(open(f"/proc/{pid}/{name}", "rb").read())
                    except OSError:
                        pass
    """
    result, _, marker = run_marked(sandbox, source)
    assert result.verdict == "ok", result.stderr
    assert "PATH" in result.stdout  # it did print its environment
    assert secret not in result.stdout + result.stderr
    assert "PETTINGLLMS_SANDBOX_TEST_SECRET" not in result.stdout
    assert_nothing_left(marker)


def test_files_outside_the_work_dir_are_unreadable(sandbox, layer, tmp_path):
    secret = f"secret-{uuid.uuid4().hex}"
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    source = f"""
        for path in ({str(secret_file)!r}, "/etc/shadow", "/root/.bash_history"):
            try:
                print(path, open(path).read())
            except OSError as exc:
                print(path, type(exc).__name__)
    """
    result, _, marker = run_marked(sandbox, source)
    assert result.verdict == "ok", result.stderr
    assert secret not in result.stdout + result.stderr
    first_line = result.stdout.splitlines()[0]
    # Invisible (strong; fallback with its own /tmp, where pytest's tmp_path lies) vs. another uid's file.
    hidden = layer == STRONG or (result.shared_dirs_private and str(secret_file).startswith("/tmp/"))
    expected = "FileNotFoundError" if hidden else "PermissionError"
    assert first_line == f"{secret_file} {expected}"
    assert_nothing_left(marker)


def test_writes_outside_the_work_dir_do_not_land(sandbox, layer, tmp_path):
    target_dir = tmp_path / "open"
    target_dir.mkdir()
    os.chmod(target_dir, 0o777)
    host_tmp_name = f"/tmp/{new_marker()}-escape"
    source = f"""
        for path in ({str(target_dir / 'evil')!r}, "/etc/evil", "/usr/evil", {host_tmp_name!r}):
            try:
                open(path, "w").write("x")
                print(path, "written")
            except OSError as exc:
                print(path, type(exc).__name__)
        open("inside", "w").write("fine")
        print(open("inside").read())
    """
    result, _, marker = run_marked(sandbox, source)
    assert result.verdict == "ok", result.stderr
    assert result.stdout.splitlines()[-1] == "fine"  # the work dir itself is writable
    assert not (target_dir / "evil").exists()
    assert not os.path.exists("/etc/evil") and not os.path.exists("/usr/evil")
    # Strong: a private /tmp. Fallback: the shared /tmp, swept of the run's uid afterwards.
    assert not os.path.exists(host_tmp_name)
    assert_nothing_left(marker)


# ---------------------------------------------------------------------------------------------- judge

def test_early_sys_exit_is_not_a_pass(sandbox):
    tests = [("1 2\n", "3\n"), ("5 5\n", "10\n")]
    cheat = run_tests("import sys\nsys.exit(0)\nprint(sum(map(int, input().split())))\n", tests,
                      TEST_LIMITS, sandbox=sandbox)
    assert cheat.passed == 0 and not cheat.all_passed
    assert {case.reason for case in cheat.cases} == {"wrong answer"}
    honest = run_tests("print(sum(map(int, input().split())))\n", tests, TEST_LIMITS, sandbox=sandbox)
    assert honest.all_passed and honest.passed == 2


def test_printing_a_pass_message_and_exiting_is_not_a_pass(sandbox):
    source = "import os\nprint('All tests passed')\nprint('PASSED')\nos._exit(0)\n"
    report = run_tests(source, [("1 2\n", "3\n")], TEST_LIMITS, sandbox=sandbox)
    assert not report.all_passed and report.cases[0].reason == "wrong answer"


# ---------------------------------------------------------------------------------------------- threads

def test_runs_from_non_main_threads(sandbox):
    results = {}

    def work(i):
        results[i] = sandbox.run(f"print({i} * 2)", limits=TEST_LIMITS)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert {i: (r.verdict, r.stdout) for i, r in results.items()} == {i: ("ok", f"{i * 2}\n") for i in range(4)}
