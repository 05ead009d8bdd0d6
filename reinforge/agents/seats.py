"""Games of several seats, each seat its own trajectory: self-play and a frozen opponent
(docs/agents.md, "Games of two or more seats").

A *match* is an environment one game of which is played by several trajectories at once, one per
seat. The agent loop (loop.py) makes one match per sample, a row per seat, and decodes every
seat's turns in its batched generation: a seat whose turn it is decodes beside the other games'
seats. ``seats`` says who plays each seat: ``"policy"`` (the model being trained: its trajectory
trains) or ``"frozen"`` (the starting model's frozen copy: decoded, never trained). A match is

    seats: tuple[str, ...]           # "policy" or "frozen", per seat
    max_turns: int | None            # its own turn limit per seat, or None
    reset(example) -> None
    to_move() -> int | None          # the seat whose move it is; None once the game is over
    opening(seat) -> list[dict]      # the seat's first messages (its prompt), asked when it first moves
    step(seat, message) -> None      # the seat's move (its assistant message)
    observe(seat) -> StepResult      # asked when the turn is back with the seat (what it is shown), or
                                     # once the game is over (done, the seat's reward, info["success"])
    close() -> None                  # optional

:class:`SeatTable` holds one game for its seats' rows: it hands each seat its opening and, after
each of its moves, a ``Future`` of what it sees when the turn comes back (resolved by the other
seats' moves, on the loop's environment threads), so no thread blocks waiting for another seat.
A seat whose trajectory ends before the game does (a token or turn budget, an error) abandons
the game: every other seat's trajectory ends there too, unfinished (truncation "env", reward 0).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import replace

from reinforge.agents.env import StepResult
from reinforge.tasks.base import Example

__all__ = ["POLICY", "FROZEN", "SeatTable", "SeatView", "is_match", "seat_example"]

POLICY, FROZEN = "policy", "frozen"


def is_match(env) -> bool:
    """Whether ``env`` is a game of several seats (it declares ``seats``)."""
    return bool(getattr(env, "seats", None))


def seat_example(example: Example, seat: int) -> Example:
    """The example of one seat of ``example``'s game: its own id (``<id>/seat<k>``), so the samples
    of one episode seed and one seat form a group, and held-out rows name their seat."""
    return replace(example, id=f"{example.id}/seat{seat}", metadata={**(example.metadata or {}), "seat": seat})


class SeatTable:
    """One game of ``match`` shared by the rows of its seats (thread-safe: seats step from the
    loop's environment threads)."""

    def __init__(self, match):
        bad = [r for r in match.seats if r not in (POLICY, FROZEN)]
        if bad:
            raise TypeError(f"a match's seats are 'policy' or 'frozen', got {bad}")
        self.match = match
        self.seats: tuple[str, ...] = tuple(match.seats)
        self._lock = threading.Lock()
        self._pending: dict[int, Future] = {}  # seat -> what it waits for (its opening, or its next turn)
        self._started: set[int] = set()        # seats that were given their opening
        self._over = False
        self._open = len(self.seats)           # seat views not closed yet
        self._unseen: list[dict] = []

    def reset(self, example: Example) -> list:
        """Reset the game; per seat, its opening messages (it moves first) or a Future of
        ``(opening, final)`` (``final``: None, or the game's StepResult when it ended before the
        seat moved)."""
        self.match.reset(example)
        # What a seat that never moved is shown (the game ended first): its row has no turn to train.
        self._unseen = [dict(m) for m in example.messages]
        out = []
        with self._lock:
            first = self.match.to_move()
            for seat in range(len(self.seats)):
                if seat == first:
                    self._started.add(seat)
                    out.append(self.match.opening(seat))
                else:
                    out.append(self._pending.setdefault(seat, Future()))
        return out

    def step(self, seat: int, message: dict) -> Future:
        """Play ``seat``'s move; a Future of what it sees when the turn comes back (or the end)."""
        with self._lock:
            if self._over:  # an abandoned game: nothing more to play
                fut: Future = Future()
                fut.set_result(StepResult([], 0.0, True, {"ended": "the game was abandoned"}, truncated=True))
                return fut
            fut = self._pending[seat] = Future()
            try:
                self.match.step(seat, message)
                self._deliver()
            except BaseException as err:
                self._pending.pop(seat, None)
                self._end_all(exception=RuntimeError(f"the game failed on seat {seat}'s move: "
                                                     f"{type(err).__name__}: {err}"))
                raise
        return fut

    def abandon(self, seat: int, why: str) -> None:
        """``seat``'s trajectory ended before the game did: the other seats' trajectories end too."""
        with self._lock:
            self._pending.pop(seat, None)
            self._end_all(result=StepResult([], 0.0, True, {"ended": f"seat {seat} stopped: {why}"}, truncated=True))

    def close(self) -> None:
        """A seat's view is closed; the game is closed with the last one."""
        with self._lock:
            self._open -= 1
            last = self._open == 0
        if last:
            close = getattr(self.match, "close", None)
            if callable(close):
                close()

    # -- under the lock ------------------------------------------------------------------------
    def _deliver(self) -> None:
        """After a move: the seat to move gets its opening or observation; at the end, every seat
        waiting gets its result."""
        nxt = self.match.to_move()
        if nxt is None:
            self._over = True
            for seat in sorted(self._pending):
                fut = self._pending.pop(seat)
                final = self.match.observe(seat)
                fut.set_result(final if seat in self._started else (self._unseen, final))
            return
        fut = self._pending.pop(nxt, None)
        if fut is None:  # pragma: no cover - a match handing the turn to a seat that is still deciding
            raise RuntimeError(f"the game gave the turn to seat {nxt}, which has not finished its move")
        if nxt in self._started:
            fut.set_result(self.match.observe(nxt))
        else:
            self._started.add(nxt)
            fut.set_result((self.match.opening(nxt), None))

    def _end_all(self, *, result: StepResult | None = None, exception: BaseException | None = None) -> None:
        self._over = True
        for seat in sorted(self._pending):
            fut = self._pending.pop(seat)
            if exception is not None:
                fut.set_exception(exception)
            elif seat in self._started:
                fut.set_result(result)
            else:
                fut.set_result((self._unseen, result))


class SeatView:
    """One seat of a :class:`SeatTable`, as the agent loop's row sees its environment."""

    tools: list[dict] = []

    def __init__(self, table: SeatTable, seat: int):
        self.table, self.seat = table, seat
        self.role = table.seats[seat]
        self.max_turns = getattr(table.match, "max_turns", None)

    def step(self, message: dict) -> Future:
        return self.table.step(self.seat, message)

    def abandon(self, why: str) -> None:
        self.table.abandon(self.seat, why)

    def close(self) -> None:
        self.table.close()
