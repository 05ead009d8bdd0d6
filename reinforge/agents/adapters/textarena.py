"""TextArena games (``pip install reinforge[textarena]``; TextArena: "a collection of competitive
text-based games for language model evaluation and reinforcement learning",
https://github.com/LeonGuertler/TextArena) as ``env.name: textarena``:

    task: {source: env}
    env:  {name: textarena, options: {env_id: GuessTheNumber-v0}}          # plus the game's kwargs
    env:  {name: textarena, options: {env_id: TicTacToe-v0, opponent: "my_bots:first_move"}}

TextArena's loop is ``make(env_id)``, ``reset(num_players, seed)``, then per turn
``get_observation() -> (player, text)`` and ``step(action) -> (done, info)``; ``close()`` hands back
each player's reward and the reason the game ended. Its observation is the player's whole history
as one growing string, so the family is registered with ``observation="replace"`` (the model is
shown what was added since its last turn). ``State`` seeds the global ``random`` in reset and the
games draw from it: the adapter core (adapters/base.py) runs every call inside the episode's own
streams, so the trainer's RNG state is untouched and an episode replays from its seed.

Rewards and success: TextArena rewards only at the end (each player's, from ``close()``); every
earlier step's reward is 0. A one-player game gives 1 for solving it and partial credit otherwise
(also when it ends on an invalid move), so success is reaching 1; in a game of two or more players
success is a win (a reward above every other player's; a draw is not one). The game's own turn
limit ends it as the game's rules say (terminated, with the game's reward), not as a truncation.

Games of two or more players, by ``opponent``:

- a fixed policy ``opponent(observation) -> action text`` named as ``module:function`` or
  ``file.py:function``: the model plays seat ``player`` and the policy every other seat, inside the
  episode's isolated streams (one that draws from ``random`` replays with the episode);
- ``self_play``: the model plays every seat, each seat its own trajectory (its own conversation,
  the game as that player sees it, its own reward and verdict), and every seat's turns train;
- ``frozen``: the model plays seat ``player`` against a frozen copy of the starting model at the
  other seats, decoded in the same batched loop; only the model's seat trains.

For the last two the game is a match (``TextArenaMatch``; the agent loop's mechanism is
agents/seats.py): every seat's turns are sampled by the agent loop's batched decoding.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import random
import re
from collections.abc import Callable
from typing import Any

from reinforge.agents.adapters.base import BaselineNotApplicable, register_text_env
from reinforge.config.callables import load_callable

__all__ = ["SEAT_MODES", "TextArenaEnv", "TextArenaMatch", "make_textarena", "textarena_success"]

_MISSING = "env.name=textarena needs TextArena: pip install 'reinforge[textarena]'"
# Seats played by the model itself: the two names, and other spellings pointed to them.
SEAT_MODES = ("self_play", "frozen")
_MISSPELT = {"model", "frozen_model", "self", "selfplay", "self-play", "policy"}
_MAX_OPPONENT_MOVES = 64  # an opponent that never hands the turn back is a broken game, not a hang


def _textarena():
    try:
        import textarena
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError as err:
        raise ImportError(f"{_MISSING} ({err})") from None
    return textarena, ENV_REGISTRY


@functools.lru_cache(maxsize=32)
def _opponent(target: str) -> Callable[[str], str]:
    # Cached: the environment is made once per trajectory, and a file.py:function would be executed
    # again each time.
    fn = load_callable(target, "env.options.opponent")
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        params = None
    if params is not None and not params:
        raise TypeError(f"opponent={target!r} takes no argument: it must be opponent(observation) -> action text")
    return fn


class TextArenaEnv:
    """A TextArena game under the adapter contract (``reset(seed) -> (obs, info)``, ``step(action)
    -> (obs, reward, terminated, truncated, info)``), the model at seat ``player``, ``opponent``
    playing the others. ``game`` is the TextArena environment (with its default wrappers)."""

    def __init__(self, make_game: Callable[[], Any], env_id: str, *, num_players: int, player: int | str,
                 opponent: Callable | None):
        self.make_game = make_game
        self.game = make_game()
        self._used = False  # whether self.game has been reset (played) already
        self.env_id = env_id
        self.num_players = num_players
        self.seat_option = player
        self.player = 0 if player == "random" else int(player)
        self.opponent = opponent
        self.observation = ""
        self.done = False
        self.result: dict[str, Any] | None = None

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        if self._used:
            # A fresh game per episode: TextArena's observation wrappers keep each player's history
            # across reset(), so a reused game would show the last episode's turns again.
            self.game = self.make_game()
        self._used = True
        try:
            self.game.reset(num_players=self.num_players, seed=seed)
        except AssertionError as err:  # TextArena's way to refuse a player count
            raise TypeError(f"TextArena game {self.env_id!r} cannot be played by {self.num_players} player(s) "
                            f"({err}); for a game of two or more players set env.options.opponent "
                            "('module:function', a policy for the other seats; self_play; or frozen) and, if more than two, "
                            "num_players") from None
        if self.seat_option == "random":
            # The global stream TextArena's reset just seeded: the episode's own (adapters/base.py).
            self.player = random.randrange(self.num_players)
        self.done, self.result = False, None
        self._play_others()
        if self.done:
            raise RuntimeError(f"TextArena game {self.env_id!r} ended before seat {self.player} (the model) moved")
        self.observation = self._observe()
        return self.observation, {"player": self.player}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.done:
            raise RuntimeError("step() after the game ended; reset() first")
        self._act(action)
        self._play_others()
        if self.done:
            rewards, info = self._finish()
            return self.observation, float(rewards.get(self.player, 0.0)), True, False, info
        self.observation = self._observe()
        return self.observation, 0.0, False, False, {}

    def _act(self, action: str) -> None:
        done, _info = self.game.step(action=str(action))
        self.done = bool(done)

    def _current(self) -> int:
        return int(self.game.state.current_player_id)

    def _play_others(self) -> None:
        moves = 0
        while not self.done and self._current() != self.player:
            if self.opponent is None:
                raise TypeError(f"TextArena game {self.env_id!r} gave the turn to seat {self._current()}, but no "
                                "env.options.opponent plays it")
            moves += 1
            if moves > _MAX_OPPONENT_MOVES:
                raise RuntimeError(f"the opponent made {_MAX_OPPONENT_MOVES} moves in a row in {self.env_id!r} "
                                   "without handing the turn back")
            _seat, text = self.game.get_observation()
            self._act(self.opponent(text))

    def _observe(self) -> str:
        seat, text = self.game.get_observation()
        if seat != self.player:  # pragma: no cover - _play_others hands the turn back first
            raise RuntimeError(f"TextArena game {self.env_id!r}: seat {seat} to move, not the model's {self.player}")
        return str(text)

    def _finish(self) -> tuple[dict[int, float], dict]:
        rewards, game_info = self.game.close()
        rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
        mine = dict((game_info or {}).get(self.player, {}))
        info = {"rewards": {str(k): v for k, v in sorted(rewards.items())}, "player": self.player,
                "reason": mine.get("reason"), "invalid_move": bool(mine.get("invalid_move", False)),
                "turn_count": mine.get("turn_count")}
        info["success"] = textarena_success(rewards, self.player)
        self.result = info
        return rewards, info

    def close(self) -> None:
        # close() is also how TextArena hands out the rewards: done at the end of the game; a game cut
        # short by the trainer's budgets holds nothing that needs releasing.
        self.done = True


class TextArenaMatch:
    """A TextArena game whose every seat is a trajectory (``seats``: "policy" or "frozen" per
    seat), under the several-seat contract of adapters/base.py (``TextMatchAdapter``)."""

    def __init__(self, make_game: Callable[[], Any], env_id: str, *, seats: tuple[str, ...]):
        self.make_game, self.env_id, self.seats = make_game, env_id, tuple(seats)
        self.game = None
        self.done = False

    def reset(self, seed: int | None = None) -> None:
        # A fresh game per episode (TextArena's observation wrappers keep each player's history).
        self.game = self.make_game()
        try:
            self.game.reset(num_players=len(self.seats), seed=seed)
        except AssertionError as err:  # TextArena's way to refuse a player count
            raise TypeError(f"TextArena game {self.env_id!r} cannot be played by {len(self.seats)} players ({err}); "
                            "set env.options.num_players") from None
        self.done = False

    def to_move(self) -> int | None:
        return None if self.done else int(self.game.state.current_player_id)

    def observation(self, seat: int) -> str:
        player, text = self.game.get_observation()
        if int(player) != seat:  # pragma: no cover - the table asks the seat to move only
            raise RuntimeError(f"TextArena game {self.env_id!r}: seat {player} to move, not {seat}")
        return str(text)

    def act(self, seat: int, action: str) -> None:
        done, _info = self.game.step(action=str(action))
        self.done = bool(done)

    def result(self) -> dict[int, tuple[float, dict]]:
        rewards, game_info = self.game.close()
        rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
        out = {}
        for seat in range(len(self.seats)):
            mine = dict((game_info or {}).get(seat, {}))
            out[seat] = (rewards.get(seat, 0.0), {
                "rewards": {str(k): v for k, v in sorted(rewards.items())}, "player": seat,
                "reason": mine.get("reason"), "invalid_move": bool(mine.get("invalid_move", False)),
                "turn_count": mine.get("turn_count"), "success": textarena_success(rewards, seat)})
        return out

    def close(self) -> None:
        pass  # close() of the game hands out the rewards: called by result() at the end


def textarena_success(rewards: dict[int, float], player: int) -> bool:
    """A one-player game is solved at reward 1 (below is partial credit); a game of more players is
    won when the player's reward is above every other player's (a draw is not a success)."""
    mine = float(rewards.get(player, 0.0))
    others = [float(v) for k, v in rewards.items() if k != player]
    if not others:
        return mine >= 1.0 - 1e-9
    return mine > max(others)


def make_textarena(env_id: str | None = None, *, opponent: str | Callable | None = None,
                   player: int | str = 0, num_players: int | None = None, **kwargs: Any) -> TextArenaEnv | TextArenaMatch:
    """A TextArena game (env.options.env_id, plus the game's kwargs; two or more players: opponent,
    a 'module:function' policy, 'self_play' or 'frozen'; reinforge[textarena])."""
    if not env_id or not isinstance(env_id, str):
        raise TypeError("env.options.env_id is required: a TextArena game id, e.g. 'GuessTheNumber-v0' or "
                        "'TicTacToe-v0' (one id: a list would be drawn from outside the episode's seed)")
    if isinstance(opponent, str) and opponent.strip().lower() in _MISSPELT:
        raise TypeError(f"opponent={opponent!r}: the model as its own opponent is 'self_play' (every seat trains) "
                        "or 'frozen' (a frozen copy of the starting model); a fixed policy is 'module:function'")
    textarena, registry = _textarena()
    if env_id not in registry:
        near = difflib.get_close_matches(env_id, list(registry), n=5, cutoff=0.5)
        raise TypeError(f"env_id={env_id!r} is not a TextArena game" + (f"; did you mean {', '.join(near)}?" if near
                                                                        else " (textarena.envs.registration.ENV_REGISTRY)"))
    if opponent in SEAT_MODES:
        return _make_match(textarena, env_id, opponent, player, num_players, kwargs)
    policy = (_opponent(opponent) if isinstance(opponent, str) else opponent) if opponent is not None else None
    if policy is not None and not callable(policy):
        raise TypeError(f"opponent must be 'module:function' or a callable, got {type(opponent).__name__}")
    n = int(num_players) if num_players is not None else (2 if policy is not None else 1)
    if n < 1:
        raise TypeError(f"num_players={num_players!r}: at least 1")
    if n > 1 and policy is None:
        raise TypeError(f"num_players={n} but no env.options.opponent: name a policy for the other seats "
                        "('module:function', opponent(observation) -> action text)")
    if not (player == "random" or (isinstance(player, int) and 0 <= player < n)):
        raise TypeError(f"player={player!r}: the model's seat, an integer from 0 to {n - 1}, or 'random' "
                        "(drawn per episode from its seed)")
    try:
        env = TextArenaEnv(functools.partial(textarena.make, env_id, **kwargs), env_id, num_players=n,
                           player=player, opponent=policy)
    except TypeError as err:
        raise TypeError(f"TextArena game {env_id!r} does not take these options: {err}") from None
    env.reset(seed=0)  # a wrong player count, or a game needing an opponent, fails here: before any model loads
    return env


def _make_match(textarena, env_id: str, mode: str, player, num_players, kwargs: dict) -> TextArenaMatch:
    n = int(num_players) if num_players is not None else 2
    if n < 2:
        raise TypeError(f"num_players={num_players!r} with opponent={mode}: at least 2")
    if mode == "self_play" and player != 0:
        raise TypeError(f"player={player!r} with opponent=self_play: the model plays every seat (leave player out)")
    if mode == "frozen" and not (isinstance(player, int) and 0 <= player < n):
        raise TypeError(f"player={player!r} with opponent=frozen: the model's seat, an integer from 0 to {n - 1}")
    seats = tuple("policy" if mode == "self_play" or k == player else "frozen" for k in range(n))
    try:
        match = TextArenaMatch(functools.partial(textarena.make, env_id, **kwargs), env_id, seats=seats)
        match.reset(seed=0)  # a wrong player count or option fails here: before any model loads
    except TypeError as err:
        raise TypeError(f"TextArena game {env_id!r} does not take these options: {err}") from None
    return match


# -- baselines -------------------------------------------------------------------------------------

_MOVES = re.compile(r"(?:available|valid|legal|possible)\s+(?:moves|actions)\s*:?\s*(.*)", re.IGNORECASE)
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")
_RANGE = re.compile(r"between (-?\d+) and (-?\d+)")


def random_policy(observation: str, rng, env) -> str:
    """A uniform draw from the moves the game lists in its latest message ("Available Moves: '[0]',
    '[4]'", "Valid moves: [e2e4], ..."); GuessTheNumber: a number of the range not guessed yet.
    Games that list no moves have no random baseline here."""
    if str(getattr(env, "env_id", "")).startswith("GuessTheNumber"):
        game = env.game
        guessed = set(getattr(game, "guessed_numbers", ()))
        pool = [n for n in range(game.min_number, game.max_number + 1) if n not in guessed]
        return f"[{rng.choice(pool)}]"
    listed = _MOVES.findall(observation)
    moves = _BRACKETED.findall(listed[-1]) if listed else []
    if not moves:
        raise BaselineNotApplicable(f"{getattr(env, 'env_id', 'this game')} lists no moves to draw from")
    return rng.choice(moves)


def bisect_policy(observation: str, rng, env) -> str:
    """GuessTheNumber played by halving the range, reading only the game's text (its range, then
    each higher/lower hint)."""
    if not str(getattr(env, "env_id", "")).startswith("GuessTheNumber"):
        raise BaselineNotApplicable("bisect plays GuessTheNumber only")
    found = _RANGE.search(observation)
    lo, hi = (int(found.group(1)), int(found.group(2))) if found else (1, 100)
    for guess, hint in ((int(g), h) for g, h in _hint_pairs(observation)):
        if hint == "higher":
            lo = max(lo, guess + 1)
        else:
            hi = min(hi, guess - 1)
    return f"[{(lo + hi) // 2}]"


def _hint_pairs(observation: str) -> list[tuple[str, str]]:
    """(guess, hint) for each of the player's guesses the game answered, from its history text."""
    out = []
    lines = observation.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("[GAME] The target number is ") and i > 0:
            guess = re.search(r"\[(-?\d+)\]", lines[i - 1])
            if guess:
                out.append((guess.group(1), line.rsplit(" ", 1)[-1].rstrip(".")))
    return out


register_text_env("textarena", make_textarena,
                  doc="a TextArena game (env.options.env_id, plus its kwargs; opponent for two or more players: "
                      "'module:function', self_play or frozen; reinforge[textarena])",
                  observation="replace", baselines={"random": random_policy, "bisect": bisect_policy})
