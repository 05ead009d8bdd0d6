"""The code sandbox, run for real: limits with clear reasons, what a program can see, and an
adversarial corpus (tests/sandbox_corpus/*.py) that must stay contained and score 0.

Each corpus file starts with `# attack:`, `# mode:` (function: defines add(a, b); stdio: a
stdin/stdout program) and `# expect:` (a regex the verifier's reason must match); @@NAME@@
placeholders are filled in with host details the program tries to reach.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import reinforge.sandbox as sandbox_module
from reinforge.rewards.code import CodeVerifier
from reinforge.sandbox import Case, Job, Sandbox, SandboxLimits, SandboxUnavailable
from reinforge.sandbox import probe as sandbox_probe  # where memory_cgroup keeps its cache
from reinforge.sandbox import sandbox as sandbox_impl  # where Sandbox._probe looks its names up
from reinforge.tasks.base import Example

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).parent / "sandbox_corpus"
ADD = {"id": "add", "entry_point": "add",
       "tests": [{"args": [2, 3], "expected": 5}, {"args": [10, -4], "expected": 6}]}
SHOUT = {"id": "shout", "tests": [{"stdin": "hello\n", "stdout": "HELLO\n"},
                                  {"stdin": "Hi\n", "stdout": "HI\n"}]}
CASE_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def sb():
    return Sandbox(SandboxLimits(timeout_s=2.0))


def _py(sb, code: str) -> list[str]:
    return [sb.python, "-I", "-S", "-c", code]


# -- running and limits --------------------------------------------------------------------------


def test_honest_program_reads_stdin_and_writes_stdout(sb):
    r = sb.run(_py(sb, "import sys; print(sys.stdin.read()[::-1], end='')"), stdin=b"abc")
    assert (r.status, r.stdout, r.exit_code, r.reason) == ("ok", b"cba", 0, "")


@pytest.mark.parametrize(
    "code, status, reason",
    [
        ("while True: pass", "timeout", r"timeout: still running after 1 s \(wall clock\)"),
        ("import time; time.sleep(100)", "timeout", r"timeout: still running after 1 s"),
        ("x = bytearray(10**11)", "memory_limit", r"memory limit: 256 MiB"),
        ("import sys\nwhile True: sys.stdout.write('x' * 65536)", "output_limit",
         r"output limit: more than 100000 bytes on stdout"),
        ("import sys\nwhile True: sys.stderr.write('x' * 65536)", "output_limit", r"on stderr"),
        ("1 / 0", "runtime_error", r"runtime error \(exit code 1\): ZeroDivisionError: division by zero"),
        ("import sys; sys.exit(3)", "runtime_error", r"exit code 3"),
        ("import os; os.abort()", "killed", r"killed by signal SIGABRT"),
        ("import ctypes; ctypes.string_at(0)", "killed", r"killed by signal SIGSEGV"),
    ],
)
def test_limits_are_enforced_and_named(code, status, reason):
    sb = Sandbox(SandboxLimits(timeout_s=1.0, memory_mb=256, max_output_bytes=100_000))
    t0 = time.monotonic()
    r = sb.run(_py(sb, code))
    assert r.status == status, (r.reason, r.stderr[-300:])
    assert re.search(reason, r.reason), r.reason
    assert time.monotonic() - t0 < 6.0  # the limit, plus start-up; never the program's own pace
    assert len(r.stdout) <= 100_000 and len(r.stderr) <= 100_000


def test_cpu_time_limit_stops_a_busy_program_before_the_wall_clock():
    sb = Sandbox(SandboxLimits(timeout_s=20.0, cpu_s=1))
    r = sb.run(_py(sb, "while True: pass"))
    assert r.status == "timeout" and "CPU time limit of 1 s" in r.reason, r.reason
    assert r.wall_s < 10


def test_file_size_and_working_directory_limits():
    sb = Sandbox(SandboxLimits(timeout_s=5.0, max_file_mb=1, tmpfs_mb=4))
    big = sb.run(_py(sb, "open('f', 'wb').write(b'0' * (2 << 20))"))
    assert big.status == "output_limit" and "file size limit: 1 MiB" in big.reason, big.reason
    full = sb.run(_py(sb, "for i in range(10): open(f'f{i}', 'wb').write(b'0' * ((1 << 20) - 1))"))
    assert full.status == "output_limit" and "working directory full: 4 MiB" in full.reason, full.reason


def test_many_processes_fail_at_the_process_limit():
    sb = Sandbox(SandboxLimits(timeout_s=5.0, max_processes=8))
    code = "\n".join([
        "import os, time",
        "n = 0",
        "try:",
        "    while True:",
        "        if os.fork() == 0:",
        "            time.sleep(100)",
        "        n += 1",
        "except OSError as e:",
        "    print(n, e.errno)",
    ])
    r = sb.run(_py(sb, code))
    assert r.status == "ok", r.reason
    n, err = map(int, r.stdout.split())
    assert n < 8 and err == 11  # EAGAIN: RLIMIT_NPROC


def test_each_run_gets_a_fresh_private_working_directory(sb):
    assert sb.run(_py(sb, "open('left_behind', 'w').write('x')")).ok
    r = sb.run(_py(sb, "import os; print(os.getcwd(), sorted(os.listdir('.')))"),
               files={"given.txt": "hello"})
    assert r.stdout.decode().split(None, 1) == ["/tmp", "['given.txt']\n"]


def test_what_the_program_sees(sb):
    code = "\n".join([
        "import os, socket",
        "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)",
        "print(sorted(os.listdir('/')))",
        "print(os.getuid(), os.getgid(), os.getpid())",
        "print(status['CapEff'], status['NoNewPrivs'], status['Seccomp'])",
        "print(socket.gethostname())",
        "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))",
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))",
        "print(sorted(os.listdir('/dev')))",
        "print(sorted(os.environ))",
    ])
    r = sb.run(_py(sb, code))
    assert r.ok, r.reason + r.stderr.decode()[-500:]
    lines = r.stdout.decode().splitlines()
    top = eval(lines[0])  # noqa: S307 - our own program's output
    assert set(top) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp",
                        "usr", *Path(sys.base_prefix).resolve().parts[1:2]}
    assert lines[1] == "1000 1000 2"  # unprivileged; pid 2 of its own pid namespace (1: a tiny init)
    assert lines[2] == "0000000000000000 1 2"  # no capabilities, no_new_privs, seccomp filter
    assert lines[3] == "sandbox"
    assert lines[4] == "['lo']"  # a network namespace of its own: no interfaces to the world
    assert lines[5] == "['1', '2']"  # sees no process but itself and its init
    assert eval(lines[6]) == ["fd", "full", "null", "random", "stderr", "stdin", "stdout", "urandom", "zero"]  # noqa: S307
    assert eval(lines[7]) == ["HOME", "LANG", "LC_ALL", "PATH", "PWD", "TMPDIR"]  # noqa: S307


def test_the_project_and_its_venv_are_invisible(sb):
    paths = [str(ROOT), str(ROOT / "reinforge" / "config.py"), sys.prefix, str(Path.home() / ".ssh"),
             "/etc/passwd", "/etc/shadow", "/var", "/run", "/sys", "/home", "/root/.bash_history"]
    code = f"import os; print([os.path.exists(p) for p in {paths!r}])"
    r = sb.run(_py(sb, code))
    assert r.stdout.decode().strip() == str([False] * len(paths)), r.stdout


def test_pool_runs_jobs_in_parallel_in_order(sb):
    jobs = [Job(_py(sb, f"print({i} * {i})")) for i in range(12)]
    results = sb.map(jobs)
    assert [r.stdout for r in results] == [f"{i * i}\n".encode() for i in range(12)]
    assert sb.workers >= 1


# -- missing mechanisms: refuse, or run weaker only when asked -------------------------------------


@pytest.fixture
def fresh_probe(monkeypatch):
    monkeypatch.setattr(sandbox_impl, "_probe_cache", {})


def test_full_isolation_refuses_without_seccomp_and_names_the_fix(monkeypatch, fresh_probe):
    monkeypatch.setattr(sandbox_impl, "_libseccomp_error",
                        lambda: "libseccomp.so.2 cannot be loaded (test); install it")
    with pytest.raises(SandboxUnavailable) as err:
        Sandbox()
    msg = str(err.value)
    assert "seccomp" in msg and "install" in msg and "isolation: best_effort" in msg


def test_full_isolation_refuses_without_namespaces(monkeypatch, fresh_probe):
    real = Sandbox._try
    monkeypatch.setattr(Sandbox, "_try", lambda self, mech: "unshare: Operation not permitted (test)"
                        if mech["namespaces"] else real(self, mech))
    with pytest.raises(SandboxUnavailable, match=r"(?s)namespaces: unshare.*sysctl.*best_effort"):
        Sandbox()


def test_best_effort_without_namespaces_warns_and_still_enforces_limits(monkeypatch, fresh_probe, tmp_path):
    real = Sandbox._try
    monkeypatch.setattr(Sandbox, "_try", lambda self, mech: "unshare: Operation not permitted (test)"
                        if mech["namespaces"] else real(self, mech))
    # As root, a program without namespaces runs as nobody, who cannot enter root's home (where
    # e.g. pyenv keeps the interpreter); a system interpreter is reachable.
    python = None
    if os.geteuid() == 0 and not _reachable_by_others(sandbox_module.sandbox_python()):
        if not Path("/usr/bin/python3").exists():
            pytest.skip("as root, needs an interpreter that nobody can reach")
        python = "/usr/bin/python3"
        with pytest.raises(SandboxUnavailable, match="runs as nobody.*pass python="):
            Sandbox(isolation="best_effort")
    with pytest.warns(RuntimeWarning, match="WITHOUT namespaces.*read and write your files"):
        sb = Sandbox(SandboxLimits(timeout_s=1.0, memory_mb=256), isolation="best_effort", python=python)
    assert (sb.mechanisms["namespaces"], sb.mechanisms["seccomp"]) == (False, True)
    r = sb.run(_py(sb, "import os; print(os.getcwd()); open('x', 'w').write('1')"))
    workdir = r.stdout.decode().strip()
    assert r.ok and "reinforge-sandbox-" in workdir and not os.path.exists(workdir)  # removed after
    assert sb.run(_py(sb, "while True: pass")).status == "timeout"
    assert sb.run(_py(sb, "x = bytearray(10**11)")).status == "memory_limit"
    net = sb.run(_py(sb, "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)"))
    assert "Address family not supported" in net.reason  # seccomp still refuses IP sockets
    marker = uuid.uuid4().hex
    code = f"import os, time\nif os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '60', '{marker}'])\n"
    assert sb.run(_py(sb, code)).ok
    assert not _processes_with(marker)  # the process group is killed when the program ends
    r = sb.run_job(_harness_job())  # the code verifier's harness: a fresh interpreter here
    assert [c.results for c in r.cases] == [b"ok\n5", b"ok\n-1"], [c.reason for c in r.cases]


def _reachable_by_others(path: str) -> bool:
    p = Path(path)
    return all(os.stat(d).st_mode & 0o001 for d in p.parents) and bool(os.stat(p).st_mode & 0o005)


def test_isolation_name_is_checked():
    with pytest.raises(ValueError, match="isolation must be one of full, best_effort"):
        Sandbox(isolation="none")
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        SandboxLimits(timeout_s=0)


# -- the adversarial corpus ------------------------------------------------------------------------


def _processes_with(marker: str, wait_s: float = 2.0) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                        found.append(int(pid))
                except OSError:
                    pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _header(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"# (\w+): (.*)", line)
        if not m:
            break
        out[m.group(1)] = m.group(2)
    return out


CORPUS_FILES = sorted(CORPUS.glob("*.py"))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """What the corpus tries to reach: a sentinel process, listening sockets, files, a secret."""
    tmp = tmp_path_factory.mktemp("host")
    token = uuid.uuid4().hex
    secret_file = tmp / "secret.txt"
    secret_file.write_text(f"SECRET-{token}")
    os.environ["REINFORGE_SANDBOX_TEST_SECRET"] = f"ENV-{token}"
    sentinel = subprocess.Popen(["sleep", "600"])
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    tcp.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(f"\0reinforge-test-{token}")
    unix.listen()
    unix.setblocking(False)
    project_file = ROOT / "reinforge" / "rewards" / "code.py"
    values = {
        "MARKER": f"marker-{token}", "CANARY": f"canary-{token}", "SENTINEL_PID": str(sentinel.pid),
        "HOST_FILE": str(tmp / "pwned.txt"), "PROJECT_FILE": str(project_file),
        "TCP_PORT": str(tcp.getsockname()[1]), "UDP_PORT": str(udp.getsockname()[1]),
        "UNIX_NAME": f"reinforge-test-{token}",
    }
    secrets = [f"SECRET-{token}".encode(), f"ENV-{token}".encode(), b"root:x:0:0",
               b"The `code` verifier: take the program out of a completion"]
    yield {"values": values, "secrets": secrets, "sentinel": sentinel, "tcp": tcp, "udp": udp,
           "unix": unix, "tmp": tmp}
    sentinel.kill()
    sentinel.wait()
    for s in (tcp, udp, unix):
        s.close()
    os.environ.pop("REINFORGE_SANDBOX_TEST_SECRET", None)


@pytest.fixture(scope="module")
def corpus_runs(host):
    """Every corpus program through the code verifier's own path, in one parallel batch."""
    verifier = CodeVerifier(timeout_s=CASE_TIMEOUT_S, memory_mb=128, max_processes=16,
                            max_output_bytes=200_000)
    plans, jobs = {}, []
    for path in CORPUS_FILES:
        text = path.read_text()
        for key, value in host["values"].items():
            text = text.replace(f"@@{key}@@", value)
        head = _header(text)
        meta = ADD if head["mode"] == "function" else SHOUT
        example = Example(f"corpus/{path.stem}", [], None, meta)
        code, problem = verifier._plan(f"```python\n{text}```", example)
        plans[path.stem] = (head, problem, example, len(jobs))
        jobs.append(verifier._job(code, problem))
    t0 = time.monotonic()
    runs = verifier.sandbox.map(jobs)
    elapsed = time.monotonic() - t0
    out = {name: (head, verifier._verdict(runs[i], problem, example), runs[i], jobs[i])
           for name, (head, problem, example, i) in plans.items()}
    return out, elapsed


def test_corpus_is_large_and_well_formed():
    assert len(CORPUS_FILES) >= 40
    for path in CORPUS_FILES:
        head = _header(path.read_text())
        assert {"attack", "mode", "expect"} <= set(head), path.name
        assert head["mode"] in ("function", "stdio"), path.name


@pytest.mark.parametrize("name", [p.stem for p in CORPUS_FILES])
def test_corpus_program_is_contained_and_scores_zero(name, corpus_runs, host):
    head, result, run, job = corpus_runs[0][name]
    assert result.score == 0.0 and result.correct is False, (head["attack"], result.details)
    assert re.search(head["expect"], result.details["reason"]), (head["attack"], result.details["reason"])
    cases = run.cases or [run]
    produced = b"".join(c.stdout + c.stderr + c.results for c in cases)
    for secret in host["secrets"]:
        assert secret not in produced, (head["attack"], secret)
    for case, spec in zip(cases, job.case_list()):  # every case ended within its own limit
        assert case.wall_s <= spec.timeout_s + 1.0, (head["attack"], case.wall_s)
        assert case.status != "setup_error", case.reason


def test_host_and_trainer_untouched_by_the_corpus(corpus_runs, host):
    _, elapsed = corpus_runs
    assert host["sentinel"].poll() is None  # a host process survived kill(-1), scans, pid guesses
    assert os.getpid() and True  # and so did this process (the "trainer")
    values = host["values"]
    assert not Path(values["HOST_FILE"]).exists()
    assert not Path("/tmp", values["CANARY"]).exists()
    for d in ("/usr/lib", os.path.dirname(os.__file__), "/etc", "/", str(ROOT)):
        assert not Path(d, values["CANARY"]).exists(), d
    for sock, what in ((host["tcp"], "TCP"), (host["unix"], "abstract Unix")):
        with pytest.raises(BlockingIOError):
            sock.accept()  # nobody connected
    with pytest.raises(BlockingIOError):
        host["udp"].recv(100)
    assert not _processes_with(values["MARKER"])  # no fork bomb child or daemon outlived its run
    assert elapsed < 120  # a bound, not a benchmark: every program was stopped by a limit


def test_signals_from_the_sandbox_cannot_reach_the_caller(sb):
    # The program's process group and session are its own: kill(0) and killpg hit only itself.
    r = sb.run(_py(sb, "import os, signal; os.killpg(0, signal.SIGKILL)"))
    assert r.status == "killed" and "SIGKILL" in r.reason
    assert signal.getsignal(signal.SIGINT) is not None  # still running, here


# -- cases: one fresh process each ------------------------------------------------------------------


def test_each_case_is_a_fresh_process_in_a_fresh_working_directory(sb):
    code = "\n".join([
        "import os, sys",
        "print(os.getpid(), sorted(os.listdir('.')), sys.stdin.read())",
        "open('given.txt', 'a').write('changed')",
        "os.makedirs('d/e', exist_ok=True); open('d/e/f', 'w').write('x'); os.chmod('d', 0)",
        "for _ in range(1500):  # deeper than the runner may hold directories open",
        "    os.mkdir('n'); os.chdir('n')",
        "os.chmod('.', 0)",
    ])
    cases = [Case(stdin=b"first"), Case(stdin=b"second"), Case(stdin=b"third")]
    r = sb.run_job(Job(_py(sb, code), files={"given.txt": "hello"}, cases=cases))
    assert [c.status for c in r.cases] == ["ok"] * 3, [c.reason for c in r.cases]
    lines = [c.stdout.decode().split() for c in r.cases]
    assert [ln[1:] for ln in lines] == [["['given.txt']", s] for s in ("first", "second", "third")]
    assert len({ln[0] for ln in lines}) == 3  # a new process each time


def _harness_job() -> Job:
    cases = [Case(harness={"mode": "function", "entry_point": "add", "args": args, "kwargs": {}},
                  result_channel=True, capture_stdout=False) for args in ([2, 3], [1, -2])]
    return Job(["unused"], files={"solution.py": "def add(a, b):\n    return a + b\n"}, cases=cases)


def test_the_harness_runs_in_a_fork_of_the_runner_one_process_per_case(sb):
    r = sb.run_job(_harness_job())
    assert [c.results for c in r.cases] == [b"ok\n5", b"ok\n-1"], [c.reason for c in r.cases]
    code = "import os\ndef add(a, b):\n    return [os.getpid(), os.getppid()]\n"
    job = _harness_job()
    job.files["solution.py"] = code
    pids = [c.results for c in sb.run_job(job).cases]
    assert pids[0] != pids[1] and all(p.endswith(b", 1]") for p in pids)  # new processes; pid 1 runs them


def test_case_limits_and_a_case_that_never_ran():
    sb = Sandbox(SandboxLimits(timeout_s=1.0, max_output_bytes=10_000))
    cases = [Case(stdin=b"x"), Case(argv=_py(sb, "while True: pass")),
             Case(argv=_py(sb, "print('y' * 20000)")), Case(timeout_s=0.3, argv=_py(sb, "import time; time.sleep(5)"))]
    t0 = time.monotonic()
    r = sb.run_job(Job(_py(sb, "print(input())"), cases=cases))
    assert [c.status for c in r.cases] == ["ok", "timeout", "output_limit", "timeout"]
    assert r.cases[0].stdout == b"x\n" and "0.3 s" in r.cases[3].reason
    assert time.monotonic() - t0 < 1.0 + 0.3 + 5.0  # each case stopped at its own limit


def test_stderr_is_capped_per_case_not_per_run():
    sb = Sandbox(SandboxLimits(timeout_s=2.0, max_output_bytes=600_000))
    code = "import sys; sys.stderr.write('e' * 500_000); print('done')"
    r = sb.run_job(Job(_py(sb, code), cases=[Case(), Case(), Case()], stderr_tail=1000))
    assert [c.status for c in r.cases] == ["ok"] * 3
    assert all(c.stdout == b"done\n" and c.stderr == b"e" * 1000 for c in r.cases)


# -- memory: every route stays under the documented bound, measured from the host ----------------------

MEMORY_ROUTES = r'''
import ctypes, errno, fcntl, os, socket, sys, time
MB = 1 << 20
route, out = sys.argv[1], []
libc = ctypes.CDLL(None, use_errno=True)
def refused(fn):
    try:
        return "held" if fn() not in (None, -1) else f"refused {ctypes.get_errno()}"
    except OSError as e:
        return f"refused {e.errno}"
if route == "denied":
    out.append(refused(lambda: os.write(os.memfd_create("m"), b"x" * MB)))
    out.append(refused(lambda: libc.shmget(0, 256 * MB, 0o1000 | 0o600)))
    out.append(refused(lambda: libc.msgget(0, 0o1000 | 0o600)))
    out.append(refused(lambda: socket.socketpair()))
    out.append(refused(lambda: socket.socket(socket.AF_UNIX)))
elif route == "pipes":  # as many pipes as 3 processes may open, each filled and grown if allowed
    main = all(os.fork() != 0 for _ in range(2))
    n = total = grown = 0
    try:
        while True:
            r, w = os.pipe()
            try:
                fcntl.fcntl(w, 1031, MB)  # F_SETPIPE_SZ
                grown += 1
            except OSError:
                pass
            os.set_blocking(w, False)
            try:
                while True:
                    total += os.write(w, b"x" * 65536)
            except BlockingIOError:
                pass
            os.close(w)
            n += 1
    except OSError:
        pass
    out.append(f"{n} {total} {grown}")
    time.sleep(1.0)
    if not main:
        os._exit(0)
elif route == "files":
    n = 0
    try:
        while True:
            open(f"f{n}", "w").close()
            n += 1
    except OSError as e:
        out.append(f"{n} {e.errno}")
elif route == "processes":  # every process fills its address space, all at once
    kids = []
    for _ in range(8):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            chunks = []
            try:
                while True:
                    chunks.append(bytearray(8 * MB))
            except MemoryError:
                pass
            time.sleep(1.5)
            os._exit(0)
        kids.append(pid)
    time.sleep(1.0)
    out.append(str(len(kids) + 1))
print(" | ".join(out), flush=True)
'''


def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":")
        out[key] = int(value.split()[0]) << 10
    return out


def _run_measured(sb: Sandbox, argv: list[str]) -> tuple:
    """Run while sampling the host's available memory; the run's result and the largest drop."""
    import threading

    base = _meminfo()["MemAvailable"]
    low, stop = [base], threading.Event()

    def sample():
        while not stop.is_set():
            low[0] = min(low[0], _meminfo()["MemAvailable"])
            stop.wait(0.01)

    t = threading.Thread(target=sample)
    t.start()
    try:
        r = sb.run(argv)
    finally:
        stop.set()
        t.join()
    return r, base - low[0]


@pytest.mark.parametrize("cgroup", ["auto", "off"])
def test_memory_routes_stay_under_the_documented_bound(cgroup):
    limits = SandboxLimits(timeout_s=10.0, memory_mb=128, max_processes=4, tmpfs_mb=64, max_files=2048)
    sb = Sandbox(limits, cgroup=cgroup)
    bound = (limits.max_processes * limits.memory_mb + limits.tmpfs_mb) << 20  # 576 MiB
    results = {}
    for route in ("denied", "pipes", "files", "processes"):
        r, host_drop = _run_measured(sb, [sb.python, "-I", "-S", "-c", MEMORY_ROUTES, route])
        assert r.ok, (route, r.reason, r.stderr[-500:])
        results[route] = r.stdout.decode().strip()
        # From the host: noisy (the machine is shared), so only an escape of the red team's size
        # (gigabytes) can fail it; the cgroup's own peak below is exact.
        assert host_drop < 2 * bound, (route, host_drop >> 20)
        if sb.mechanisms["memory_cgroup"]:
            assert 0 < r.memory_peak_kb << 10 < bound, (route, r.memory_peak_kb)
    assert results["denied"] == " | ".join(["refused 1"] * 3 + ["refused 97"] * 2)  # EPERM, EAFNOSUPPORT
    pipes, filled, grown = map(int, results["pipes"].split())
    assert grown == 0 and filled <= pipes * 65536 <= 256 * 65536  # 64 KiB each, fds bound the count
    assert results["files"] == "2047 28"  # nr_inodes: ENOSPC after max_files (the root dir is one)
    assert int(results["processes"]) <= limits.max_processes


def test_memory_cgroup_bounds_the_whole_run():
    limits = SandboxLimits(timeout_s=10.0, memory_mb=256, max_processes=8, total_memory_mb=300)
    sb = Sandbox(limits)
    if not sb.mechanisms["memory_cgroup"]:
        pytest.skip("no memory cgroup on this machine (docs/sandbox.md: rlimits alone bound a run)")
    code = "\n".join([  # three processes of 200 MiB: each within memory_mb, together past 300
        "import os, time",
        "kids = []",
        "for _ in range(2):",
        "    pid = os.fork()",
        "    if pid == 0:",
        "        kids = []",
        "        break",
        "    kids.append(pid)",
        "x = bytearray(200 << 20)",
        "time.sleep(2)",
        "for pid in kids:",
        "    os.waitpid(pid, 0)",  # the main process ends well even if the killer chose a child
    ])
    r = sb.run(_py(sb, code))
    assert r.status == "memory_limit" and "memory cgroup" in r.reason, r.reason
    assert r.memory_peak_kb << 10 <= (300 << 20) + (1 << 20)


def test_cgroup_required_refuses_without_one_and_a_total_bound_warns(monkeypatch, fresh_probe):
    monkeypatch.setattr(sandbox_probe, "_cgroup_cache", {"auto": (None, "no memory controller (test)"),
                                                          "required": (None, "no memory controller (test)")})
    with pytest.raises(SandboxUnavailable, match=r"(?s)no memory cgroup to enforce cgroup=required.*Delegate"):
        Sandbox(cgroup="required")
    with pytest.warns(RuntimeWarning, match=r"total_memory_mb=300 is NOT enforced.*rlimits"):
        sb = Sandbox(SandboxLimits(total_memory_mb=300))
    assert sb.mechanisms["memory_cgroup"] is None and sb.run(_py(sb, "pass")).ok


# -- teardown: nothing outlives a run, and the caller returns at the limit ----------------------------


def test_nothing_outlives_the_run_and_the_caller_returns_at_the_limit():
    sb = Sandbox(SandboxLimits(timeout_s=1.0, tmpfs_mb=128))
    marker = uuid.uuid4().hex
    # Daemons that escape the session and keep stdout, stderr and the result channel open,
    # plus memory parked in the working directory and in pipes held by them.
    code = "\n".join([
        "import os, sys",
        "for i in range(4): open(f'ballast{i}', 'wb').write(os.urandom(15 << 20))",
        "for _ in range(2):",
        "    if os.fork() == 0:",
        "        os.setsid()",
        "        r, w = os.pipe(); os.write(w, b'x' * 65536)",
        f"        os.execv('/bin/sleep', ['sleep', '600', '{marker}'])",
        "print('parent done', flush=True)",
    ])
    shmem_before = _meminfo()["Shmem"]
    parent = Path(sb.mechanisms["memory_cgroup"]["parent"]) if sb.mechanisms["memory_cgroup"] else None
    cgroups_before = set(parent.glob("reinforge-*")) if parent else set()
    for result_channel in (False, True):
        t0 = time.monotonic()
        r = sb.run(_py(sb, code), result_channel=result_channel)
        assert r.ok and r.stdout == b"parent done\n", r.reason
        # The program ended at once and nothing held the caller (a margin for a loaded machine,
        # well below the 15 s backstop a held pipe used to cost).
        assert time.monotonic() - t0 < 1.0 + 5.0
    loop = "\n".join(["import os", "if os.fork() == 0:", "    os.setsid()",
                      f"    os.execv('/bin/sleep', ['sleep', '600', '{marker}'])", "while True: pass"])
    t0 = time.monotonic()
    r = sb.run(_py(sb, loop))
    assert r.status == "timeout" and time.monotonic() - t0 < 1.0 + 5.0
    assert not _processes_with(marker)
    assert _meminfo()["Shmem"] - shmem_before < 32 << 20  # the 60 MiB in /tmp are gone
    if parent:
        assert set(parent.glob("reinforge-*")) == cgroups_before  # each run's cgroup removed


def test_a_long_lived_program_talks_and_is_gone_after_kill(sb):
    marker = uuid.uuid4().hex
    code = ("import sys, os\nif os.fork() == 0:\n"
            f"    os.execv('/bin/sleep', ['sleep', '600', '{marker}'])\n"
            "for line in sys.stdin:\n    print(line.strip()[::-1], flush=True)")
    proc = sb.start(Job(_py(sb, code), timeout_s=float("inf")))
    proc.write(b"abc\n")
    assert proc.read_line(100, 30.0) == b"cba"
    proc.write(b"x" * 1000 + b"\n")
    with pytest.raises(ValueError, match="more than 100 bytes"):
        proc.read_line(100, 30.0)
    assert _processes_with(marker, wait_s=0)
    proc.kill()
    assert not proc.alive and not _processes_with(marker)


# -- side channels -----------------------------------------------------------------------------------


def test_no_project_path_inside_and_host_locks_are_not_blocked(sb):
    import fcntl

    code = "\n".join([
        "import fcntl, os, sys",
        "print(open('/proc/1/cmdline', 'rb').read() + open('/proc/self/mountinfo', 'rb').read())",
        "f = open(os.__file__, 'rb')",
        "try:",
        "    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB); print('LOCKED')",
        "except OSError as e:",
        "    print('refused', e.errno)",
        "import time; time.sleep(0.5)",
    ])
    import threading

    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", sb.run(_py(sb, code))))
    t.start()
    time.sleep(0.3)
    with open(os.__file__, "rb") as f:  # the host locks the same file while the program runs
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(f, fcntl.LOCK_UN)
    t.join()
    out = result["r"].stdout
    assert b"refused 1" in out and b"LOCKED" not in out
    assert str(ROOT).encode() not in out and sys.prefix.encode() not in out


def test_read_only_paths_under_tmp_stay_visible_inside(tmp_path):
    """A venv or a clone under /tmp (pytest's tmp_path is there) is bound in, not hidden by the
    sandbox's own /tmp: it appears under inside_path(), read-only."""
    from reinforge.sandbox import inside_path

    lib = tmp_path / "site"
    lib.mkdir()
    (lib / "probe_mod.py").write_text("VALUE = 41 + 1\n")
    assert str(lib).startswith("/tmp/") and inside_path(str(lib)) != str(lib)
    sb = Sandbox(SandboxLimits(timeout_s=5.0), extra_ro_paths=[str(lib)])
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import probe_mod; print(probe_mod.VALUE)\n"
            "try:\n    open(sys.argv[1] + '/new.txt', 'w')\nexcept OSError as e:\n    print(type(e).__name__)\n")
    res = sb.run([sb.python, "-I", "-c", code, inside_path(str(lib))])
    assert res.status == "ok", res.reason + res.stderr.decode()
    assert res.stdout.decode().split() == ["42", "OSError"]
    assert not (lib / "new.txt").exists()
