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
from reinforge.sandbox import Job, Sandbox, SandboxLimits, SandboxUnavailable
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
    monkeypatch.setattr(sandbox_module, "_probe_cache", {})


def test_full_isolation_refuses_without_seccomp_and_names_the_fix(monkeypatch, fresh_probe):
    monkeypatch.setattr(sandbox_module, "_libseccomp_error",
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
        assert case.wall_s <= spec.timeout_s + 0.5, (head["attack"], case.wall_s)
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
