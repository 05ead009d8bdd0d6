"""Environments outside the trainer's process (``env.workers``; docs/agents.md, "Environment
workers").

With ``env.workers: N`` the agent loop's environments live in N worker processes, so a slow,
hanging or crashing environment neither blocks nor kills the trainer. :class:`EnvWorkerPool` is
the loop's ``make_env``: each call gives a :class:`RemoteEnv`, one episode whose environment is
made (``factory(task, **env.options)``) and reset in a worker, episodes spread round-robin over
the workers. A worker serves its calls one at a time (so a crash is charged to the one episode whose
call was running); the loop's ``env.tool_workers`` threads keep the workers busy, so up to N
episodes step at once.

Every call (open = make + reset, step, close) has a time limit (``env.step_timeout_s``). A call
that raises, passes the limit, or whose process dies is that episode's error: the episode ends
with ``truncation: env_error`` and the reason in ``env_error`` (the exception as raised in
process, or "timeout: ..." / "crash: ..."), and is counted in ``agent/env_errors``. A hung
worker is killed; a dead one is replaced at the next call. The other episodes that lived on it
are restored on the replacement by replaying their calls (reset with the same example, then the
same actions): an environment whose episode depends only on its seed and the actions (the text
adapters isolate their randomness per episode) comes back exactly; one whose replay differs is
that episode's error.

A worker is a fresh process from the ``forkserver`` (``spawn`` where there is none), never a fork
of the trainer with its threads. It imports what the trainer did to find the environment: the
config's ``imports``, the module that registered the environment, entry points, and the script
run as ``__main__`` (Python's rule: its training must be under ``if __name__ == "__main__":``).
The task goes to each worker once, pickled. Workers are no sandbox (same user, no limits): an environment that
runs model-written code keeps running it through ``reinforge.sandbox``, from the worker.
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import logging
import multiprocessing
import multiprocessing.util  # its exit hook (joining live children) registered before ours, so ours runs first
import os
import pickle
import signal
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from reinforge.agents.env import as_step_result
from reinforge.agents.registry import env_spec

__all__ = ["EnvWorkerError", "EnvWorkerPool", "RemoteEnv"]

logger = logging.getLogger("reinforge.agents")

START_TIMEOUT_S = 120.0  # a worker's start: its imports, the task unpickled, one environment made (the first)
EXIT_GRACE_S = 2.0       # a worker asked to exit closes its environments within this, or is killed


class EnvWorkerError(RuntimeError):
    """An environment call that failed in its worker. ``reason`` is what the episode records as
    its ``env_error``: the environment's exception ("ValueError: ..."), "timeout: ..." or
    "crash: ..."."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:500]


# -- the worker process -------------------------------------------------------------------------------

def _serve(conn, name: str, options: dict, task_bytes: bytes, imports: list[str], modules: list[str],
           sys_path: list[str], cwd: str, check: bool) -> None:
    """A worker's main: find the environment, then answer (op, episode id, argument) requests one
    at a time until told to exit or the trainer's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle: it stops the workers
    sys.path[:] = sys_path
    try:
        os.chdir(cwd)  # plugin files and environment options may name paths relative to the trainer's
        from reinforge.config.plugins import import_plugins

        import_plugins(imports)
        for module in modules:
            importlib.import_module(module)
        spec = env_spec(name)
        task = pickle.loads(task_bytes)
        if check:  # the first worker makes one environment, so bad options fail before any model loads
            env = spec.factory(task, **options)
            for attr in ("reset", "step"):
                if not callable(getattr(env, attr, None)):
                    raise TypeError(f"environment {name!r} has no {attr}() method (see reinforge.agents.Env)")
            getattr(env, "close", lambda: None)()
    except BaseException as err:  # noqa: BLE001 - told to the trainer, which raises it at build time
        conn.send(("error", _describe(err)))
        return
    conn.send(("ok", os.getpid()))
    envs: dict[int, Any] = {}
    while True:
        try:
            op, eid, arg = conn.recv()
        except (EOFError, OSError):
            break  # the trainer is gone
        if op == "exit":
            break
        try:
            if op == "open":
                _close_quietly(envs.pop(eid, None))  # a replay opens the episode again
                env = spec.factory(task, **options)
                try:
                    reply = ([dict(m) for m in env.reset(arg)], list(getattr(env, "tools", None) or []),
                             getattr(env, "max_turns", None))
                except Exception:
                    _close_quietly(env)
                    raise
                envs[eid] = env
            elif op == "step":
                reply = as_step_result(envs[eid].step(arg))
            else:  # close
                env, reply = envs.pop(eid, None), None
                if env is not None:
                    getattr(env, "close", lambda: None)()
            out = ("ok", reply)
        except Exception as err:  # noqa: BLE001 - the environment's failure is the episode's, not the worker's
            out = ("error", _describe(err))
        try:
            conn.send(out)
        except Exception as err:  # noqa: BLE001 - a reply that does not pickle (nothing was written)
            conn.send(("error", f"the environment's {op} result could not be sent to the trainer: {_describe(err)}"))
    for env in envs.values():
        _close_quietly(env)


def _close_quietly(env) -> None:
    try:
        getattr(env, "close", lambda: None)()
    except Exception:  # noqa: BLE001 - closing is best effort once the episode is over
        pass


# -- the trainer's side -------------------------------------------------------------------------------

class _Worker:
    """One worker process and its pipe; ``generation`` counts the processes it has had (an
    episode opened under an older one must be replayed). Callers hold ``lock`` around a call."""

    def __init__(self, index: int, ctx, args: tuple):
        self.index, self.ctx, self.args = index, ctx, args
        self.lock = threading.Lock()
        self.generation = 0
        self.proc = None
        self.conn = None

    def launch(self, check: bool = False) -> None:
        parent, child = self.ctx.Pipe()
        # Not a daemon: an environment may start processes of its own (daemons may not).
        proc = self.ctx.Process(target=_serve, args=(child, *self.args, check), daemon=False,
                                name=f"reinforge-env-worker-{self.index}")
        proc.start()
        child.close()
        self.proc, self.conn = proc, parent
        self.generation += 1

    def ready(self) -> None:
        """Wait for the launched process to say it found the environment (EnvWorkerError if not)."""
        if not self.conn.poll(START_TIMEOUT_S):
            self.stop()
            raise EnvWorkerError(f"crash: an environment worker did not start within {START_TIMEOUT_S:g} s")
        try:
            status, value = self.conn.recv()
        except (EOFError, OSError):
            code = self.stop()
            raise EnvWorkerError(f"crash: an environment worker exited (code {code}) while starting") from None
        if status != "ok":
            self.stop()
            raise EnvWorkerError(value)

    def ensure(self) -> None:
        if self.proc is None:
            self.launch()
            self.ready()

    def call(self, op: str, eid: int, arg, timeout: float | None):
        """One request and its reply (EnvWorkerError when the environment raised, the limit
        passed, or the process died; in the last two cases the process is gone)."""
        self.ensure()
        try:
            self.conn.send((op, eid, arg))
        except (BrokenPipeError, ConnectionError, EOFError):
            code = self.stop()
            raise EnvWorkerError(f"crash: the environment's worker process exited (code {code}) before {op}; "
                                 "it was replaced") from None
        except Exception as err:  # noqa: BLE001 - the request did not pickle: nothing was sent
            raise EnvWorkerError(f"the {op} request could not be sent to the environment's worker: "
                                 f"{_describe(err)}") from None
        if not self.conn.poll(timeout):
            self.stop()
            raise EnvWorkerError(f"timeout: the environment's {op} took longer than env.step_timeout_s={timeout:g} s; "
                                 "its worker process was killed and replaced")
        try:
            status, value = self.conn.recv()
        except (EOFError, OSError):
            code = self.stop()
            raise EnvWorkerError(f"crash: the environment's worker process exited (code {code}) during {op}; "
                                 "it was replaced") from None
        if status == "error":
            raise EnvWorkerError(value)
        return value

    def stop(self, grace: float = 0.0) -> int | None:
        """End the process (asked to exit within ``grace``, else killed); its exit code."""
        proc, conn = self.proc, self.conn
        self.proc = self.conn = None
        if proc is None:
            return None
        if grace:
            try:
                conn.send(("exit", None, None))
                proc.join(grace)
            except (OSError, ValueError):
                pass
        if proc.is_alive():
            proc.kill()
        proc.join(5.0)
        conn.close()
        return proc.exitcode


def _stop_all(workers: Sequence[_Worker]) -> None:
    for w in workers:
        w.stop(EXIT_GRACE_S)


def _start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _modules_of(name: str) -> list[str]:
    """The modules a worker imports so that ``name`` is registered there: the factory's and, for a
    text environment, its ``make``'s (a script's ``__main__`` cannot be imported by name)."""
    from reinforge.agents.adapters.base import text_env_spec

    mods = [getattr(env_spec(name).factory, "__module__", None)]
    text = text_env_spec(name)
    if text is not None:
        mods.append(getattr(text.make, "__module__", None))
    return [m for m in dict.fromkeys(mods) if m and m not in ("__main__", "__mp_main__")]


class EnvWorkerPool:
    """``workers`` processes hosting the episodes of environment ``name`` (a registered name, with
    ``options`` and the run's ``task``); calling the pool makes a :class:`RemoteEnv`. Each call to
    an environment has ``step_timeout_s`` (None: no limit). ``imports``: the config's plugins,
    imported in each worker. The workers start here (one makes an environment, so bad options
    fail now) and stop at :meth:`close` (or when the pool is collected, or at exit)."""

    concurrent = True  # the loop opens (makes and resets) these episodes concurrently: each waits on a process

    def __init__(self, name: str, options: dict, task, *, workers: int, step_timeout_s: float | None = None,
                 imports: Sequence[str] = ()):
        if workers < 1:
            raise ValueError(f"env.workers={workers}: an EnvWorkerPool needs at least one worker (0: in process)")
        try:
            task_bytes = pickle.dumps(task)
        except Exception as err:  # noqa: BLE001 - any pickling failure of the user's task
            raise ValueError(f"env.workers={workers}: the task ({type(task).__name__}) is sent to each worker process "
                             f"and could not be pickled ({_describe(err)}); make it picklable or set env.workers=0") from None
        self.name = name
        self.step_timeout_s = step_timeout_s
        ctx = multiprocessing.get_context(_start_method())
        if ctx.get_start_method() == "forkserver":  # the server imports this (and torch) once; workers fork from it
            ctx.set_forkserver_preload([__name__])
        args = (name, dict(options), task_bytes, list(imports), _modules_of(name), list(sys.path), os.getcwd())
        self._workers = [_Worker(i, ctx, args) for i in range(workers)]
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)
        # At exit, before multiprocessing joins its live children (these wait for requests forever).
        atexit.register(self._finalizer)
        self._ids = itertools.count()
        try:
            for i, w in enumerate(self._workers):
                w.launch(check=i == 0)
            for w in self._workers:
                w.ready()
        except EnvWorkerError as err:
            self.close()
            if err.reason.startswith("TypeError"):
                raise ValueError(f"env.options for environment {name!r}: {err.reason} (made in a worker process)") from None
            raise ValueError(f"env.workers={workers}: environment {name!r} could not be made in a worker process: "
                             f"{err.reason} (a worker imports `imports`, the module that registered the environment, "
                             "entry points, and the script run as __main__, whose training must be under "
                             "`if __name__ == '__main__':`; or set env.workers=0)") from None

    def __call__(self) -> RemoteEnv:
        eid = next(self._ids)
        return RemoteEnv(self, self._workers[eid % len(self._workers)], eid)

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids."""
        return [w.proc.pid for w in self._workers if w.proc is not None]

    def close(self) -> None:
        """Stop every worker (each closes its environments first, within a grace period)."""
        self._finalizer()
        atexit.unregister(self._finalizer)


class RemoteEnv:
    """One episode of an environment living in a worker process (the ``Env`` interface). A call
    that fails raises :class:`EnvWorkerError` (step), or marks the episode ``failed`` (reset: the
    loop ends it before the model writes anything). Its successful calls are kept, to replay the
    episode on a replacement process when its worker is lost to another episode's failure."""

    def __init__(self, pool: EnvWorkerPool, worker: _Worker, eid: int):
        self._pool, self._worker, self._eid = pool, worker, eid
        self._generation: int | None = None  # the worker process the episode lives in
        self._history: list[tuple[str, Any, Any]] = []
        self.tools: list[dict] = []
        self.max_turns: int | None = None
        self.failed: str | None = None

    def _call(self, op: str, arg):
        w, timeout = self._worker, self._pool.step_timeout_s
        with w.lock:
            w.ensure()  # a worker lost to an earlier failure is replaced now
            if self._history and self._generation != w.generation:
                self._replay(w, timeout)
            out = w.call(op, self._eid, arg, timeout)
            self._generation = w.generation
        return out

    def _replay(self, w: _Worker, timeout: float | None) -> None:
        try:
            for op, arg, seen in self._history:
                got = w.call(op, self._eid, arg, timeout)
                if _key(op, got) != seen:
                    raise EnvWorkerError(f"the replayed {op} gave another result than the first time (the environment "
                                         "depends on more than its seed and the actions)")
        except EnvWorkerError as err:
            raise EnvWorkerError(f"lost with its worker process (another episode's failure) and not restored: "
                                 f"{err.reason}") from None

    def reset(self, example) -> list[dict]:
        try:
            messages, tools, max_turns = self._call("open", example)
        except EnvWorkerError as err:
            self.failed = err.reason
            return [dict(m) for m in example.messages]
        self.tools, self.max_turns = tools, max_turns
        self._history = [("open", example, _key("open", (messages, tools, max_turns)))]
        return messages

    def step(self, message: dict):
        if self.failed is not None:
            raise EnvWorkerError(self.failed)
        result = self._call("step", message)
        self._history.append(("step", message, _key("step", result)))
        return result

    def close(self) -> None:
        """Close the environment in its worker (a failure is logged: the episode is recorded)."""
        w = self._worker
        with w.lock:
            alive = w.proc is not None and self._generation == w.generation and not self.failed
            if alive:
                try:
                    w.call("close", self._eid, None, self._pool.step_timeout_s)
                except EnvWorkerError as err:
                    logger.warning("closing an episode of environment %r failed: %s", self._pool.name, err.reason)
        self._history = []


def _key(op: str, value) -> Any:
    """What a replayed call must reproduce: the opening messages, or a step's observations, reward
    and end."""
    if op == "step":
        return (value.observations, value.reward, value.done, value.truncated)
    return value
