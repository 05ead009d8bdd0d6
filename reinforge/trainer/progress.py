"""Live progress: step, reward, held-out accuracy, tokens/s and ETA. A rich bar on a terminal;
one plain line per step otherwise (CI logs, files). The ETA is shown only once a step of this
session has finished: before that there is nothing to estimate it from."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, *, total: int, start: int = 0, enabled: bool = True):
        self.total, self.start, self.enabled = total, start, enabled
        self._tty = sys.stderr.isatty()
        self._bar = None
        self._t0 = time.perf_counter()

    def __enter__(self) -> "Progress":
        if self.enabled and self._tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
            from rich.progress import TextColumn, TimeElapsedColumn

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
        eta_text = "" if eta is None else f"eta {eta:.0f}s"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info, eta=eta_text)
        else:
            line = f"step {step}/{self.total}  {info}  elapsed {elapsed:.0f}s"
            print(f"{line}  {eta_text}" if eta_text else line, file=sys.stderr, flush=True)

    def eta(self, step: int, elapsed: float) -> float | None:
        """Seconds left at this session's pace, or None before its first step has finished."""
        done = step - self.start
        return elapsed / done * (self.total - step) if done > 0 else None
