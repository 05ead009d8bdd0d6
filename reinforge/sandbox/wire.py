"""The parent's side of a run's pipes: feed the launcher, read its status and its framed case
reports under caps and a deadline, kill it when either is passed, and turn what came back into
ExecResults."""

from __future__ import annotations

import marshal
import os
import selectors
import signal
import time

from .limits import _BACKSTOP_S, _DRAIN_S, _FRAME_OVERHEAD, _STATUS_CAP, ExecResult, SandboxLimits


def _frame_cap(case: dict) -> int:
    caps = case["caps"]
    stderr = caps["stderr"] if case["stderr_keep"] is None else min(caps["stderr"], case["stderr_keep"])
    return _FRAME_OVERHEAD + stderr + caps.get("stdout", 0) + caps.get("results", 0) + 32


def _remove_cgroup(path: str) -> None:
    """The launcher removes the run's cgroup; if it was killed first, this does."""
    if os.path.isdir(path):
        for _ in range(50):
            try:
                os.rmdir(path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)


def _communicate(proc, stdin: bytes, streams: dict[str, int], caps: dict[str, int], deadline: float):
    """Feed stdin and read every stream to EOF, keeping at most caps[name] bytes of each; kill the
    launcher (and with it the sandbox: parent-death signal) on overflow or past the deadline.
    Once the launcher has written its status and closed it, the other streams get _DRAIN_S to
    end: nothing waits on a descriptor something else might be holding open."""
    sel = selectors.DefaultSelector()
    bufs = {name: bytearray() for name in streams}
    names = {fd: name for name, fd in streams.items()}
    for fd in streams.values():
        sel.register(fd, selectors.EVENT_READ)
    stdin_fd = proc.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_WRITE)
    view, sent = memoryview(stdin), 0
    overflow = backstop = None
    killed = False
    open_reads = len(streams)
    while open_reads:
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            if killed:  # what was left to drain after the kill or the report did not end: stop
                break
            backstop = "status" in names.values()  # the launcher itself never reported
            _kill_launcher(proc)
            killed, deadline = True, time.monotonic() + _DRAIN_S
            continue
        for key, _ in sel.select(timeout):
            fd = key.fd
            if fd == stdin_fd:
                try:
                    sent += os.write(fd, view[sent : sent + 65536])
                except (BrokenPipeError, OSError):
                    sent = len(view)
                if sent >= len(view):
                    sel.unregister(fd)
                    proc.stdin.close()
                continue
            chunk = os.read(fd, 65536)
            name = names[fd]
            if not chunk:
                sel.unregister(fd)
                del names[fd]
                open_reads -= 1
                if name == "status":  # the launcher is done: the rest must end promptly
                    deadline = min(deadline, time.monotonic() + _DRAIN_S)
                continue
            buf, cap = bufs[name], caps[name]
            if len(buf) + len(chunk) > cap:
                buf += chunk[: cap - len(buf)]
                if overflow is None:
                    overflow = name
                    _kill_launcher(proc)
                    killed, deadline = True, min(deadline, time.monotonic() + _DRAIN_S)
            else:
                buf += chunk
    sel.close()
    if not proc.stdin.closed:
        proc.stdin.close()
    if not killed and proc.poll() is None:
        _kill_launcher(proc)
    return {k: bytes(v) for k, v in bufs.items()}, overflow, backstop


def _kill_launcher(proc) -> None:
    try:
        proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass


def _parse_reports(data: bytes, cases: list[dict]) -> dict[int, dict]:
    """The runner's frames (a decimal length, a newline, marshal data naming the length of each
    output stream, then those streams' bytes), each checked against the most its case may send
    before it is decoded."""
    out: dict[int, dict] = {}
    pos = 0
    while pos < len(data) and len(out) < len(cases):
        nl = data.find(b"\n", pos, pos + 24)
        if nl < 0:
            break
        try:
            n = int(data[pos:nl])
        except ValueError:
            break
        body = data[nl + 1 : nl + 1 + n]
        if n < 0 or len(body) < n or n > _frame_cap(cases[len(out)]):
            break
        try:
            frame = marshal.loads(body)
        except (EOFError, ValueError, TypeError):
            break
        if not isinstance(frame, dict) or frame.get("i") != len(out):
            break
        pos = nl + 1 + n
        lens = frame.get("lens", {})
        caps = cases[len(out)]["caps"]
        if not isinstance(lens, dict) or any(
                name not in caps or not isinstance(k, int) or not 0 <= k <= caps[name]
                for name, k in lens.items()):
            break
        if pos + sum(lens.values()) > len(data):
            break
        for name, k in lens.items():
            frame[name] = data[pos : pos + k]
            pos += k
        out[frame["i"]] = frame
    return out


def _results(out: dict, overflow, backstop, limits: SandboxLimits, cases: list[dict],
             elapsed: float) -> ExecResult:
    try:
        st = marshal.loads(out["status"]) if out["status"] else {}
    except (EOFError, ValueError, TypeError):
        st = {}
    if not isinstance(st, dict):
        st = {}
    peak_kb = int(st.get("memory_peak_bytes", 0)) >> 10
    launcher_err = out["stderr"][-500:].decode(errors="replace")
    run_error = None
    if overflow:
        run_error = ("output_limit", f"output limit: the runner's {overflow} stream went past "
                     f"{_frame_cap(cases[0]) if overflow == 'report' else _STATUS_CAP} bytes")
    elif backstop:
        run_error = ("timeout", f"timeout: the launcher did not finish within "
                     f"{sum(c['timeout_s'] for c in cases) + 1 + _BACKSTOP_S:g} s")
    elif "setup_error" in st:
        run_error = ("setup_error", f"sandbox setup failed: {st['setup_error']}")
    elif not st:
        run_error = ("setup_error", "sandbox setup failed: the launcher reported no status; "
                     f"its stderr: {launcher_err}")
    elif st.get("timed_out"):
        run_error = ("timeout", f"timeout: the run went past its limit of "
                     f"{sum(c['timeout_s'] for c in cases) + 1:g} s")
    reports = _parse_reports(out["report"], cases)
    results = []
    for i, case in enumerate(cases):
        rep = reports.get(i)
        if rep is not None:
            results.append(_case_result(rep, limits, case))
            continue
        if run_error is None:
            run_error = ("setup_error", "the sandbox's runner ended without reporting "
                         f"(exit {st.get('runner_exit')}); launcher stderr: {launcher_err}")
        status, reason = run_error
        if i > len(reports):  # after the case the run stopped in: never started
            status, reason = "not_run", f"not run: {reason}"
        results.append(ExecResult(status, reason, wall_s=elapsed if i == 0 else 0.0))
    first = results[0]
    return ExecResult(first.status, first.reason, first.exit_code, first.stdout, first.stderr,
                      first.results, first.wall_s, first.cpu_s, first.maxrss_kb, peak_kb,
                      results if len(cases) > 1 else [])


def _case_result(rep: dict, limits: SandboxLimits, case: dict) -> ExecResult:
    common = dict(stdout=bytes(rep.get("stdout", b"")), stderr=bytes(rep.get("stderr", b"")),
                  results=bytes(rep.get("results", b"")), wall_s=float(rep.get("wall_s", 0.0)),
                  cpu_s=float(rep.get("cpu_s", 0.0)), maxrss_kb=int(rep.get("maxrss_kb", 0)),
                  exit_code=rep.get("exit_code"))
    status = rep.get("status")
    if status == "setup_error":
        return ExecResult("setup_error", f"sandbox setup failed: {rep.get('reason', '')}", **common)
    if status == "output_limit":
        name = rep.get("overflow") or "output"
        return ExecResult("output_limit", f"output limit: more than {case['caps'].get(name, 0)} "
                          f"bytes on {name}", **common)
    if status == "tampered":
        return ExecResult("runtime_error", "runtime error: the program changed the sandbox's "
                          "runner (its limits, priority or scheduling)", **common)
    if status == "not_run":
        return ExecResult("not_run", str(rep.get("reason", "not run")), **common)
    if status == "timeout":
        return ExecResult("timeout", f"timeout: still running after {case['timeout_s']:g} s "
                          "(wall clock)", **common)
    code = common["exit_code"]
    if rep.get("oom"):  # the OOM killer took some process of the case: whichever it was, the
        # case ran out of its run's memory
        return ExecResult("memory_limit", f"memory limit: the run's {limits.memory_bound_mb} MiB "
                          "(memory cgroup)", **common)
    if code == 0:
        return ExecResult("ok", **common)
    tail = common["stderr"][-4000:].decode(errors="replace")
    rl = limits.rlimits()
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and rl["cpu_s"] is not None
                                   and common["cpu_s"] >= rl["cpu_s"]):
        return ExecResult("timeout", f"timeout: CPU time limit of {rl['cpu_s']} s", **common)
    if "MemoryError" in tail or "Cannot allocate memory" in tail:
        return ExecResult("memory_limit", f"memory limit: {limits.memory_mb} MiB of address space",
                          **common)
    # Python ignores SIGXFSZ, so an oversized write fails with EFBIG instead of killing it.
    if code == -signal.SIGXFSZ or "File too large" in tail:
        return ExecResult("output_limit", f"file size limit: {limits.max_file_mb} MiB", **common)
    if "No space left on device" in tail:
        return ExecResult("output_limit", f"working directory full: {limits.tmpfs_mb} MiB or "
                          f"{limits.max_files} files", **common)
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return ExecResult("killed", f"killed by signal {name}", **common)
    last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
    return ExecResult("runtime_error", f"runtime error (exit code {code}): {last[:300]}", **common)
