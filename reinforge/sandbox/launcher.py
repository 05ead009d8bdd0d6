"""The sandbox launcher: a short-lived trusted process between the reward code and an untrusted
program. It builds the isolation, then execs the program inside it.

It is started as ``python -I -S -B launcher.py`` with a clean environment, so it imports the
standard library only and none of the trainer's modules or secrets. The parent (sandbox/__init__.py)
writes a header to its stdin (a decimal length, a newline, then that many bytes of `marshal`
data: both sides run the same interpreter), and everything after the header is the program's
stdin. The launcher answers with a marshalled status dict on its status fd.

isolation "full" (the default), in this order:
  1. unshare a new user namespace and map one unprivileged id (uid/gid 1000 inside). When the
     launcher runs as root, that id is host uid/gid 65534 (nobody), so the program never runs as
     host root: RLIMIT_NPROC is not enforced for host root, and a kernel escape lands unprivileged.
  2. unshare mount, pid, network, IPC, UTS and cgroup namespaces.
  3. fork: the child is pid 1 of the new pid namespace; when it exits, the kernel kills every
     process left in the namespace (fork bombs, daemons, lingering threads).
  4. the child: a new session (the program cannot signal the launcher's process group), a fresh
     tmpfs root holding read-only bind mounts of only the paths the interpreter needs, a few
     device nodes, a new /proc of its own pid namespace, a size-limited tmpfs /tmp as the working
     directory; pivot_root and detach the host root; drop to the unprivileged id (which drops
     every capability); parent-death signal; then it stays pid 1 as a minimal init and forks
     the program: rlimits, no_new_privs, a seccomp filter, exec.
  5. the launcher waits with a wall-clock watchdog, kills the namespace's init on expiry, and
     writes a status (exit code, CPU time, peak RSS, setup errors) to its status fd.

isolation "best_effort" uses whatever of these works (the parent says which) and otherwise runs
the program in a private temporary directory on the host with rlimits, a new session, an
unprivileged uid when started as root, and seccomp when libseccomp is available.
"""

# Start-up time is per run, so only cheap modules: marshal instead of json (which pulls in re
# and enum), _signal instead of signal (enum); tempfile and shutil only when needed.
import _signal as signal
import ctypes
import errno
import marshal
import os
import resource
import select
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080
NS_FLAGS = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
MS_PRIVATE, MS_SLAVE = 1 << 18, 1 << 19
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
# statvfs flags that a remount inside a user namespace must keep (the kernel locks them).
_ST_KEEP = (
    (os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
    (getattr(os, "ST_NOATIME", 1024), MS_NOATIME), (getattr(os, "ST_NODIRATIME", 2048), MS_NODIRATIME),
    (getattr(os, "ST_RELATIME", 4096), MS_RELATIME),
)
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
SANDBOX_ID = 1000  # uid and gid of the program inside the user namespace
NOBODY = 65534  # host uid/gid the program runs as when the launcher is root
_PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """A sandbox mechanism failed; the message names the step."""


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)} (errno {errno.errorcode.get(err, err)})")


def _b(path):
    return None if path is None else os.fsencode(path)


def unshare(flags, what="unshare"):
    _check(_libc.unshare(ctypes.c_int(flags)), what)


def mount(source, target, fstype, flags, data=None):
    _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)),
           f"mount {source or fstype} on {target}")


def umount2(target, flags):
    _check(_libc.umount2(_b(target), ctypes.c_int(flags)), f"umount {target}")


def pivot_root(new, old):
    nr = _PIVOT_ROOT_NR.get(os.uname().machine)
    if nr is None:
        raise SetupError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    _libc.syscall.restype = ctypes.c_long
    _check(_libc.syscall(ctypes.c_long(nr), _b(new), _b(old)), "pivot_root")


def prctl(option, arg):
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)), f"prctl({option})")


# -- seccomp (libseccomp through ctypes) -------------------------------------------------------

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_NE, SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 1, 4, 7
AF_UNIX = 1
TIOCSTI, TIOCLINUX = 0x5412, 0x541C


def SCMP_ACT_ERRNO(e):
    return 0x00050000 | (e & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


# Denied with EPERM: what reaches other processes or the kernel's rarely-needed, often-exploited
# corners. Everything else is allowed (a program needs files, threads, pipes, mmap, ...).
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd",
    "open_by_handle_at", "name_to_handle_at", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "sethostname", "setdomainname", "lookup_dcookie", "vhangup", "iopl", "ioperm",
    "fanotify_init", "nfsservctl", "uselib", "_sysctl", "create_module", "get_kernel_syms",
    "query_module", "vm86", "vm86old", "modify_ldt", "mbind", "migrate_pages", "move_pages",
    "set_mempolicy", "lsm_set_self_attr",
)


def load_seccomp(libname="libseccomp.so.2"):
    lib = ctypes.CDLL(libname, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)  # other architectures' syscalls are killed
    if not ctx:
        raise SetupError("seccomp_init failed")
    eperm = SCMP_ACT_ERRNO(errno.EPERM)

    def rule(action, name, *cmps):
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:  # not a syscall on this architecture (e.g. vm86 on x86_64)
            return
        arr = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(*c) for c in cmps])
        rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr)
        if rc < 0:
            raise SetupError(f"seccomp rule for {name}: {os.strerror(-rc)}")

    try:
        for name in DENIED_SYSCALLS:
            rule(eperm, name)
        # Sockets: only AF_UNIX (which reaches nothing outside: no host paths are mounted and the
        # abstract namespace belongs to the sandbox's network namespace).
        rule(SCMP_ACT_ERRNO(errno.EAFNOSUPPORT), "socket", (0, SCMP_CMP_NE, AF_UNIX, 0))
        rule(SCMP_ACT_ERRNO(errno.EAFNOSUPPORT), "socketpair", (0, SCMP_CMP_NE, AF_UNIX, 0))
        # No new namespaces through clone flags; clone3 passes its flags in memory, where seccomp
        # cannot look, so it reports ENOSYS and libc falls back to clone.
        for flag in (CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC,
                     CLONE_NEWUTS, CLONE_NEWCGROUP, CLONE_NEWTIME):
            rule(eperm, "clone", (0, SCMP_CMP_MASKED_EQ, flag, flag))
        rule(SCMP_ACT_ERRNO(errno.ENOSYS), "clone3")
        # Keep the parent-death signal: it is what kills the sandbox if the launcher dies.
        rule(eperm, "prctl", (0, SCMP_CMP_EQ, PR_SET_PDEATHSIG, 0))
        # Typing into a terminal's input queue.
        rule(eperm, "ioctl", (1, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
        rule(eperm, "ioctl", (1, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, TIOCLINUX))
        rc = lib.seccomp_load(ctx)  # also sets no_new_privs
        if rc < 0:
            raise SetupError(f"seccomp_load: {os.strerror(-rc)}")
    finally:
        lib.seccomp_release(ctx)


# -- the filesystem view -----------------------------------------------------------------------


def _mount_flags(path):
    f = os.statvfs(path).f_flag
    return sum(ms for st, ms in _ST_KEEP if f & st)


def _unescape(field):
    """mountinfo writes space, tab, newline and backslash as \\ooo octal escapes. (No codecs:
    between the two pivots the standard library's files are out of sight.)"""
    out, i = "", 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out += chr(int(field[i + 1 : i + 4], 8))
            i += 4
        else:
            out += field[i]
            i += 1
    return out


def _remount_readonly_tree(target):
    """Read-only remount of `target` and of every mount below it (a recursive bind brings the
    source's submounts along, each writable until remounted)."""
    points = []
    with open("/oldroot/proc/self/mountinfo") as f:  # the host /proc, until the final pivot
        for line in f:
            point = _unescape(line.split()[4])
            if point == target or point.startswith(target.rstrip("/") + "/"):
                points.append(point)
    for point in sorted(set(points), key=len):
        mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _mount_flags(point))


def _makedirs(path, mode=0o755):
    os.makedirs(path, mode=mode, exist_ok=True)


def _build_root(spec):
    """A new root at /newroot, then pivot into it. Runs as pid 1 of the new pid namespace."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Stage on /tmp like bubblewrap: it exists everywhere, and after the first pivot the host's
    # own /tmp is still reachable under /oldroot.
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    os.mkdir("/tmp/newroot")
    os.mkdir("/tmp/oldroot")
    pivot_root("/tmp", "/tmp/oldroot")
    os.chdir("/")
    mount("tmpfs", "/newroot", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for path, target in spec["symlinks"].items():
        _makedirs(os.path.dirname("/newroot" + path))
        os.symlink(target, "/newroot" + path)
    for path in spec["ro_binds"]:
        src, dst = "/oldroot" + path, "/newroot" + path
        if os.path.isdir(src):
            _makedirs(dst)
        else:
            _makedirs(os.path.dirname(dst))
            open(dst, "w").close()
        mount(src, dst, None, MS_BIND | MS_REC)
        _remount_readonly_tree(dst)
    _makedirs("/newroot/dev")
    for dev in DEVICES:
        open(f"/newroot/dev/{dev}", "w").close()
        mount(f"/oldroot/dev/{dev}", f"/newroot/dev/{dev}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/newroot/dev/{name}")
    _makedirs("/newroot/tmp")
    mount("tmpfs", "/newroot/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"mode=1777,size={int(spec['limits']['tmpfs_bytes'])}")
    _makedirs("/newroot/proc")
    try:  # needs a fully visible /proc on the host; containers that mask parts of it refuse
        mount("proc", "/newroot/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        proc = True
    except SetupError:
        proc = False
    _write_files(spec, "/newroot/tmp")
    mount(None, "/newroot", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    # pivot_root(".", ".") stacks the old root on the new one; detaching it leaves no path to
    # the host's file system (the runc way).
    old = os.open("/", os.O_DIRECTORY | os.O_RDONLY)
    new = os.open("/newroot", os.O_DIRECTORY | os.O_RDONLY)
    os.fchdir(new)
    pivot_root(".", ".")
    os.fchdir(old)
    mount(None, ".", None, MS_SLAVE | MS_REC)
    umount2(".", MNT_DETACH)
    os.close(old)
    os.close(new)
    os.chdir("/tmp")
    return proc


def _write_files(spec, directory):
    for name, content in spec["files"].items():
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)


def _set_limits(limits):
    cpu = int(limits["cpu_s"])
    for res, soft, hard in (
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, limits["as_bytes"], limits["as_bytes"]),
        (resource.RLIMIT_NPROC, limits["nproc"], limits["nproc"]),
        (resource.RLIMIT_FSIZE, limits["fsize_bytes"], limits["fsize_bytes"]),
        (resource.RLIMIT_NOFILE, limits["nofile"], limits["nofile"]),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_MEMLOCK, 0, 0),
        (resource.RLIMIT_MSGQUEUE, 0, 0),
    ):
        resource.setrlimit(res, (int(soft), int(hard)))


def _drop_ids(root_mapped):
    if root_mapped:  # inside uid 0 is host root: become 1000 (host nobody); caps go with it
        os.setgroups([])
    os.setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
    os.setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)


def _drop_to_nobody():
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


# -- the launcher ------------------------------------------------------------------------------


def _read_header():
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            raise SetupError("no header on stdin")
        line += chunk
    n = int(line)
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            raise SetupError("truncated header on stdin")
        data += chunk
    return marshal.loads(data)


def _map_ids(was_root):
    """A new user namespace in which the program will be uid/gid 1000. An unprivileged user may
    map only its own id, and does so itself. Root maps two ids (0 stays host root for the setup,
    1000 is host nobody for the program); that needs CAP_SETUID in the parent namespace, which
    this process loses by unsharing, so a helper forked before the unshare writes the maps."""
    if not was_root:
        uid, gid = os.getuid(), os.getgid()
        unshare(CLONE_NEWUSER, "unshare(CLONE_NEWUSER) (user namespaces)")
        for name, text in (("setgroups", "deny"), ("uid_map", f"{SANDBOX_ID} {uid} 1\n"),
                           ("gid_map", f"{SANDBOX_ID} {gid} 1\n")):
            _write_proc(f"/proc/self/{name}", text)
        return
    go_r, go_w = os.pipe()
    err_r, err_w = os.pipe()
    target = os.getpid()
    helper = os.fork()
    if helper == 0:
        os.close(go_w)
        os.close(err_r)
        try:
            if os.read(go_r, 1) != b"1":
                os._exit(1)
            text = f"0 0 1\n{SANDBOX_ID} {NOBODY} 1\n"
            _write_proc(f"/proc/{target}/uid_map", text)
            _write_proc(f"/proc/{target}/gid_map", text)
            os._exit(0)
        except BaseException as e:  # noqa: BLE001
            os.write(err_w, str(e).encode()[:1000])
            os._exit(1)
    os.close(go_r)
    os.close(err_w)
    try:
        unshare(CLONE_NEWUSER, "unshare(CLONE_NEWUSER) (user namespaces)")
        os.write(go_w, b"1")
    finally:
        os.close(go_w)
        _, st = os.waitpid(helper, 0)
        message = os.read(err_r, 1000).decode(errors="replace")
        os.close(err_r)
    if st != 0:
        raise SetupError(message or "writing the user namespace's id maps failed")


def _write_proc(path, text):
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise SetupError(f"writing {path} ({text.strip()!r}): {e.strerror}") from None


def _child(spec, err_w, alive_r, result_fd, init_w):
    """Between fork and exec; any failure is reported through err_w and ends the child.

    With namespaces this process is pid 1 of the new pid namespace. It builds the root, drops
    its ids, then stays behind as a minimal init: the program runs as its child, because the
    kernel ignores default-action signals sent to an init from inside its namespace (abort(),
    kill(getpid(), SIGTERM) would misbehave), and an init must reap orphans."""
    try:
        os.setsid()
        mech = spec["mechanisms"]
        if mech["namespaces"]:
            _build_root(spec)
            _libc.sethostname(b"sandbox", 7)
            cwd = "/tmp"
            _drop_ids(spec["root_mapped"])
        else:
            cwd = spec["workdir"]
            _write_files(spec, cwd)
            os.chdir(cwd)
            if os.geteuid() == 0:
                _drop_to_nobody()
        # After the id change, which clears it: if the launcher dies, so does the sandbox.
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([alive_r], [], [], 0)[0]:  # the launcher died before that line
            os._exit(125)
        if mech["namespaces"]:
            prctl(PR_SET_DUMPABLE, 0)  # the program may not read or write this init's memory
            program = os.fork()
            if program:
                _init(program, init_w, result_fd)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; the program should not
            signal.signal(sig, signal.SIG_DFL)
        _set_limits(spec["limits"])
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        if mech["seccomp"]:
            load_seccomp(spec["libseccomp"])
        if result_fd is not None:
            os.dup2(result_fd, 3, inheritable=True)
        for fd in (0, 1, 2):
            os.set_inheritable(fd, True)
        # Nothing else crosses the exec; err_w is close-on-exec and reports an exec failure.
        low = 4 if result_fd is not None else 3
        os.closerange(low, err_w)
        os.closerange(err_w + 1, 1 << 16)
        env = dict(spec["env"], HOME=cwd, TMPDIR=cwd, PWD=cwd)
        os.execve(spec["argv"][0], spec["argv"], env)
    except BaseException as e:  # noqa: BLE001 - report and end
        try:
            os.write(err_w, f"{type(e).__name__}: {e}".encode()[:2000])
        finally:
            os._exit(127)


def _init(program, init_w, result_fd):
    """pid 1: reap every child; when the program ends, report its wait status and resource use
    to the launcher and exit, which makes the kernel kill whatever is left in the namespace."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Python's handler would let kill(1, SIGINT) in
    keep = {init_w}
    for fd in range(0, 1 << 10):  # hold none of the program's pipes open
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    while True:
        try:
            pid, wstatus, usage = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if pid == program:
            os.write(init_w, marshal.dumps((wstatus, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)))
            os._exit(0)


def main():
    status_fd = int(sys.argv[1])
    result_fd = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None
    status = {}
    workdir = None
    try:
        spec = _read_header()
        mech = spec["mechanisms"]
        was_root = os.geteuid() == 0
        spec["root_mapped"] = was_root
        if mech["namespaces"]:
            _map_ids(was_root)
            flags = NS_FLAGS | (CLONE_NEWCGROUP if os.path.exists("/proc/self/ns/cgroup") else 0)
            unshare(flags, "unshare(mount, pid, net, ipc, uts namespaces)")
        else:
            import tempfile

            workdir = tempfile.mkdtemp(prefix="reinforge-sandbox-")
            if was_root:
                os.chown(workdir, NOBODY, NOBODY)
            spec["workdir"] = workdir
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
        init_r, init_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            os.close(err_r)
            os.close(alive_w)
            os.close(init_r)
            _child(spec, err_w, alive_r, result_fd, init_w)
        os.close(err_w)
        os.close(alive_r)
        os.close(init_w)
        if result_fd is not None:
            os.close(result_fd)  # only the program holds the write end now
        os.close(0)
        os.close(1)
        os.close(2)
        fired, start = [], time.monotonic()

        def on_alarm(signum, frame):
            fired.append(time.monotonic() - start)
            _kill(pid, mech)

        signal.signal(signal.SIGALRM, on_alarm)
        signal.signal(signal.SIGTERM, lambda s, f: _kill(pid, mech))
        setup_error = b""
        while True:  # EOF when exec succeeds (close-on-exec) or the child ends
            chunk = os.read(err_r, 4096)
            if not chunk:
                break
            setup_error += chunk
        # The time limit counts from the exec: building the sandbox is not the program's time.
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, float(spec["wall_s"]))
        _, wstatus, usage = os.wait4(pid, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        wall = time.monotonic() - start
        cpu, maxrss = usage.ru_utime + usage.ru_stime, usage.ru_maxrss
        if mech["namespaces"]:
            report = os.read(init_r, 4096)  # the program's own status, from the init
            if report:
                wstatus, cpu, maxrss = marshal.loads(report)
        else:
            _kill(pid, mech)  # stragglers still in the process group
        os.close(init_r)
        status = {
            "exit_code": os.waitstatus_to_exitcode(wstatus),
            "cpu_s": cpu,
            "maxrss_kb": maxrss,
            "wall_s": wall,
            "timed_out": bool(fired),
        }
        if setup_error:
            status["setup_error"] = setup_error.decode(errors="replace")
    except SetupError as e:
        status = {"setup_error": str(e)}
    except Exception as e:  # noqa: BLE001 - the parent reads the reason from the status
        status = {"setup_error": f"{type(e).__name__}: {e}"}
    finally:
        if workdir is not None:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    os.write(status_fd, marshal.dumps(status))
    os.close(status_fd)


def _kill(pid, mech):
    try:
        if mech["namespaces"]:
            os.kill(pid, signal.SIGKILL)  # pid 1 of the namespace: everything in it dies
        else:
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main()
