"""The sandbox's runner (pid 1, the process that times each case and collects its output) against
the cases it runs: a case cannot change the runner, sees only its own input (not the next
case's, nor what an earlier case read or printed), fails when it ends past its limit whatever
its exit status, and cannot take host-wide kernel resources (AIO contexts)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from reinforge.sandbox import Case, Job, Sandbox, SandboxLimits
from reinforge.sandbox import sandbox as sandbox_impl


@pytest.fixture(scope="module")
def sb():
    return Sandbox(SandboxLimits(timeout_s=2.0))


def _function_cases(args_list, entry="f"):
    return [Case(harness={"mode": "function", "entry_point": entry, "args": args, "kwargs": {}},
                 result_channel=True, capture_stdout=False) for args in args_list]


def _returned(case) -> object:
    tag, _, text = case.results.partition(b"\n")
    assert tag == b"ok", (case.status, case.reason, case.results[:300], case.stderr[-500:])
    return json.loads(text)


# Tries every call that names another process, on the runner (pid 1) and on the whole uid, and
# the same calls on itself; then reports the limits it inherited.
REACH_RUNNER = r'''
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
SYS = {"ioprio_set": 251, "sched_setattr": 314}

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return e.errno

def raw(nr, *args):
    if libc.syscall(nr, *args) != 0:
        raise OSError(ctypes.get_errno(), "")

def f(mark):
    inherited = {"rttime": resource.getrlimit(resource.RLIMIT_RTTIME)[0],
                 "nice": os.getpriority(os.PRIO_PROCESS, 0),
                 "policy": os.sched_getscheduler(0)}
    runner = {
        "prlimit": attempt(lambda: resource.prlimit(1, resource.RLIMIT_RTTIME, (mark, mark))),
        "renice": attempt(lambda: os.setpriority(os.PRIO_PROCESS, 1, 19)),
        "renice_uid": attempt(lambda: os.setpriority(os.PRIO_USER, 0, 19)),
        "renice_group": attempt(lambda: os.setpriority(os.PRIO_PGRP, 1, 19)),
        "affinity": attempt(lambda: os.sched_setaffinity(1, {0})),
        "sched_idle": attempt(lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))),
        "sched_param": attempt(lambda: os.sched_setparam(1, os.sched_param(0))),
        "sched_setattr": attempt(lambda: raw(SYS["sched_setattr"], 1, ctypes.create_string_buffer(56), 0)),
        "ioprio_uid": attempt(lambda: raw(SYS["ioprio_set"], 3, 0, (3 << 13))),
        "ioprio_pid": attempt(lambda: raw(SYS["ioprio_set"], 1, 1, (3 << 13))),
    }
    own = {
        "nice": attempt(lambda: os.nice(1)),
        "affinity": attempt(lambda: os.sched_setaffinity(0, os.sched_getaffinity(0))),
        "setrlimit": attempt(lambda: resource.setrlimit(resource.RLIMIT_RTTIME, (mark, mark))),
        "sched_idle": attempt(lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))),
    }
    return [runner, own, inherited]
'''


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="raw syscall numbers are x86_64's")
def test_a_case_cannot_change_the_runner_and_starts_from_fresh_limits(sb):
    job = Job(["unused"], files={"solution.py": REACH_RUNNER}, cases=_function_cases([[1111], [2222]]))
    first, second = (_returned(c) for c in sb.run_job(job).cases)
    for runner, own, inherited in (first, second):
        assert set(runner.values()) == {1}, runner  # EPERM on every call that names the runner
        assert set(own.values()) == {"ok"}, own  # a program may still tune itself
    # The second case started from the launcher's limits, priority and policy, not from what the
    # first case set on itself (nor could it have set them on the runner).
    assert second[2] == first[2] and second[2]["rttime"] != 1111 and second[2]["nice"] == 0
    assert second[2]["policy"] == os.SCHED_OTHER


def test_without_seccomp_a_changed_runner_fails_the_case_and_stops_the_run(monkeypatch):
    """Defence in depth: where seccomp is missing (best_effort), a case can reach the runner;
    the runner notices and fails it instead of passing its changed limits to the next case."""
    monkeypatch.setattr(sandbox_impl, "_probe_cache", {})
    monkeypatch.setattr(sandbox_impl, "_libseccomp_error", lambda: "libseccomp (test): missing")
    with pytest.warns(RuntimeWarning, match="WITHOUT seccomp"):
        weak = Sandbox(SandboxLimits(timeout_s=2.0), isolation="best_effort")
    assert weak.mechanisms == {**weak.mechanisms, "namespaces": True, "seccomp": False}
    code = ("import resource\n"
            "def f(x):\n"
            "    if x == 0:\n"
            "        resource.prlimit(1, resource.RLIMIT_RTTIME, (4321, 4321))\n"
            "    return resource.getrlimit(resource.RLIMIT_RTTIME)[0]\n")
    r = weak.run_job(Job(["unused"], files={"solution.py": code}, cases=_function_cases([[0], [1], [2]])))
    assert [c.status for c in r.cases] == ["runtime_error", "not_run", "not_run"], [c.reason for c in r.cases]
    assert "changed the sandbox's runner" in r.cases[0].reason
    assert "earlier case changed the sandbox's runner" in r.cases[1].reason


# Looks everywhere a forked case could find data the runner once held: the objects of its
# interpreter, every readable page of its own memory, and the limits it inherited.
FIND_OTHERS = r'''
import gc, os, re, resource, sys
PATTERN = re.compile(rb"ZQX[0-9a-f]{32}")

def found():
    seen = set()
    for o in gc.get_objects():
        try:
            text = repr(o).encode()
        except Exception:
            continue
        seen.update(PATTERN.findall(text))
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if "r" not in perms or hi - lo > (256 << 20):
                continue
            try:
                mem.seek(lo)
                seen.update(PATTERN.findall(mem.read(hi - lo)))
            except (OSError, ValueError, OverflowError):
                pass
    return sorted(m.decode() for m in seen)
'''


def test_a_case_sees_only_its_own_input_in_function_mode(sb):
    marks = [f"ZQX{uuid.uuid4().hex}" for _ in range(3)]
    code = FIND_OTHERS + "\ndef f(mark):\n    return found()\n"
    r = sb.run_job(Job(["unused"], files={"solution.py": code}, cases=_function_cases([[m] for m in marks])))
    for mark, case in zip(marks, r.cases):
        assert _returned(case) == [mark]  # its own input, nothing of the others'


def test_a_case_sees_only_its_own_input_and_not_earlier_output_in_stdio_mode(sb):
    marks = [f"ZQX{uuid.uuid4().hex}" for _ in range(3)]
    # Each case prints its input back (the runner reads that output) and what else it found.
    code = FIND_OTHERS + ("\nmine = sys.stdin.read().strip()\n"
                          "print(mine * 50)\nprint(' '.join(m for m in found() if m != mine) or '-')\n")
    cases = [Case(stdin=m.encode(), harness={"mode": "stdio"}) for m in marks]
    r = sb.run_job(Job(["unused"], files={"solution.py": code}, cases=cases))
    for mark, case in zip(marks, r.cases):
        assert case.status == "ok", (case.reason, case.stderr[-500:])
        lines = case.stdout.decode().splitlines()
        assert lines == [mark * 50, "-"], lines[-1]


def _processes() -> dict[int, tuple[int, bytes]]:
    """Host pid -> (parent pid, command line), for every process still there."""
    procs = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                procs[int(pid)] = (int(stat.rsplit(")", 1)[1].split()[1]),
                                   Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                continue
    return procs


def _new_runner(before: set[int], timeout_s: float = 10.0) -> int:
    """The runner (pid 1 inside) of the one launcher this process started since `before`, once
    its case is running. Other sandboxes of this process (a scoring pool's) are left alone."""
    marker = sandbox_impl._BOOTSTRAP.encode()[:40]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs = _processes()
        launchers = [p for p, (pp, cmd) in procs.items()
                     if pp == os.getpid() and marker in cmd and p not in before]
        for launcher in launchers:
            for runner, (pp, _) in procs.items():
                if pp == launcher and any(kp == runner for kp, _ in procs.values()):
                    return runner
        time.sleep(0.01)
    raise AssertionError("no new runner with a running case found")


def test_a_case_that_ends_after_its_limit_fails_whatever_its_exit_status():
    """The runner is held up (as a case that could starve it would) while the case sleeps past its
    limit and exits 0: the case is a timeout, not a pass."""
    sb = Sandbox(SandboxLimits(timeout_s=1.0))
    code = "import time\ndef f(x):\n    time.sleep(1.3)\n    return x\n"
    job = Job(["unused"], files={"solution.py": code}, cases=_function_cases([[7]]))
    out = {}
    before = set(_processes())
    worker = threading.Thread(target=lambda: out.setdefault("r", sb.run_job(job)))
    worker.start()
    runner = _new_runner(before)
    os.kill(runner, signal.SIGSTOP)  # from the host: a case itself cannot stop pid 1
    time.sleep(1.6)  # the case exits 0 while its runner is stopped, after its limit
    os.kill(runner, signal.SIGCONT)
    worker.join(30)
    r = out["r"]
    assert r.status == "timeout" and r.results.startswith(b"ok\n7"), (r.status, r.reason, r.results)
    assert r.wall_s > 1.0


def test_a_case_cannot_take_the_hosts_aio_contexts(sb):
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "ctx = ctypes.c_ulong(0)\n"
            "rc = libc.syscall(206, 65536, ctypes.byref(ctx))\n"  # io_setup on x86_64
            "print(rc, ctypes.get_errno())\n")
    if os.uname().machine != "x86_64":
        pytest.skip("io_setup's syscall number is x86_64's")
    r = sb.run([sb.python, "-I", "-S", "-c", code])
    assert r.ok and r.stdout.split() == [b"-1", b"1"]  # EPERM


def test_a_plain_directory_as_the_cgroup_is_refused_for_what_it_is(tmp_path, monkeypatch):
    from reinforge.sandbox import SandboxUnavailable, probe

    monkeypatch.setattr(sandbox_impl, "_probe_cache", {})
    monkeypatch.setattr(probe, "_cgroup_cache", {})
    with pytest.raises(SandboxUnavailable) as err:
        Sandbox(cgroup=str(tmp_path))
    msg = str(err.value)
    assert f"{tmp_path} is not a cgroup directory" in msg and "cgroup.procs" in msg
    assert "namespace" not in msg
    assert list(tmp_path.iterdir()) == []  # nothing was created in it
