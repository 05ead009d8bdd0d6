"""Live progress: step, reward, held-out accuracy, tokens/s and ETA. A rich bar on a terminal;
one plain line per step otherwise (CI logs, files)."""

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
            from rich.progress import TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = RichProgress(
                TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("train", total=self.total, completed=self.start, info="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, step: int, *, metrics: dict | None = None, eval: dict | None = None) -> None:
        if not self.enabled:
            return
        parts = []
        if metrics:
            parts.append(f"reward {metrics['reward_mean']:.3f}")
            parts.append(f"{metrics['tokens_per_s']:.0f} tok/s")
        if eval:
            parts.append(f"held-out acc {eval['accuracy']:.3f}")
        info = "  ".join(parts)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        else:
            done = step - self.start
            elapsed = time.perf_counter() - self._t0
            eta = elapsed / done * (self.total - step) if done > 0 else float("nan")
            print(f"step {step}/{self.total}  {info}  elapsed {elapsed:.0f}s  eta {eta:.0f}s",
                  file=sys.stderr, flush=True)
