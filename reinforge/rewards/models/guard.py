"""The reward-hacking guard: the reward models' reward logged beside the verifiers' accuracy every
step, and a warning when the first rises while the second falls.

PURE ("Stop Summation: Min-Form Credit Assignment Is All Process Reward Model Needs for
Reasoning", Cheng et al., 2025, arXiv:2504.15275) report PRM-only training hacked within 200
steps: the PRM's reward kept climbing while accuracy collapsed (short, step-free or repetitive
answers the PRM scores highly). That divergence is what this watches for.

Over the last ``window`` steps, the change of each series is the mean of the window's second half
minus the mean of its first half. The guard fires when the reward-model reward rose by at least
``min_rise`` and the accuracy fell by at least ``min_fall``; it logs a warning when it starts
firing and sets the metric ``rm_hacking`` to 1 on every step it fires.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence

log = logging.getLogger("reinforge")


class RewardHackingGuard:
    """keys: the reward-model components (``reward/<key>`` metrics) whose mean is the RM reward.
    window: steps compared (first half vs second half; at least 4).
    min_rise, min_fall: the rise of the RM reward and the fall of the accuracy that count."""

    def __init__(self, keys: Sequence[str], *, window: int = 20, min_rise: float = 0.02, min_fall: float = 0.02) -> None:
        if not keys:
            raise ValueError("the reward-hacking guard needs at least one reward-model verifier to watch")
        if window < 4:
            raise ValueError(f"reward.hacking_guard.window must be >= 4 steps, got {window}")
        self.keys = list(keys)
        self.window, self.min_rise, self.min_fall = int(window), float(min_rise), float(min_fall)
        self.rm: deque[float] = deque(maxlen=self.window)
        self.acc: deque[float] = deque(maxlen=self.window)
        self.firing = False

    @staticmethod
    def _change(values: Iterable[float]) -> float:
        v = list(values)
        half = len(v) // 2
        first, second = v[: half], v[len(v) - half :]
        return sum(second) / len(second) - sum(first) / len(first)

    def observe(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Read one step's metrics (``reward/<key>`` and ``accuracy``); return the guard's metrics:
        ``rm_reward``, ``verifier_accuracy``, and once the window is full ``rm_reward_change``,
        ``accuracy_change`` and ``rm_hacking`` (1.0 while firing)."""
        rm = sum(float(metrics.get(f"reward/{k}", 0.0)) for k in self.keys) / len(self.keys)
        acc = float(metrics.get("accuracy", 0.0))
        self.rm.append(rm)
        self.acc.append(acc)
        out = {"rm_reward": rm, "verifier_accuracy": acc}
        if len(self.rm) < self.window:
            return out
        d_rm, d_acc = self._change(self.rm), self._change(self.acc)
        fire = d_rm >= self.min_rise and -d_acc >= self.min_fall
        if fire and not self.firing:
            log.warning(
                "step %d: possible reward hacking: the reward models' reward rose by %+.3f while verifier "
                "accuracy changed by %+.3f over the last %d steps (PURE, arXiv:2504.15275, saw PRM-only "
                "training hacked within 200 steps); add or raise an outcome verifier's weight, or use credit=min",
                step, d_rm, d_acc, self.window,
            )
        self.firing = fire
        out.update(rm_reward_change=d_rm, accuracy_change=d_acc, rm_hacking=float(fire))
        return out

    def replay(self, records: Iterable[dict]) -> None:
        """Refill the window from logged metric records (a resumed run's metrics.jsonl), so a
        resume sees the same history as an uninterrupted run."""
        for r in records:
            if "rm_reward" in r and "verifier_accuracy" in r:
                self.rm.append(float(r["rm_reward"]))
                self.acc.append(float(r["verifier_accuracy"]))
                self.firing = bool(r.get("rm_hacking", 0.0))
