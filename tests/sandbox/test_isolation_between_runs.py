"""Channels between runs, on every layer that works here: a program must not find or read a concurrent run's files,
reach a host unix socket in a shared writable dir, leave IPC objects or files behind for a later run, or touch a
shared folder of another user; and two runners on one machine (two processes, two pools) never disturb each
other's verdicts."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from pettingllms.sandbox import FALLBACK, STRONG
from pettingllms.sandbox.diagnostics import processes_with_marker

from sandbox_test_support import TEST_LIMITS, assert_nothing_left, new_marker, sandbox_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(params=[STRONG, FALLBACK])
def layer(request):
    return request.param


@pytest.fixture
def sandbox(layer):
    return sandbox_for(layer)


# A program that looks for other runs the way the probe did: run dirs by name in the temp dir, paths and
# launcher configs (hex of a marshal-ed dict) in every /proc/<pid>/cmdline, and every file it can read there.
SPY = r'''
import glob, marshal, os, sys, time
time.sleep(float(sys.argv[2]))
found, dirs = [], set()

def grab(path, depth=0):
    try:
        if os.path.isdir(path):
            for name in os.listdir(path):
                if depth < 3:
                    grab(os.path.join(path, name), depth + 1)
        else:
            with open(path, "rb") as f:
                found.append(path + ": " + f.read(2000).decode("utf-8", "replace"))
    except OSError as exc:
        found.append(path + ": " + type(exc).__name__)

for pattern in ("/tmp/pettingllms-sbx-*", "/tmp/pettingllms-sandbox-runs-*", "/tmp/pettingllms-sandbox-runs-*/*"):
    dirs.update(glob.glob(pattern))
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        args = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
    except OSError:
        continue
    for arg in args:
        text = arg.decode("utf-8", "replace")
        if "pettingllms-sbx-" in text:
            head, tail = text.split("pettingllms-sbx-", 1)
            dirs.add(head + "pettingllms-sbx-" + tail.split("/")[0])
        try:
            config = marshal.loads(bytes.fromhex(text))
        except Exception:
            continue
        if isinstance(config, dict) and config.get("cwd"):
            found.append("config: %r" % (config,))
            dirs.add(os.path.dirname(config["cwd"]))
mine = os.path.dirname(os.getcwd())
for d in sorted(dirs - {mine}):
    for name in ("", "stdin", "work/main.py", "work/secret.txt"):
        grab(os.path.join(d, name))
print("dirs", sorted(dirs - {mine}))
print("\n".join(found), flush=True)
'''


def victim_source(secret: str) -> str:
    return f"# {secret}\nimport sys, time\nsys.stdin.read()\ntime.sleep(float(sys.argv[2]))\n"


def wait_for_marker(marker: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not processes_with_marker(marker):
        assert time.monotonic() < deadline, "the victim program never started"
        time.sleep(0.05)


def test_a_run_cannot_find_or_read_a_concurrent_run(sandbox):
    secret = f"golden-{uuid.uuid4().hex}"
    victim_marker = new_marker()
    victim = {}
    thread = threading.Thread(target=lambda: victim.update(result=sandbox.run(
        victim_source(secret), argv=(victim_marker, "2.5"), stdin=secret, files={"secret.txt": secret},
        limits=dataclasses.replace(TEST_LIMITS, wall_timeout_s=6.0))))
    thread.start()
    try:
        wait_for_marker(victim_marker)
        spy_marker = new_marker()
        spy = sandbox.run(SPY, argv=(spy_marker, "0"), limits=TEST_LIMITS)
    finally:
        thread.join(timeout=30)
    assert spy.verdict == "ok", spy.stderr
    assert spy.stdout.startswith("dirs "), "the spy did not run to the end"
    assert secret not in spy.stdout + spy.stderr, "a program read a concurrent run's program, stdin or files"
    configs = [line for line in spy.stdout.splitlines() if line.startswith("config: ")]
    # (configs of other users' sandboxes on this machine may show up; the victim's must not)
    assert not [c for c in configs if victim_marker in c], "the victim's launcher config was on its command line"
    assert victim["result"].verdict == "ok", victim["result"].stderr
    assert_nothing_left(victim_marker)
    assert_nothing_left(spy_marker)


@pytest.fixture
def unix_listeners():
    """A unix socket in /tmp (mode 0777, the way a careless service leaves one) and an abstract one, both recording
    whoever connects."""
    name = f"sbx-test-{uuid.uuid4().hex}"
    path = f"/tmp/{name}.sock"
    servers, connections, stop = [], [], threading.Event()
    for address in (path, "\0" + name):
        server = socket.socket(socket.AF_UNIX)
        server.bind(address)
        server.listen(5)
        server.settimeout(0.1)
        servers.append(server)
    os.chmod(path, 0o777)

    def accept_loop(server):
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (socket.timeout, OSError):
                continue
            connections.append(conn.recv(100))
            conn.close()

    threads = [threading.Thread(target=accept_loop, args=(s,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    yield path, name, connections
    stop.set()
    for t in threads:
        t.join()
    for server in servers:
        server.close()
    os.unlink(path)


def test_host_unix_sockets_are_unreachable(sandbox, unix_listeners):
    path, name, connections = unix_listeners
    source = f"""
        import socket
        for address in ({path!r}, "\\0" + {name!r}):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(1)
            try:
                s.connect(address)
                s.sendall(b"stolen")
                print("connected", repr(address))
            except OSError as exc:
                print("blocked", type(exc).__name__)
            s.close()
    """
    marker = new_marker()
    result = sandbox.run(textwrap.dedent(source), argv=(marker,), limits=TEST_LIMITS)
    assert result.verdict == "ok", result.stderr
    assert result.stdout.count("blocked") == 2, result.stdout
    time.sleep(0.3)  # let the accept loops see a connection that did get through
    assert connections == []
    assert_nothing_left(marker)


# ---------------------------------------------------------------------------------------------- leftovers

_libc = ctypes.CDLL(None, use_errno=True)
IPC_RMID = 0


def sysv_keys_present(keys: set[int]) -> list[tuple[str, int]]:
    present = []
    for kind in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{kind}") as f:
            present += [(kind, int(row.split()[0])) for row in f.read().splitlines()[1:]
                        if int(row.split()[0]) in keys]
    return present


def remove_sysv_by_key(shm_key: int, sem_key: int, msg_key: int) -> None:
    """Clean up after a failing run (the objects are the test's own: keys chosen at random here)."""
    if (shm := _libc.shmget(shm_key, 0, 0)) >= 0:
        _libc.shmctl(shm, IPC_RMID, None)
    if (sem := _libc.semget(sem_key, 0, 0)) >= 0:
        _libc.semctl(sem, 0, IPC_RMID)
    if (msg := _libc.msgget(msg_key, 0, 0)) >= 0:
        _libc.msgctl(msg, IPC_RMID, None)


def test_ipc_objects_and_files_do_not_outlive_the_run(sandbox):
    name = f"sbx-test-{uuid.uuid4().hex}"
    key = random.randrange(1 << 24, 1 << 30)
    keys = {key, key + 1, key + 2}
    shared = f"/tmp/{name}-shared"  # a world-writable subfolder, as a careless service leaves one
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    files = [f"/dev/shm/{name}", f"{shared}/left", f"/var/tmp/{name}", f"/run/lock/{name}"]
    source = f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print("shm", libc.shmget({key}, 4096, 0o1666) >= 0)
        print("sem", libc.semget({key + 1}, 1, 0o1666) >= 0)
        print("msg", libc.msgget({key + 2}, 0o1666) >= 0)
        print("mq", libc.mq_open(b"/{name}", os.O_CREAT | os.O_RDWR, 0o666, None) >= 0)
        for path in {files!r}:
            try:
                with open(path, "w") as f:
                    f.write("left for a later run")
                print(path, "written")
            except OSError as exc:
                print(path, type(exc).__name__)
    """
    marker = new_marker()
    try:
        result = sandbox.run(textwrap.dedent(source), argv=(marker,), limits=TEST_LIMITS)
        assert result.verdict == "ok", result.stderr
        assert "shm True" in result.stdout, "the program could not even create the object it should leave behind"
        assert sysv_keys_present(keys) == [], "SysV IPC objects of the run outlived it"
        mq = _libc.mq_open(f"/{name}".encode(), os.O_RDONLY)
        assert mq < 0, "a POSIX message queue of the run outlived it"
        assert [p for p in files if os.path.exists(p)] == [], "files of the run outlived it"
        assert_nothing_left(marker)
    finally:
        remove_sysv_by_key(key, key + 1, key + 2)
        _libc.mq_unlink(f"/{name}".encode())
        for path in files:
            if os.path.exists(path):
                os.unlink(path)
        shutil.rmtree(shared)


def test_a_shared_folder_without_sticky_bit_cannot_be_emptied(sandbox):
    """Ray's session folders are 0777 without the sticky bit under the temp dir: anyone who can reach them can
    rename and delete what is inside."""
    session = f"/tmp/sbx-test-session-{uuid.uuid4().hex}"
    os.makedirs(f"{session}/sockets")
    for d in (session, f"{session}/sockets"):
        os.chmod(d, 0o777)
    with open(f"{session}/node_ip_address.json", "w") as f:
        f.write("{}")
    source = f"""
        import os, shutil
        for action in (lambda: os.rename({session + '/node_ip_address.json'!r}, {session + '/moved'!r}),
                       lambda: os.unlink({session + '/node_ip_address.json'!r}),
                       lambda: shutil.rmtree({session + '/sockets'!r}),
                       lambda: open({session + '/planted'!r}, "w").write("x")):
            try:
                action()
                print("done")
            except OSError as exc:
                print("refused", type(exc).__name__)
    """
    try:
        result = sandbox.run(textwrap.dedent(source), limits=TEST_LIMITS)
        assert result.verdict == "ok", result.stderr
        assert sorted(os.listdir(session)) == ["node_ip_address.json", "sockets"]
        assert "done" not in result.stdout
    finally:
        shutil.rmtree(session)


# ---------------------------------------------------------------------------------------------- two runners

# One runner process: a pool of two, a sleeper that must end in `timeout` and an attacker that reads what it can
# find of other runs and then SIGKILLs every process it sees and kill(-1)s. Prints one JSON line.
RUNNER = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
from pettingllms.sandbox import Limits, Sandbox, SandboxPool
layer, secret, spy = sys.argv[2], sys.argv[3], sys.argv[4]
attack = spy + """
import signal
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
"""
limits = Limits(wall_timeout_s=4.0, cpu_time_s=2.0, address_space_bytes=512 << 20, max_processes=12)
with SandboxPool(2, sandbox=Sandbox(layer, limits)) as pool:
    pool.run("pass")  # probe the layer before the clocks start
    print("ready", flush=True)
    sys.stdin.readline()  # both runners start together
    sleeper = pool.submit("# " + secret + "\nimport time\ntime.sleep(100)\n", stdin=secret)
    time.sleep(1.0)  # the other runner's sleeper is running by now
    attacker = pool.submit(attack, argv=("attacker", "0"))
    s, a = sleeper.result(), attacker.result()
print(json.dumps({"sleeper": s.verdict, "attacker": a.verdict, "spied": a.stdout + a.stderr}))
'''


def test_two_runners_on_one_machine_never_disturb_each_other(layer):
    sandbox_for(layer)  # skips when the layer does not work here
    secrets = [f"secret-{uuid.uuid4().hex}" for _ in range(2)]
    env = {**os.environ, "PYTHONPATH": REPO}
    procs = [subprocess.Popen([sys.executable, "-c", RUNNER, REPO, layer, secret, SPY], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for secret in secrets]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outs = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    reports = []
    for (stdout, stderr), proc in zip(outs, procs):
        assert proc.returncode == 0, stderr[-2000:]
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    for mine, other in ((0, 1), (1, 0)):
        assert reports[mine]["sleeper"] == "timeout", "a runner's program was disturbed by the other runner's"
        assert reports[mine]["attacker"] in ("ok", "killed")
        assert secrets[other] not in reports[mine]["spied"], "a program read the other runner's run"


# ---------------------------------------------------------------------------------------------- without namespaces

def test_without_namespaces_the_fallback_sweeps_what_the_run_left(monkeypatch):
    """Where the kernel refuses the fallback's IPC and mount namespaces (e.g. Docker without CAP_SYS_ADMIN), the
    runner removes the uid's SysV objects and its files at any depth of the shared writable dirs."""
    from pettingllms.sandbox import layers

    sandbox = sandbox_for(FALLBACK)
    if os.geteuid() != 0:
        pytest.skip("only a root runner gives programs private uids to sweep by")
    real_config = layers.launcher_config
    monkeypatch.setattr(layers, "launcher_config", lambda **kw: {**real_config(**kw), "isolate": False})
    name = f"sbx-test-{uuid.uuid4().hex}"
    key = random.randrange(1 << 24, 1 << 30)
    shared = f"/tmp/{name}-outer/inner"  # world-writable, two levels down, under a dir the uid cannot write
    os.makedirs(shared)
    os.chmod(shared, 0o777)
    files = [f"{shared}/left", f"{shared}/dir/deeper", f"/dev/shm/{name}", f"/var/tmp/{name}"]
    source = f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print("shm", libc.shmget({key}, 4096, 0o1666) >= 0)
        print("sem", libc.semget({key + 1}, 1, 0o1666) >= 0)
        print("msg", libc.msgget({key + 2}, 0o1666) >= 0)
        os.mkdir({shared + '/dir'!r}, 0o700)
        for path in {files!r}:
            with open(path, "w") as f:
                f.write("left for a later run")
        os.chmod({shared + '/dir'!r}, 0)
        print("planted")
    """
    try:
        result = sandbox.run(textwrap.dedent(source), limits=TEST_LIMITS)
        assert result.verdict == "ok", result.stderr
        assert not result.shared_dirs_private
        assert result.stdout.split() == ["shm", "True", "sem", "True", "msg", "True", "planted"]
        assert sysv_keys_present({key, key + 1, key + 2}) == []
        assert [p for p in files if os.path.lexists(p)] == [] and os.listdir(shared) == []
    finally:
        remove_sysv_by_key(key, key + 1, key + 2)
        for path in files[2:]:
            if os.path.exists(path):
                os.unlink(path)
        shutil.rmtree(f"/tmp/{name}-outer")


def ancestors(pid: int, stop: int) -> list[int]:
    """``pid`` and its parents up to, without, ``stop``."""
    chain = []
    while pid not in (stop, 0, 1):
        chain.append(pid)
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return chain


def test_the_run_dir_is_on_no_command_line_of_the_run(sandbox):
    """/proc/<pid>/cmdline is readable by every uid: the work dir's path must not be on the command line of bwrap,
    the launcher or (in the fallback) the program."""
    marker = new_marker()
    source = "import sys, time\ntime.sleep(float(sys.argv[2]))\n"
    thread = threading.Thread(target=sandbox.run, args=(source,), kwargs={"argv": (marker, "1.5"),
                                                                            "limits": TEST_LIMITS})
    thread.start()
    try:
        wait_for_marker(marker)
        chain = ancestors(processes_with_marker(marker)[0], stop=os.getpid())
        cmdlines = []
        for pid in chain:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdlines.append(f.read())
    finally:
        thread.join(timeout=30)
    assert any(b"launcher.py" in cmd for cmd in cmdlines), cmdlines  # the chain reached the launcher
    for cmd in cmdlines:
        assert b"pettingllms-sbx-" not in cmd, cmd
        assert not any(len(arg) > 200 for arg in cmd.split(b"\0")), f"a long (encoded config?) argument: {cmd!r}"


# Kernel state that neither rlimits nor namespaces isolate: a keyring key (add_key/keyctl) outlives the run and is
# read by the next run of the same uid; memfd memory is not counted by RLIMIT_AS. The launcher's seccomp filter
# denies those syscalls (EPERM), by their native numbers and through the 32-bit ABI.
KERNEL_STATE = r'''
import ctypes, errno, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
numbers = {"x86_64": {"add_key": 248, "keyctl": 250}, "aarch64": {"add_key": 217, "keyctl": 219}}[platform.machine()]
results = {}
for name, nr in numbers.items():
    args = (b"user", b"sbx-key", b"secret", 6, -3) if name == "add_key" else (0, -3, 1, 0, 0)  # KEY_SPEC_SESSION_KEYRING
    outcome = libc.syscall(nr, *args)
    results[name] = "allowed" if outcome >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
try:
    os.memfd_create("sbx")
    results["memfd_create"] = "allowed"
except OSError as exc:
    results["memfd_create"] = errno.errorcode.get(exc.errno, "?")
print(results)
'''


def test_keyrings_and_memfd_are_denied(sandbox):
    result = sandbox.run(KERNEL_STATE, limits=TEST_LIMITS)
    assert result.verdict == "ok" and result.exit_code == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str({"add_key": "EPERM", "keyctl": "EPERM", "memfd_create": "EPERM"})
