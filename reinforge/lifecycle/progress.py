"""Live progress: step, reward, held-out accuracy, tokens/s and ETA. A rich bar on a terminal;
one plain line per step otherwise (CI logs, files).

The ETA is shown only once a step of this session has finished: before that there is nothing to
estimate it from. It counts training steps and held-out evaluations apart (an evaluation of 200
prompts can take longer than several steps): seconds per step so far times the steps left, plus
seconds per evaluation so far times the evaluations left. After the first step one line says
when the run should end. A long evaluation reports its own progress (:class:`EvalProgress`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """``evals_left``: a function of the last finished step giving the number of held-out
    evaluations still to come (None: the ETA counts steps only)."""

    def __init__(self, *, total: int, start: int = 0, enabled: bool = True,
                 evals_left: Callable[[int], int] | None = None):
        self.total, self.start, self.enabled = total, start, enabled
        self.evals_left = evals_left
        self._tty = sys.stderr.isatty()
        self._bar = None
        self._t0 = time.perf_counter()
        self._eval_time = 0.0
        self._evals = 0
        self._announced = False

    def __enter__(self) -> "Progress":
        if self.enabled and self._tty:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("train", total=self.total, completed=self.start, info="", eta="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def evaluated(self, seconds: float) -> None:
        """A held-out evaluation took ``seconds`` (kept apart from the steps' time)."""
        self._eval_time += seconds
        self._evals += 1

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def update(self, step: int, *, metrics: dict | None = None, eval: dict | None = None) -> None:
        if not self.enabled:
            return
        parts = []
        if metrics:
            if "reward_mean" in metrics:
                parts.append(f"reward {metrics['reward_mean']:.3f}")
            if "loss" in metrics:  # (SFT steps have a loss and no reward)
                parts.append(f"loss {metrics['loss']:.3f}")
            parts.append(f"{metrics['tokens_per_s']:.0f} tok/s")
        if eval:
            parts.append(f"held-out acc {eval['accuracy']:.3f}")
        info = "  ".join(parts)
        elapsed = time.perf_counter() - self._t0
        eta = self.eta(step, elapsed)
        eta_text = "" if eta is None else f"eta {_duration(eta)}"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info, eta=eta_text)
        else:
            line = f"step {step}/{self.total}  {info}  elapsed {elapsed:.0f}s"
            print(f"{line}  {eta_text}" if eta_text else line, file=sys.stderr, flush=True)
        if eta is not None and not self._announced and step < self.total:
            self._announced = True
            done = step - self.start
            per_step = (elapsed - self._eval_time) / done
            self.say(f"reinforge: {per_step:.1f} s a step; the run should end in about {_duration(eta)} "
                     f"(at {time.strftime('%H:%M', time.localtime(time.time() + eta))}, "
                     f"{self.total - step} steps to go{self._evals_phrase(step)})")

    def _evals_phrase(self, step: int) -> str:
        if self.evals_left is None:
            return ""
        n = self.evals_left(step)
        return f" and {n} held-out evaluation{'s' if n != 1 else ''}" if n else ""

    def eta(self, step: int, elapsed: float) -> float | None:
        """Seconds left at this session's pace, or None before its first step has finished."""
        done = step - self.start
        if done <= 0:
            return None
        steps_time = max(elapsed - self._eval_time, 0.0)
        left = steps_time / done * (self.total - step)
        if self.evals_left is not None and self._evals:
            left += self._eval_time / self._evals * self.evals_left(step)
        return left


class EvalProgress:
    """Progress of one held-out evaluation, one line every ``every_s`` seconds at most (a callback
    of ``greedy_heldout_eval``): prompts done, elapsed and the time left."""

    def __init__(self, say: Callable[[str], None], label: str, *, every_s: float = 10.0):
        self.say, self.label, self.every_s = say, label, every_s
        self._t0 = time.perf_counter()
        self._last = self._t0

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if done >= total or now - self._last < self.every_s:
            return
        self._last = now
        elapsed = now - self._t0
        left = elapsed / max(done, 1) * (total - done)
        self.say(f"reinforge: {self.label}: {done}/{total} prompts, {_duration(elapsed)}, about "
                 f"{_duration(left)} left")
