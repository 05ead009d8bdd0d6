"""A time limit for a call, in any thread (RewardFunction bounds each verifier call with it).

- main thread: SIGALRM via setitimer (nested limits kept on a stack). CPython checks signals even
  inside long C integer arithmetic, so this stops e.g. sympy expanding 9^(9^(9^9)).
- other threads: a timer thread raises an exception inside the running thread
  (PyThreadState_SetAsyncExc). It takes effect between bytecodes, so it stops runaway Python
  work (sympy simplification loops) but not one long C call, which also holds the GIL and so
  stalls every thread of the process (the timer's included): best effort only. Work that can
  reach such a call on model output runs in a process that is stopped at its limit instead
  (math-verify: rewards/isolated.py's IsolatedMath).
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class VerifierTimeout(Exception):
    """A verifier ran past its time limit."""


class _Expired(BaseException):
    """Raised inside the timed call; a BaseException so library `except Exception` blocks let it
    pass. Each call gets a subclass of its own, so nested limits catch only their own expiry."""


def call_with_deadline(fn: Callable[[], T], seconds: float | None) -> T:
    """fn(), or VerifierTimeout after `seconds` (None or <= 0: no limit)."""
    if seconds is None or seconds <= 0:
        return fn()
    expired = type("_ExpiredHere", (_Expired,), {})
    try:
        if _can_use_signal():
            return _with_signal(fn, seconds, expired)
        return _with_async_exc(fn, seconds, expired)
    except expired:
        raise VerifierTimeout(f"no result within {seconds:g} s") from None


# -- main thread: SIGALRM ----------------------------------------------------------------------

_stack: list[tuple[float, type[_Expired]]] = []  # (monotonic deadline, its exception), outermost first
_saved_handler = None


def _can_use_signal() -> bool:
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return False
    if _stack:
        return True
    # Leave SIGALRM alone if someone else has a timer running.
    return signal.getitimer(signal.ITIMER_REAL)[0] == 0


def _arm() -> None:
    if _stack:
        delay = min(d for d, _ in _stack) - time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-4))
    else:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _on_alarm(signum, frame) -> None:
    now = time.monotonic()
    for deadline, exc in _stack:  # outermost first: an expired outer limit wins
        if deadline <= now:
            raise exc()
    _arm()


def _with_signal(fn: Callable[[], T], seconds: float, expired: type[_Expired]) -> T:
    global _saved_handler
    if not _stack:
        _saved_handler = signal.signal(signal.SIGALRM, _on_alarm)
    entry = (time.monotonic() + seconds, expired)
    _stack.append(entry)
    try:
        _arm()
        return fn()
    finally:
        _stack.remove(entry)
        _arm()
        if not _stack:
            signal.signal(signal.SIGALRM, _saved_handler)


# -- other threads: asynchronous exception -----------------------------------------------------


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


def _with_async_exc(fn: Callable[[], T], seconds: float, expired: type[_Expired]) -> T:
    thread_id = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}

    def fire() -> None:
        with lock:
            if not state["done"]:
                state["fired"] = True
                _set_async_exc(thread_id, expired)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    try:
        timer.start()
        return fn()
    finally:
        with lock:
            state["done"] = True
            timer.cancel()
            if state["fired"]:
                _set_async_exc(thread_id, None)  # drop it if not delivered yet
