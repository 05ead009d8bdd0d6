"""Registries of algorithm components and the declaration of what each one needs.

A component (an advantage estimator, a policy loss) is a function registered under the name the
config uses, together with a :class:`Needs`: the inputs the run must provide for it that cost
something to produce (a forward pass, a model, a generation). The trainer and the memory guard
read these declarations (through ``needs_of``) instead of knowing which component needs what, so
a new component is one function plus one decorator.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator

__all__ = ["Needs", "Registry"]


@dataclass(frozen=True)
class Needs:
    """What a component (or a whole algorithm) needs besides the rollout and its scalar rewards.

    old_logprobs:    the policy's log-probs of the sampled tokens at rollout time, from a separate
                     no-grad forward pass (without it the first update's own forward stands in).
    reference:       log-probs under a frozen reference model (a KL term).
    critic:          a value model: per-token values, trained on the returns the estimator gives.
    greedy_baseline: one greedy completion per prompt, scored like the samples (ReMax).
    token_rewards:   the estimator reads per-token rewards [N, T] (process or step rewards from the
                     reward side); sequence-level estimators do not, and refuse them.
    correctness:     per-sample 0/1 correctness (pass@k), besides the reward.

    ``a | b`` is everything either needs.
    """

    old_logprobs: bool = False
    reference: bool = False
    critic: bool = False
    greedy_baseline: bool = False
    token_rewards: bool = False
    correctness: bool = False

    def __or__(self, other: "Needs") -> "Needs":
        if not isinstance(other, Needs):
            return NotImplemented
        return Needs(**{f.name: getattr(self, f.name) or getattr(other, f.name) for f in dataclasses.fields(self)})

    def names(self) -> list[str]:
        """The needs that are set, by field name."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name)]


@dataclass(frozen=True)
class _Entry:
    fn: Callable
    needs: Needs


class Registry:
    """Name -> function, for one kind of component, with each function's :class:`Needs`.

    Reads like a dict of functions (``name in reg``, ``reg[name]``, ``list(reg)``). ``register``
    is the decorator that adds one; the config accepts every registered name, and ``lookup`` raises
    an error that lists them.
    """

    def __init__(self, kind: str, config_key: str):
        self.kind, self.config_key = kind, config_key
        self._entries: dict[str, _Entry] = {}

    def register(self, name: str, *, needs: Needs = Needs()) -> Callable[[Callable], Callable]:
        """Decorator: register the function under ``name`` (the config value) with its needs."""
        if not isinstance(needs, Needs):
            raise TypeError(f"needs= must be a Needs, got {type(needs).__name__}")

        def add(fn: Callable) -> Callable:
            if name in self._entries and self._entries[name].fn is not fn:
                taken = self._entries[name].fn.__qualname__
                raise ValueError(f"{self.kind} {name!r} is already registered (by {taken})")
            self._entries[name] = _Entry(fn, needs)
            return fn

        return add

    def unregister(self, name: str) -> None:
        """Remove a registered name (tests that register a temporary component clean up with it)."""
        self._entries.pop(name, None)

    def check(self, name: str) -> str:
        """``name`` if registered, else a ValueError naming the accepted values."""
        if name not in self._entries:
            raise ValueError(
                f"unknown {self.kind} {name!r}; accepted: {', '.join(self._entries)} "
                f"(set {self.config_key} to one of them, or register a new one)"
            )
        return name

    def lookup(self, name: str) -> Callable:
        """The function registered as ``name`` (a ValueError naming the accepted values if none)."""
        return self._entries[self.check(name)].fn

    def needs(self, name: str) -> Needs:
        return self._entries[self.check(name)].needs

    def __getitem__(self, name: str) -> Callable:
        return self._entries[name].fn

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind}: {', '.join(self._entries)})"
