"""One file on purpose: sandbox.py compiles this file's own text and sends it whole to a fresh
``python -I -S -B`` as one stdlib-only program (it can import no module of reinforge, nor a
sibling of its own), and a security reviewer reads it top to bottom. Do not split it.

The sandbox launcher: a short-lived trusted process between the reward code and an untrusted
program. It builds the isolation, then runs the program's cases inside it.

It is started as ``python -I -S -B -c <this file's text> STATUS_FD REPORT_FD`` with a clean
environment, so it imports the standard library only and none of the trainer's modules or
secrets, and no host path of the project shows in the sandbox's /proc/1/cmdline. The parent
(sandbox/sandbox.py) writes a header to its stdin (a decimal length, a newline, then that many
bytes of `marshal` data: both sides run the same interpreter). After the header come the cases'
inputs (case["input_len"] bytes each), which the runner reads one case at a time, just before
that case, so no case's fork holds another's; in interactive mode everything after the header is
the program's stdin. The launcher answers with a marshalled status dict on
STATUS_FD; the runner (below) sends one framed report per case on REPORT_FD.

isolation "full" (the default), in this order:
  1. a memory cgroup for the run, when the parent found one it may use (the run's total memory);
  2. unshare a new user namespace and map one unprivileged id (uid/gid 1000 inside). When the
     launcher runs as root, that id is host uid/gid 65534 (nobody), so the program never runs as
     host root: RLIMIT_NPROC is not enforced for host root, and a kernel escape lands unprivileged.
  3. unshare mount, pid, network, IPC, UTS and cgroup namespaces.
  4. fork: the child is pid 1 of the new pid namespace; when it exits, the kernel kills every
     process left in the namespace (fork bombs, daemons, lingering threads).
  5. the child: a new session, a fresh tmpfs root holding read-only bind mounts of only the paths
     the interpreter needs, a few device nodes, a new /proc of its own pid namespace, a size- and
     inode-limited tmpfs /tmp as the working directory; pivot_root and detach the host root; drop
     to the unprivileged id (which drops every capability); parent-death signal; not dumpable.
     Then it stays pid 1 as the RUNNER: for each case it reads the case's input, forks the
     program (every rlimit set afresh, no_new_privs, a seccomp filter that also keeps it from
     changing any process but itself, the runner included, exec; or, for the code verifier's harness, the fork runs
     it with this interpreter, sparing a start-up per case), feeds its stdin, reads its output up to the caps,
     enforces the case's wall-clock limit, then kills everything else in the namespace and
     resets /tmp before the next case. As pid 1 it cannot be signalled from inside the
     namespace (the kernel drops such signals, SIGKILL and SIGSTOP included), and not being
     dumpable, its memory cannot be read or written through /proc: the program shares neither a
     process nor writable memory with what times it and reports its output.
  6. the launcher waits with a wall-clock watchdog for the whole run, kills the namespace's init
     on expiry, removes the cgroup, and writes a status (setup errors, memory peak, OOM kills).

isolation "best_effort" uses whatever of these works (the parent says which) and otherwise runs
the runner in a private temporary directory on the host, each case in a new session, with
rlimits, an unprivileged uid when started as root, and seccomp when libseccomp is available.
"""

# Start-up time is per run, so only cheap modules: marshal instead of json (which pulls in re
# and enum), _signal instead of signal (enum); tempfile only when needed.
import _signal as signal
import ctypes
import errno
import marshal
import mmap
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
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
# fcntl commands that take a POSIX or open-file-description lock (F_SETLK, F_SETLKW, their
# 32-bit *64 forms, F_OFD_SETLK, F_OFD_SETLKW).
_LOCK_COMMANDS = (6, 7, 13, 14, 37, 38)
F_SETPIPE_SZ = 1031  # a pipe keeps its default 64 KiB: the limit that bounds pipe memory


def SCMP_ACT_ERRNO(e):
    return 0x00050000 | (e & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


# Denied with EPERM: what reaches other processes or the kernel's rarely-needed, often-exploited
# corners, and what holds memory outside every per-process limit. Everything else is allowed (a
# program needs files, threads, pipes, mmap, ...).
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
    # Memory no rlimit counts: an anonymous file's pages (memfd), System V shared memory,
    # message queues and semaphores (their sizes are set host-wide, not per run).
    "memfd_create", "memfd_secret", "shmget", "shmat", "msgget", "msgsnd", "semget",
    # Pages handed to a pipe stay allocated after the process unmaps them.
    "vmsplice",
    # Watching or locking the host files bound read-only: inotify sees the host's activity on
    # them, and a lock taken here would block the host's own lock on the same file.
    "inotify_init", "inotify_init1", "inotify_add_watch", "flock",
    # Kernel AIO contexts come from one host-wide pool (fs.aio-max-nr): one case could take it all.
    "io_setup",
)
# Calls that act on another process named by its pid. The runner (pid 1) and every case share
# one uid, so the kernel would let a case lower the runner's rlimits (which the next case
# inherits), renice it or move it to SCHED_IDLE (starving the clock that times the case). They
# are allowed only on the caller itself (pid 0).
SELF_ONLY_SYSCALLS = ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam",
                      "sched_setattr")
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1


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
        # No sockets of any family. IP and raw ones would reach networks; Unix ones reach nothing
        # outside (no host socket path is mounted, the abstract namespace is the sandbox's own),
        # but their buffers are not counted by any per-process limit, and descriptors passed over
        # them (SCM_RIGHTS) can keep memory and pipes alive after every process has exited.
        rule(SCMP_ACT_ERRNO(errno.EAFNOSUPPORT), "socket")
        rule(SCMP_ACT_ERRNO(errno.EAFNOSUPPORT), "socketpair")
        for cmd in (*_LOCK_COMMANDS, F_SETPIPE_SZ):
            rule(eperm, "fcntl", (1, SCMP_CMP_EQ, cmd, 0))
        # No new namespaces through clone flags; clone3 passes its flags in memory, where seccomp
        # cannot look, so it reports ENOSYS and libc falls back to clone.
        for flag in (CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC,
                     CLONE_NEWUTS, CLONE_NEWCGROUP, CLONE_NEWTIME):
            rule(eperm, "clone", (0, SCMP_CMP_MASKED_EQ, flag, flag))
        rule(SCMP_ACT_ERRNO(errno.ENOSYS), "clone3")
        for name in SELF_ONLY_SYSCALLS:
            rule(eperm, name, (0, SCMP_CMP_NE, 0, 0))
        # setpriority/ioprio_set name a process, a process group or a whole uid (the runner's).
        for name, which in (("setpriority", PRIO_PROCESS), ("ioprio_set", IOPRIO_WHO_PROCESS)):
            rule(eperm, name, (0, SCMP_CMP_NE, which, 0))
            rule(eperm, name, (1, SCMP_CMP_NE, 0, 0))
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


# -- the memory cgroup -------------------------------------------------------------------------


class Cgroup:
    """A memory cgroup made for this run under a parent directory the caller may write (the
    parent process checked it): the run's processes and the kernel memory they cause (page
    cache, tmpfs and pipe pages, inodes) are charged to it, and the OOM killer acts inside it
    once the limit is reached.

    Every file it needs later is opened now: the runner's pivot_root also moves this process's
    root (they share a mount namespace), after which /sys is out of sight."""

    def __init__(self, spec):
        parent, self.name = os.path.split(spec["path"])
        self.v2 = spec["version"] == 2
        self.parent = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        os.mkdir(self.name, 0o755, dir_fd=self.parent)
        try:
            self.dir = os.open(self.name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                               dir_fd=self.parent)
            if self.v2:
                self._write("memory.max", spec["limit"])
                self._write("memory.swap.max", 0, optional=True)
            else:
                self._write("memory.limit_in_bytes", spec["limit"])
                self._write("memory.memsw.limit_in_bytes", spec["limit"], optional=True)
            self.procs = self._open("cgroup.procs", os.O_WRONLY)
            self.events = self._open("memory.events" if self.v2 else "memory.oom_control")
            self.peak = self._open("memory.peak" if self.v2 else "memory.max_usage_in_bytes",
                                   optional=True)
        except BaseException:
            os.rmdir(self.name, dir_fd=self.parent)
            raise

    def _open(self, name, flags=os.O_RDONLY, optional=False):
        try:
            return os.open(name, flags | os.O_CLOEXEC, dir_fd=self.dir)
        except FileNotFoundError:
            if optional:
                return None
            raise

    def _write(self, name, value, optional=False):
        fd = self._open(name, os.O_WRONLY, optional)
        if fd is None:
            return
        try:
            os.write(fd, str(int(value)).encode())
        finally:
            os.close(fd)

    def add(self, pid):
        os.write(self.procs, str(pid).encode())

    def peak_bytes(self):
        try:
            return int(os.pread(self.peak, 64, 0).split()[0]) if self.peak is not None else 0
        except (OSError, ValueError, IndexError):
            return 0

    def remove(self):
        for fd in (self.procs, self.events, self.peak, self.dir):
            if fd is not None:
                os.close(fd)
        for _ in range(50):  # the last exiting task may take a moment to leave
            try:
                os.rmdir(self.name, dir_fd=self.parent)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)
        os.close(self.parent)


def oom_kills(events_fd):
    """The cgroup's OOM-kill count, read through a descriptor opened by the launcher."""
    if events_fd is None:
        return 0
    try:
        text = os.pread(events_fd, 4096, 0).decode()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


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


# The sandbox's own /tmp is a fresh tmpfs, which would hide a host path under /tmp bound at the same
# place (a venv or a clone there): such paths are shown under this prefix instead. inside_path
# in limits.py applies the same rule (this file is sent alone, so it cannot import it).
HOST_TMP = "/.host-tmp"


def _inside(path):
    return HOST_TMP + path if path == "/tmp" or path.startswith("/tmp/") else path


def _makedirs(path, mode=0o755):
    os.makedirs(path, mode=mode, exist_ok=True)


def _build_root(spec):
    """A new root at /newroot, then pivot into it. Runs as pid 1 of the new pid namespace."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Stage on /tmp like bubblewrap: it exists everywhere, and after the first pivot the host's
    # own /tmp is still reachable under /oldroot.
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=256")
    os.mkdir("/tmp/newroot")
    os.mkdir("/tmp/oldroot")
    pivot_root("/tmp", "/tmp/oldroot")
    os.chdir("/")
    mount("tmpfs", "/newroot", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=1024")
    for path, target in spec["symlinks"].items():
        _makedirs(os.path.dirname("/newroot" + path))
        os.symlink(target, "/newroot" + path)
    for path in spec["ro_binds"]:
        src, dst = "/oldroot" + path, "/newroot" + _inside(path)
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
    limits = spec["limits"]
    # nr_inodes: every file costs kernel memory (about a kilobyte) whatever its size.
    mount("tmpfs", "/newroot/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"mode=1777,size={int(limits['tmpfs_bytes'])},nr_inodes={int(limits['max_files'])}")
    _makedirs("/newroot/proc")
    try:  # needs a fully visible /proc on the host; containers that mask parts of it refuse
        mount("proc", "/newroot/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        proc = True
    except SetupError:
        proc = False
    _write_files(spec, "/newroot/tmp")
    # The program's id owns its working directory and files, so the runner (as that id) can
    # reset them between cases.
    for name in [".", *spec["files"]]:
        os.chown(os.path.join("/newroot/tmp", name), SANDBOX_ID, SANDBOX_ID)
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


def _clear_dir(path):
    """Remove everything below `path` (not `path` itself), whatever the program did to it:
    directories made unreadable, nesting as deep as the inode limit allows, symlinks (never
    followed). Depth-first with one open directory at a time (it climbs back through ".."), so
    no nesting runs the runner out of descriptors."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    names = []  # the directories entered, below path
    while True:
        sub = None
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    sub = entry.name
                    break
                try:
                    os.unlink(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    pass
        if sub is not None:
            try:  # a directory, not a link (every process of the case is gone: no race)
                os.chmod(sub, 0o700, dir_fd=fd)
            except OSError:
                pass
            child = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
            names.append(sub)
            continue
        if not names:
            os.close(fd)
            return
        parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        os.rmdir(names.pop(), dir_fd=parent)
        fd = parent


# Every rlimit a process has: each case sets all of them (below), none inherited from the runner.
ALL_RLIMITS = tuple(getattr(resource, n) for n in (
    "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_RSS",
    "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_AS", "RLIMIT_LOCKS",
    "RLIMIT_SIGPENDING", "RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_RTPRIO", "RLIMIT_RTTIME")
    if hasattr(resource, n))


def _set_limits(limits, base):
    """Set every rlimit of the case's process afresh: the sandbox's limits, no raising of its
    priority (NICE, RTPRIO 0), and the rest as the launcher had them before any case ran."""
    cpu = limits["cpu_s"]
    inf = resource.RLIM_INFINITY
    chosen = {res: lim for res, lim in base}
    for res, soft, hard in (
        (resource.RLIMIT_CPU, inf if cpu is None else cpu, inf if cpu is None else cpu + 1),
        (resource.RLIMIT_AS, limits["as_bytes"], limits["as_bytes"]),
        (resource.RLIMIT_NPROC, limits["nproc"], limits["nproc"]),
        (resource.RLIMIT_FSIZE, limits["fsize_bytes"], limits["fsize_bytes"]),
        (resource.RLIMIT_NOFILE, limits["nofile"], limits["nofile"]),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_MEMLOCK, 0, 0),
        (resource.RLIMIT_MSGQUEUE, 0, 0),
        (resource.RLIMIT_NICE, 0, 0),
        (resource.RLIMIT_RTPRIO, 0, 0),
    ):
        chosen[res] = (soft, hard)
    for res, (soft, hard) in chosen.items():
        resource.setrlimit(res, (int(soft), int(hard)))


def _own_state():
    """What a process of the same uid could change about the runner: its rlimits (inherited by
    every later case), its priority, its scheduling policy and its CPUs. seccomp forbids those
    calls on other processes; the runner also checks after every case that nothing changed."""
    return ([resource.getrlimit(r) for r in ALL_RLIMITS], os.getpriority(os.PRIO_PROCESS, 0),
            os.sched_getscheduler(0), sorted(os.sched_getaffinity(0)))


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


def _child(spec, fds):
    """The runner: builds the view, drops privileges, then runs every case. Setup failures are
    reported through fds["err"]; the cases' reports go to fds["report"]. Never returns.

    With namespaces this process is pid 1 of the new pid namespace, so it also reaps orphans, and
    the programs run as its children: the kernel ignores default-action signals sent to an init
    from inside its namespace (abort() in the program itself would misbehave)."""
    err_w = fds["err"]
    try:
        os.setsid()
        if os.read(fds["go"], 1) != b"1":  # the launcher has moved us into the cgroup
            os._exit(125)
        os.close(fds["go"])
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
        if select.select([fds["alive"]], [], [], 0)[0]:  # the launcher died before that line
            os._exit(125)
        prctl(PR_SET_DUMPABLE, 0)  # no program may read or write the runner's memory
        inputs = None
        if spec["interactive"]:
            # The program talks to the caller directly over the launcher's stdin and stdout.
            stdio = {0: 0, 1: 1, 2: 2}
        else:
            # The cases' inputs follow the header on stdin; read one case's just before it runs.
            inputs = os.dup(0)
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.close(null)
            stdio = None
        keep = {fds["report"], fds["events"], err_w, inputs} - {None}
        if not spec["interactive"]:
            keep |= {0, 1, 2}
        for fd in range(0, 1 << 10):  # hold none of the caller's pipes beyond what is needed
            if fd not in keep and fd not in (0, 1, 2):
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.close(err_w)  # setup done: EOF tells the launcher
        err_w = None
    except BaseException as e:  # noqa: BLE001 - report and end
        if err_w is not None:
            try:
                os.write(err_w, f"{type(e).__name__}: {e}".encode()[:2000])
            finally:
                os._exit(127)
        os._exit(127)
    _runner(spec, fds["report"], fds["events"], inputs, cwd, stdio)


# -- the runner: one program per case ----------------------------------------------------------


def _runner(spec, report_fd, events_fd, inputs_fd, cwd, stdio):
    ns = spec["mechanisms"]["namespaces"]
    if ns:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Python's handler would let kill(1, SIGINT) in
    state = _own_state()
    cases = spec["cases"]
    for i, case in enumerate(cases):
        if i:
            try:
                _clear_dir(cwd)
                _write_files(spec, cwd)
            except OSError as e:
                _send(report_fd, {"i": i, "status": "setup_error",
                                  "reason": f"resetting the working directory: {e}"})
                break
        before = oom_kills(events_fd)
        report, sinks = _run_case(spec, case, ns, cwd, stdio, inputs_fd)
        report["i"] = i
        report["oom"] = oom_kills(events_fd) > before
        if _own_state() != state:  # unreachable while seccomp holds; never trust a changed runner
            report = {"i": i, "status": "tampered"}
        _send(report_fd, report, sinks)
        for sink in sinks.values():
            sink.close()
        if report["status"] == "tampered":
            for j in range(i + 1, len(cases)):
                _send(report_fd, {"i": j, "status": "not_run",
                                  "reason": "not run: an earlier case changed the sandbox's runner"})
            break
    os._exit(0)


def _send(fd, report, sinks=None):
    """One case's report: a decimal length, a newline, marshal data (the report, with the length
    of each stream), then each stream's bytes, written straight from its sink."""
    streams = [(name, sink) for name, sink in (sinks or {}).items()]
    report["lens"] = {name: sink.length() for name, sink in streams}
    data = marshal.dumps(report)
    _write_all(fd, str(len(data)).encode() + b"\n" + data)
    for _, sink in streams:
        with memoryview(sink.mm) as view:
            _write_all(fd, view[sink.start():sink.end()])


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[n:]
    view.release()


class _Sink:
    """One output stream of a case, read into a private anonymous mapping of its cap (+1 byte to
    see the overflow) instead of the Python heap: unmapped after the case's report, so what a
    case printed is not left in freed memory for a later case's fork to find. keep: only the
    last this many bytes are reported (a case's stderr)."""

    def __init__(self, cap, keep=None):
        self.cap, self.keep, self.n = cap, keep, 0
        self.mm = mmap.mmap(-1, cap + 1, flags=mmap.MAP_PRIVATE)

    def read(self, fd):
        """Read what is there; False at end of file. Stops reading once past the cap."""
        if self.n > self.cap:
            return True
        with memoryview(self.mm) as view:
            part = view[self.n:]
            got = os.readv(fd, [part])
            part.release()
        self.n += got
        return got > 0

    @property
    def over(self):
        return self.n > self.cap

    def end(self):
        return min(self.n, self.cap)

    def start(self):
        return 0 if self.keep is None else max(0, self.end() - self.keep)

    def length(self):
        return self.end() - self.start()

    def close(self):
        self.mm.close()


def _read_input(fd, n):
    """One case's input from the caller, read into a private mapping that is unmapped after the
    case (no copy of it stays in the runner's heap for a later case's fork to find)."""
    if not n:
        return None
    mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE)
    got = 0
    with memoryview(mm) as view:
        while got < n:
            part = view[got:]
            k = os.readv(fd, [part])
            part.release()
            if not k:
                break
            got += k
    if got < n:
        mm.close()
        raise OSError(f"the case's input ended after {got} of {n} bytes")
    return mm


def _exec_program(spec, case, cwd, fds, err_w, inp):
    """In the case's child: limits, filter, descriptors, exec. Never returns."""
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; the program should not
            signal.signal(sig, signal.SIG_DFL)
        if spec["mechanisms"]["namespaces"]:
            os.setpgid(0, 0)
        else:  # a session of its own, killed at the case's end; and it dies with the runner
            runner = os.getppid()
            os.setsid()
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != runner:
                os._exit(125)
        _set_limits(spec["limits"], spec["base_rlimits"])
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        if spec["mechanisms"]["seccomp"]:
            load_seccomp(spec["libseccomp"])
        # Move the case's descriptors to 0-3 (via high numbers first, so none is overwritten).
        high = {}
        for target, fd in fds.items():
            high[target] = os.dup(fd) if fd is not None else None
        for target, fd in high.items():
            if fd is not None:
                os.dup2(fd, target, inheritable=True)
        low = 4 if fds.get(3) is not None else 3
        os.closerange(low, err_w)
        os.closerange(err_w + 1, 1 << 16)
        env = dict(spec["env"], HOME=cwd, TMPDIR=cwd, PWD=cwd)
        if case.get("harness") is not None:
            os.close(err_w)  # set up: no exec will close it, and the runner waits for its EOF
            _run_harness(spec, case["harness"], env, inp)
        argv = case["argv"]
        os.execve(argv[0], argv, env)
    except BaseException as e:  # noqa: BLE001 - report and end
        try:
            os.write(err_w, f"{type(e).__name__}: {e}".encode()[:2000])
        finally:
            os._exit(127)


def _run_harness(spec, harness, env, inp):
    """The code verifier's harness (sandbox/harness.py, sent compiled) in this forked copy of the
    runner's interpreter instead of a new one: the same process boundary and limits, without an
    interpreter start-up per test case. The copy holds nothing secret (inputs, no expected
    outputs) and shares no writable memory with the runner. Never returns."""
    import builtins

    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has
        prctl(PR_SET_DUMPABLE, 1)  # an ordinary process again (the runner stays not dumpable)
        os.environ.clear()
        os.environ.update(env)
        job = dict(harness)
        if job["mode"] == "function":  # this case's call, from its own input
            job.update(marshal.loads(inp))
        sys.argv[:] = ["-c", job["mode"]]
        code = marshal.loads(spec["harness_code"])
    except BaseException:  # noqa: BLE001
        os._exit(127)
    exec(code, {"__name__": "__harness__", "__builtins__": builtins, "JOB": job})
    os._exit(0)


def _kill_rest(pid, ns):
    """Every process of the case: with a pid namespace, all of them but this init (kill -1 from
    pid 1); without, the case's session."""
    try:
        if ns:
            os.kill(-1, signal.SIGKILL)
        else:
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(ns, pid):
    if ns:
        while True:  # every process of the namespace is our child or was re-parented to us
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _run_case(spec, case, ns, cwd, stdio, inputs_fd):
    """Fork the program for one case and watch it: stdin fed, output read up to the caps, the
    wall-clock limit from the fork on (so the program's start-up and imports count). Returns
    the report and the case's output sinks."""
    try:
        inp = _read_input(inputs_fd, case["input_len"])
    except OSError as e:
        return {"status": "setup_error", "reason": f"reading the case's input: {e}"}, {}
    try:
        return _watch_case(spec, case, ns, cwd, stdio, inp)
    finally:
        if inp is not None:
            inp.close()


def _watch_case(spec, case, ns, cwd, stdio, inp):
    caps = case["caps"]
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    parent_ends, child_fds = {}, {}
    if stdio is not None:  # interactive: the program uses the caller's pipes directly
        child_fds = dict(stdio)
    else:
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        child_fds[0], parent_ends["stdin"] = in_r, in_w
        for target, name in ((1, "stdout"), (2, "stderr"), (3, "results")):
            if name in caps:
                r, w = os.pipe2(os.O_CLOEXEC)
                child_fds[target], parent_ends[name] = w, r
        if 1 not in child_fds:
            child_fds[1] = os.open("/dev/null", os.O_WRONLY | os.O_CLOEXEC)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(err_r)
        for fd in parent_ends.values():
            os.close(fd)
        _exec_program(spec, case, cwd, child_fds, err_w, inp)
    os.close(err_w)
    for target, fd in child_fds.items():
        if stdio is None or fd not in (0, 1, 2):
            os.close(fd)
    if stdio is not None:  # the caller's pipes now belong to the program alone
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    setup_error = b""
    while True:  # EOF when exec succeeds (close-on-exec) or the child ends
        chunk = os.read(err_r, 4096)
        if not chunk:
            break
        setup_error += chunk
    os.close(err_r)
    if setup_error:
        for fd in parent_ends.values():
            os.close(fd)
        _reap(ns, pid)
        return {"status": "setup_error", "reason": setup_error.decode(errors="replace")}, {}

    timeout = case["timeout_s"]
    deadline = None if timeout is None else start + timeout
    # stdin is the case's input, unless the harness took it as its call's arguments.
    feed = inp is not None and (case["harness"] or {}).get("mode") != "function"
    stdin = memoryview(inp) if feed else memoryview(b"")
    sinks = {name: _Sink(caps[name], case.get("stderr_keep") if name == "stderr" else None)
             for name in parent_ends if name != "stdin"}
    poller = select.poll()
    names = {}
    for name, fd in parent_ends.items():
        if name == "stdin":
            if stdin:
                os.set_blocking(fd, False)
                poller.register(fd, select.POLLOUT)
                names[fd] = name
            else:
                os.close(fd)
        else:
            poller.register(fd, select.POLLIN)
            names[fd] = name
    try:
        pidfd = os.pidfd_open(pid)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):  # kernels before 5.3: poll for the exit instead
        pidfd = None
    status, overflow, wstatus, usage = None, None, None, None
    while wstatus is None:
        wait_ms = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000) + 1)
        if pidfd is None:
            wait_ms = 10 if wait_ms < 0 else min(wait_ms, 10)
        if deadline is not None and time.monotonic() >= deadline:
            status = "timeout"
            break
        try:
            events = poller.poll(wait_ms)
        except InterruptedError:
            continue
        for fd, ev in events:
            if fd == pidfd:
                continue
            name = names.get(fd)
            if name == "stdin":
                try:
                    sent = os.write(fd, stdin[:65536])
                    stdin = stdin[sent:]
                except BlockingIOError:
                    continue
                except OSError:  # the program closed its stdin
                    stdin = stdin[:0]
                if not stdin:
                    poller.unregister(fd)
                    os.close(fd)
                    del names[fd]
                continue
            if not sinks[name].read(fd):
                poller.unregister(fd)
                continue
            if sinks[name].over and overflow is None:
                overflow = name
        if overflow is not None:
            status = "output_limit"
            break
        done, st, ru = os.wait4(pid, os.WNOHANG)
        if done:
            wstatus, usage = st, ru
    stdin.release()
    wall = time.monotonic() - start
    if wstatus is None:  # timeout or overflow: the program is still running
        _kill_rest(pid, ns)
        if not ns:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, wstatus, usage = os.wait4(pid, 0)
    # What the program left behind (threads end with it; daemons, children) ends with the case.
    _kill_rest(pid, ns)
    _reap(ns, pid)
    if pidfd is not None:
        os.close(pidfd)
    # Drain what was written before the end; every writer is gone, so EOF comes at once (without
    # namespaces an escaped daemon may hold a pipe: never wait long).
    drain_until = time.monotonic() + (0.0 if ns else 0.2)
    for fd, name in list(names.items()):
        if name == "stdin":
            os.close(fd)
            continue
        os.set_blocking(fd, False)
        while overflow is None:
            try:
                more = sinks[name].read(fd)
            except BlockingIOError:
                if time.monotonic() > drain_until:
                    break
                select.select([fd], [], [], 0.01)
                continue
            if not more:
                break
            if sinks[name].over:
                overflow = name
                status = status or "output_limit"
        os.close(fd)
    # An exit after the limit is a timeout whatever its status: the runner may have been slow
    # to see it (a busy machine), but the case's own time is over the limit either way.
    if status is None and timeout is not None and wall > timeout:
        status = "timeout"
    report = {
        "status": status or "exited",
        "exit_code": os.waitstatus_to_exitcode(wstatus),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "maxrss_kb": usage.ru_maxrss,
        "wall_s": wall,
        "overflow": overflow,
    }
    return report, sinks


def main():
    status_fd = int(sys.argv[1])
    report_fd = int(sys.argv[2])
    status = {}
    workdir = None
    cgroup = None
    start = time.monotonic()
    try:
        spec = _read_header()
        mech = spec["mechanisms"]
        was_root = os.geteuid() == 0
        spec["root_mapped"] = was_root
        # What each case's rlimits start from: the launcher's, taken before any case ran.
        spec["base_rlimits"] = [(r, resource.getrlimit(r)) for r in ALL_RLIMITS]
        if spec.get("cgroup"):
            try:
                cgroup = Cgroup(spec["cgroup"])
            except OSError as e:
                raise SetupError(f"creating the run's memory cgroup {spec['cgroup']['path']}: "
                                 f"{e.strerror or e}") from None
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
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        fds = {"err": err_w, "alive": alive_r, "go": go_r, "report": report_fd,
               "events": cgroup.events if cgroup else None}
        pid = os.fork()
        if pid == 0:
            os.close(err_r)
            os.close(alive_w)
            os.close(go_w)
            _child(spec, fds)
        os.close(err_w)
        os.close(alive_r)
        os.close(go_r)
        os.close(report_fd)  # only the runner holds the write end now
        try:
            if cgroup is not None:
                cgroup.add(pid)
            os.write(go_w, b"1")
        finally:
            os.close(go_w)
        os.close(0)
        os.close(1)
        os.close(2)
        fired = []

        def on_alarm(signum, frame):
            fired.append(True)
            _kill(pid, mech)

        signal.signal(signal.SIGALRM, on_alarm)
        signal.signal(signal.SIGTERM, lambda s, f: _kill(pid, mech))
        setup_error = b""
        while True:  # EOF once the runner finished its setup (or ended)
            chunk = os.read(err_r, 4096)
            if not chunk:
                break
            setup_error += chunk
        os.close(err_r)
        # Building the sandbox is not the program's time: the limit counts from here.
        start = time.monotonic()
        if spec["wall_s"] is not None:
            signal.setitimer(signal.ITIMER_REAL, float(spec["wall_s"]))
        while True:
            try:
                _, wstatus, _ = os.wait4(pid, 0)
                break
            except InterruptedError:
                continue
        signal.setitimer(signal.ITIMER_REAL, 0)
        if not mech["namespaces"]:
            _kill(pid, mech)  # stragglers still in the runner's session
        status = {"runner_exit": os.waitstatus_to_exitcode(wstatus), "timed_out": bool(fired)}
        if setup_error:
            status["setup_error"] = setup_error.decode(errors="replace")
    except SetupError as e:
        status = {"setup_error": str(e)}
    except Exception as e:  # noqa: BLE001 - the parent reads the reason from the status
        status = {"setup_error": f"{type(e).__name__}: {e}"}
    finally:
        status["wall_s"] = time.monotonic() - start
        if cgroup is not None:
            status["memory_peak_bytes"] = cgroup.peak_bytes()
            status["oom_kills"] = oom_kills(cgroup.events)
            cgroup.remove()
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
