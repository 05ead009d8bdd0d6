"""Cost of the code sandbox, side by side with a plain (unsandboxed) subprocess.

    python benchmarks/bench_sandbox.py [--serial 40] [--parallel 200] [--workers N]

Measures, for a trivial program (`python -I -S -c pass`, the same interpreter both ways):
- serial: one execution at a time, wall time per execution (median and mean) and the sandbox's
  overhead over a plain subprocess;
- pool: executions per second with N workers in parallel (Sandbox.map vs. a thread pool of plain
  subprocesses);
and, end to end, the code verifier on a 6-test function problem: completions per second through
the sandbox vs. the same harness run as plain subprocesses (one per test case, as in the sandbox).

Prints a Markdown table and appends the raw numbers to benchmarks/results/sandbox.json.
"""

from __future__ import annotations

import argparse
import json
import marshal
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reinforge.rewards.code import SOLUTION_FILE, CodeVerifier  # noqa: E402
from reinforge.sandbox import _harness_text as _harness_source  # noqa: E402
from reinforge.sandbox import Job, Sandbox, SandboxLimits, default_workers  # noqa: E402
from reinforge.tasks.base import Example  # noqa: E402

PROBLEM = {"id": "sum_list", "entry_point": "sum_list",
           "tests": [{"args": [list(range(n))], "expected": n * (n - 1) // 2} for n in (0, 1, 5, 10, 100, 1000)]}
SOLUTION = "```python\ndef sum_list(xs):\n    return sum(xs)\n```"


def _timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _rate(fn, n: int, workers: int) -> float:
    with ThreadPoolExecutor(workers) as pool:
        t = time.perf_counter()
        list(pool.map(lambda _: fn(), range(n)))
        return n / (time.perf_counter() - t)


def _plain_harness(python: str, code: str) -> None:
    """The verifier's per-test harness without the sandbox: a temp dir, one process per test
    case, fd 3 as its result pipe."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        Path(d, SOLUTION_FILE).write_text(code)
        for test in PROBLEM["tests"]:
            r, w = os.pipe()
            # The harness reports on fd 3: move the pipe there first, then run the harness's text.
            shim = "import os, sys; os.dup2(int(sys.argv.pop(1)), 3); exec(sys.argv.pop(1))"
            proc = subprocess.Popen([python, "-I", "-S", "-B", "-c", shim, str(w), _harness_source(),
                                     "function"], cwd=d, stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(w,))
            os.close(w)
            proc.stdin.write(marshal.dumps({"entry_point": "sum_list", "args": test["args"], "kwargs": {}}))
            proc.stdin.close()
            out = b""
            while chunk := os.read(r, 65536):
                out += chunk
            os.close(r)
            proc.wait()
            assert out.startswith(b"ok\n"), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serial", type=int, default=40, help="executions timed one at a time")
    ap.add_argument("--parallel", type=int, default=200, help="executions for the pool's rate")
    ap.add_argument("--completions", type=int, default=64, help="completions for the verifier's rate")
    ap.add_argument("--workers", type=int, default=None, help="pool size (default: CPUs available)")
    args = ap.parse_args()
    workers = args.workers or default_workers()

    sb = Sandbox(SandboxLimits(timeout_s=10), workers=workers)
    argv = [sb.python, "-I", "-S", "-c", "pass"]

    def plain():
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)

    def boxed():
        assert sb.run(argv).ok

    plain(), boxed()  # warm caches
    t_plain = _timed(plain, args.serial)
    t_box = _timed(boxed, args.serial)
    rate_plain = _rate(plain, args.parallel, workers)
    t = time.perf_counter()
    results = sb.map([Job(argv) for _ in range(args.parallel)])
    rate_box = args.parallel / (time.perf_counter() - t)
    assert all(r.ok for r in results)

    verifier = CodeVerifier(timeout_s=5.0, workers=workers)
    ex = Example("bench", [], None, PROBLEM)
    # distinct programs (a comment differs), so the verifier's de-duplication does not help
    completions = [SOLUTION.replace("```python\n", f"```python\n# {i}\n") for i in range(args.completions)]
    t = time.perf_counter()
    scores = verifier.score_batch(completions, [ex] * len(completions))
    rate_verifier = len(completions) / (time.perf_counter() - t)
    assert all(s.score == 1.0 for s in scores)
    code = SOLUTION.split("\n", 1)[1].rsplit("```", 1)[0]
    rate_harness_plain = _rate(lambda: _plain_harness(sb.python, code), args.completions, workers)

    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    mean = lambda xs: 1000 * statistics.fmean(xs)  # noqa: E731
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpu": cpu_model(), "cpus_available": default_workers(), "kernel": platform.release(),
                    "python": platform.python_version(), "sandbox_python": sb.python,
                    "mechanisms": sb.mechanisms, "euid": os.geteuid()},
        "workers": workers,
        "serial_ms": {"plain_median": ms(t_plain), "plain_mean": mean(t_plain),
                      "sandbox_median": ms(t_box), "sandbox_mean": mean(t_box),
                      "overhead_median": ms(t_box) - ms(t_plain)},
        "pool_exec_per_s": {"plain": rate_plain, "sandbox": rate_box},
        "verifier_completions_per_s": {"plain_harness": rate_harness_plain, "sandbox": rate_verifier,
                                       "tests_per_completion": len(PROBLEM["tests"])},
        "args": vars(args),
    }
    out = ROOT / "benchmarks" / "results" / "sandbox.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(out.read_text()) if out.exists() else []
    history.append(record)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(history, indent=2))
    tmp.replace(out)

    print(f"machine: {record['machine']['cpu']}, {workers} workers, kernel {platform.release()}, "
          f"Python {platform.python_version()}, isolation {sb.mechanisms}\n")
    print("| trivial program (`python -I -S -c pass`) | plain subprocess | sandbox | ratio |")
    print("|---|---|---|---|")
    print(f"| serial, ms per execution (median; mean) | {ms(t_plain):.1f}; {mean(t_plain):.1f} | "
          f"{ms(t_box):.1f}; {mean(t_box):.1f} | {ms(t_box) / ms(t_plain):.1f}x |")
    print(f"| sandbox overhead per execution, serial (median) | | +{ms(t_box) - ms(t_plain):.1f} ms | |")
    print(f"| pool of {workers}, executions/s | {rate_plain:.1f} | {rate_box:.1f} | "
          f"{rate_box / rate_plain:.2f}x |")
    print(f"| code verifier, 6-test function problem, completions/s (pool of {workers}) | "
          f"{rate_harness_plain:.1f} | {rate_verifier:.1f} | {rate_verifier / rate_harness_plain:.2f}x |")
    print(f"\nraw numbers appended to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
