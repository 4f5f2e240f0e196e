"""Trusted launcher that runs between the sandbox runner and the untrusted program.

Run as ``python -I -S _launcher.py CONFIG_FD`` (an inherited pipe holding a marshal-ed dict, read to EOF first:
the config names the run's work dir, and a command line is readable by every uid), inside bubblewrap in the
strong layer, directly in the fallback layer. It must import nothing outside the standard library: in the strong
layer the project checkout is not mounted, only this one file is.

What it does, in order:
  1. makes itself non-dumpable (the program cannot ptrace it or open its fds through /proc) and a child
     subreaper, so every orphan of the program tree -- including ``setsid()`` double forks -- is re-parented
     to it instead of escaping to init;
  2. optionally (fallback layer, when it has the privilege) moves into new network and IPC namespaces and a new
     mount namespace in which the shared writable dirs (/tmp, /var/tmp, /dev/shm, ...) and the work dir are
     private tmpfs of ``disk_bytes`` each, so the program can neither reach the host's unix sockets there, nor
     leave files or IPC objects behind, nor write more than that to any of them;
  3. forks the program: the child drops privileges, installs a seccomp filter that denies the kernel-state
     channels rlimits and namespaces do not close (keyrings: add_key, request_key, keyctl, whose keys outlive a run
     and carry data to the next run of the same uid; memfd_create and memfd_secret, whose memory escapes
     RLIMIT_AS), applies rlimits, closes every inherited fd but 0-2 and execs. Failure before the exec is reported
     as a setup error (the program never ran);
  4. waits for the program or for the runner to close the lifeline pipe (timeout, output limit, or the
     runner itself died); then kills whatever is left of the tree and reaps all of it;
  5. writes one ``repr(dict)`` line per event to the report fd: ``started`` once the exec succeeded, then
     ``exit`` (the runner parses them with ast.literal_eval).

Imports are kept to C modules plus ctypes (``_signal`` rather than ``signal``, marshal rather than json):
this script starts once per run, and the pure-Python modules would add ~10 ms to each.
"""

import _signal as signal  # the C module: same functions and constants, without importing enum
import ctypes
import errno
import marshal
import os
import resource
import select
import sys
import time

PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
# The syscalls the filter denies (EPERM), per architecture: (audit arch, {name: number}).
DENIED_SYSCALLS = {
    "x86_64": (0xC000003E, {"add_key": 248, "request_key": 249, "keyctl": 250, "memfd_create": 319,
                            "memfd_secret": 447}),
    "aarch64": (0xC00000B7, {"add_key": 217, "request_key": 218, "keyctl": 219, "memfd_create": 279,
                             "memfd_secret": 447}),
}
X32_SYSCALL_BIT = 0x40000000
CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
LAST_CAP_GUESS = 63  # PR_CAPBSET_DROP returns EINVAL past the kernel's last cap; we stop there

TREE_KILL_TIMEOUT_S = 5.0

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option, arg2=0):
    if _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0),
                   ctypes.c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "prctl(%d): %s" % (option, os.strerror(err)))


def _write_report(fd, event):
    data = (repr(event) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # the runner is gone; the lifeline already told us to clean up


def _try_unshare_net():
    """True when the launcher (and so the program) now has a private, empty network namespace."""
    if _libc.unshare(ctypes.c_int(CLONE_NEWNET)) == 0:
        return True
    return False


def _mount(source, target, fstype, flags, data):
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    if _libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "mount %s on %s: %s" % (fstype or source, target, os.strerror(err)))


def _makedirs_traversable(path):
    if os.path.isdir(path):
        return
    _makedirs_traversable(os.path.dirname(path))
    os.mkdir(path)
    os.chmod(path, 0o711)  # the program's uid passes through to its work dir, and lists nothing


def _isolate_ipc_and_mounts(cfg):
    """(ipc_isolated, private_dirs, work_private). A namespace the kernel refuses is reported, not fatal (the runner sweeps
    instead); a mount that fails inside a new mount namespace is fatal (the run would be less private than
    reported)."""
    ipc_isolated = _libc.unshare(ctypes.c_int(CLONE_NEWIPC)) == 0
    if _libc.unshare(ctypes.c_int(CLONE_NEWNS)) != 0:
        return ipc_isolated, (), False
    # A copied mount stays in its peer group: without this our tmpfs mounts would appear on the host.
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    work = cfg["cwd"]
    # Held across the mounts that may hide its path; opened in the new namespace, since a bind mount's
    # source must be a mount of the caller's own namespace.
    work_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        private = []
        for path in cfg["private_dirs"]:
            if os.path.islink(path) or not os.path.isdir(path):
                continue
            if path == "/dev/mqueue":
                if not ipc_isolated:
                    continue  # a new mqueue mount would show the host's queues
                _mount("mqueue", path, "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
            else:
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=%d" % cfg["disk_bytes"])
            private.append(path)
        held = os.fstat(work_fd)
        try:
            seen = os.stat(work)
        except FileNotFoundError:
            seen = None
        if seen is None or (seen.st_dev, seen.st_ino) != (held.st_dev, held.st_ino):
            # The work dir lay under a dir that is now private: make its path again there.
            _makedirs_traversable(os.path.dirname(work))
            os.mkdir(work, 0o700)
        # The work dir becomes a tmpfs of disk_bytes too (as in the strong layer), holding a copy of the runner's
        # files with their owners and modes: on the host's disk a program could fill it file after file, each
        # under RLIMIT_FSIZE. The runner reads nothing back from the work dir, so the copy goes with the run.
        _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV,
               "mode=%o,uid=%d,gid=%d,size=%d" % (held.st_mode & 0o7777, held.st_uid, held.st_gid, cfg["disk_bytes"]))
        _copy_tree_as_owned("/proc/self/fd/%d" % work_fd, work)
        return ipc_isolated, tuple(private), True
    finally:
        os.close(work_fd)


def _copy_tree_as_owned(src, dst):
    """The runner's files, with their owners and modes (root copies them before the program's uid exists)."""
    for name in os.listdir(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        st = os.lstat(s)
        if os.path.isdir(s) and not os.path.islink(s):
            os.mkdir(d, 0o700)
            _copy_tree_as_owned(s, d)
        elif os.path.islink(s):
            os.symlink(os.readlink(s), d)
        else:
            _copy_file(s, d)
        os.chown(d, st.st_uid, st.st_gid, follow_symlinks=False)
        if not os.path.islink(d):
            os.chmod(d, st.st_mode & 0o7777)


# ---------------------------------------------------------------- child side (becomes the program)

def _drop_privileges(uid, gid):
    for cap in range(LAST_CAP_GUESS + 1):  # empty the bounding set while we still may (CAP_SETPCAP)
        if _libc.prctl(ctypes.c_int(PR_CAPBSET_DROP), ctypes.c_ulong(cap), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            if ctypes.get_errno() == errno.EINVAL:
                break
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP(%d) failed" % cap)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise RuntimeError("privilege drop did not stick")
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise RuntimeError("could regain uid 0 after dropping privileges")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _seccomp_program(machine):
    """A classic-BPF seccomp program: EPERM for the denied syscalls, for x32 numbers and for any other syscall ABI
    (a 32-bit ``int 0x80`` has other numbers), every other syscall allowed."""
    import _struct  # the C module: the launcher imports no pure-Python module

    if machine not in DENIED_SYSCALLS:
        raise RuntimeError("no seccomp syscall table for %s: the keyring and memfd channels cannot be closed" % machine)
    arch, numbers = DENIED_SYSCALLS[machine]
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    denied = sorted(numbers.values())
    program = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny),  # seccomp_data.arch: only the native ABI
               (ld_abs, 0, 0, 0), (jge, len(denied) + 1, 0, X32_SYSCALL_BIT)]  # seccomp_data.nr
    program += [(jeq, len(denied) - i, 0, nr) for i, nr in enumerate(denied)]
    program += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(_struct.pack("HBBI", *instruction) for instruction in program), len(program)


def _deny_kernel_state_syscalls():
    """Install the seccomp filter (after PR_SET_NO_NEW_PRIVS, which an unprivileged filter needs)."""
    code, length = _seccomp_program(os.uname().machine)
    buffer = ctypes.create_string_buffer(code)
    program = _SockFprog(length, ctypes.cast(buffer, ctypes.c_void_p))
    if _libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(program),
                   ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "seccomp filter refused (%s): the keyring and memfd channels cannot be closed"
                      % os.strerror(err))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _clear_capabilities():
    # bwrap run by root leaves the inheritable set full; clear every set, not only the ones setuid empties.
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit data words
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    try:
        _prctl(47, 4)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # kernels before 4.3 have no ambient set
            raise


def _check_no_capabilities():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("CapInh:", "CapPrm:", "CapEff:", "CapAmb:")) and int(line.split()[1], 16) != 0:
                raise RuntimeError("program would keep capabilities: " + line.strip())


def _copy_tree(src, dst):
    # The strong layer's work dir is a fresh tmpfs; the runner's files are bound read-only at src.
    for name in os.listdir(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if os.path.isdir(s) and not os.path.islink(s):
            os.mkdir(d, 0o755)
            _copy_tree(s, d)
        else:
            _copy_file(s, d)


def _copy_file(s, d):
    with open(s, "rb") as fin, open(d, "wb") as fout:
        while True:
            chunk = fin.read(1 << 20)
            if not chunk:
                break
            fout.write(chunk)


def _close_inherited_fds(keep):
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the fd of the listdir itself, already closed


def _tasks_of_uid(uid):
    """Tasks (threads count: RLIMIT_NPROC counts tasks) whose real uid is ``uid``."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name) as f:
                fields = dict(line.split(":", 1) for line in f if line.startswith(("Uid:", "Threads:")))
        except (OSError, ValueError):
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def _set_rlimits(rlimits, nproc_relative):
    rlimits = dict(rlimits)
    if nproc_relative:
        # Non-root: the program shares its uid with the runner (fallback) or with bwrap's init and this
        # launcher (strong, counted per user namespace), and RLIMIT_NPROC counts every task of the uid.
        # Grant the program max_processes on top of what the uid runs now (exact in the strong layer's
        # own pid namespace; approximate in the fallback, where other processes of the uid come and go).
        soft, hard = rlimits["NPROC"]
        existing = _tasks_of_uid(os.getuid()) - 1  # minus this process: max_processes includes the program
        rlimits["NPROC"] = (soft + existing, hard + existing)
    for name, (soft, hard) in rlimits.items():
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (soft, hard))


def _exec_program(cfg, err_w):
    """Runs in the forked child; never returns."""
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)  # ignored dispositions would survive the exec
        if cfg.get("uid") is not None:
            _drop_privileges(cfg["uid"], cfg["gid"])
        _prctl(PR_SET_NO_NEW_PRIVS, 1)  # setuid binaries and file capabilities cannot hand privileges back
        _deny_kernel_state_syscalls()
        _clear_capabilities()
        _check_no_capabilities()
        os.chdir(cfg["cwd"])
        if cfg.get("copy_from"):
            _copy_tree(cfg["copy_from"], cfg["cwd"])
        _close_inherited_fds(keep=err_w)
        _set_rlimits(cfg["rlimits"], cfg.get("nproc_relative", False))
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except BaseException as exc:  # anything before the exec is the sandbox's failure, not the program's
        try:
            os.write(err_w, ("%s: %s" % (type(exc).__name__, exc)).encode()[:4000])
        finally:
            os._exit(127)


# ---------------------------------------------------------------- launcher side

def _children_of(pid):
    kids = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                kids.extend(int(k) for k in f.read().split())
        except OSError:
            continue
    return kids


def _descendants(root):
    seen, todo = [], [root]
    while todo:
        for kid in _children_of(todo.pop()):
            if kid not in seen:
                seen.append(kid)
                todo.append(kid)
    return seen


def _kill_as_uid(uid, gid):
    """kill(-1) from a helper running as the program's uid: every process of that uid, in one pass.

    The kernel walks the task list under tasklist_lock and fork() re-checks for a pending fatal
    signal under the same lock, so a fork bomb cannot outrun it."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:
            os._exit(1)
        os._exit(0)
    # Wait for this helper before anything else, so the descendant walk cannot kill it mid-way.
    os.waitpid(pid, 0)


class Launcher:
    def __init__(self, cfg):
        self.cfg = cfg
        self.report_fd = cfg["report_fd"]
        self.lifeline_fd = cfg["lifeline_fd"]
        self.main_pid = None
        self.main_status = None
        self.main_rusage = None

    def reap_nonblocking(self):
        """Reap every exited child; True when no child at all is left."""
        while True:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            if pid == self.main_pid:
                self.main_status, self.main_rusage = status, rusage

    def kill_tree(self):
        mode = self.cfg["kill_mode"]
        if mode == "namespace":
            try:
                os.kill(-1, signal.SIGKILL)  # everything in our pid namespace but pid 1 and ourselves
            except ProcessLookupError:
                pass
        elif mode == "uid":
            _kill_as_uid(self.cfg["uid"], self.cfg["gid"])
        # Whatever the mode, finish with a walk of our own descendants until none is left.
        deadline = time.monotonic() + TREE_KILL_TIMEOUT_S
        while True:
            if self.reap_nonblocking():
                return True
            for pid in _descendants(os.getpid()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)

    def run(self):
        cfg = self.cfg
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # only the lifeline and SIGKILL end the launcher
        _prctl(PR_SET_DUMPABLE, 0)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        net_isolated = _try_unshare_net() if cfg.get("unshare_net") else None
        ipc_isolated, private_dirs, work_private = (_isolate_ipc_and_mounts(cfg) if cfg.get("isolate")
                                                    else (None, (), False))

        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)

        self.main_pid = os.fork()
        if self.main_pid == 0:
            _exec_program(cfg, err_w)
        os.close(err_w)
        setup_error = b""
        while True:
            chunk = os.read(err_r, 4096)
            if not chunk:
                break
            setup_error += chunk
        os.close(err_r)
        if setup_error:
            self.kill_tree()
            _write_report(self.report_fd, {"event": "setup-error", "message": setup_error.decode(errors="replace")})
            return
        _write_report(self.report_fd, {"event": "started", "net_isolated": net_isolated,
                                       "ipc_isolated": ipc_isolated, "private_dirs": private_dirs,
                                       "work_private": work_private})

        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        poller.register(self.lifeline_fd, select.POLLIN | select.POLLHUP)
        killed_on_request = False
        while self.main_status is None:
            self.reap_nonblocking()
            if self.main_status is not None:
                break
            for fd, _ in poller.poll():
                if fd == wake_r:
                    try:
                        while os.read(wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                else:
                    killed_on_request = True
            if killed_on_request:
                break
        tree_gone = self.kill_tree()
        report = {"event": "exit", "killed_on_request": killed_on_request, "tree_gone": tree_gone,
                  "net_isolated": net_isolated}
        if self.main_status is not None:
            status = self.main_status
            report["exit_code"] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
            report["signal"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            report["cpu_s"] = self.main_rusage.ru_utime + self.main_rusage.ru_stime
            report["maxrss_kb"] = self.main_rusage.ru_maxrss
        _write_report(self.report_fd, report)


def _read_config(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return marshal.loads(b"".join(chunks))


def main():
    cfg = _read_config(int(sys.argv[1]))
    launcher = Launcher(cfg)
    try:
        launcher.run()
    except BaseException as exc:
        if launcher.main_pid:
            launcher.kill_tree()
        _write_report(cfg["report_fd"], {"event": "launcher-error",
                                         "message": "%s: %s" % (type(exc).__name__, exc)})
        raise


if __name__ == "__main__":
    main()
