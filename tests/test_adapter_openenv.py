"""The OpenEnv adapter (reinforge/agents/adapters/openenv.py) with the installed openenv-core: the
environment the package ships (its `openenv init` echo environment, generated here by the
package's own command) run in this process through a short training run and served over
WebSocket by OpenEnv's own server to OpenEnv's own client; and a small game written on OpenEnv's
base classes for what the echo environment never does (end, succeed, draw from `random`)."""

from __future__ import annotations

import gc
import importlib.util
import json
import random
import socket
import sys
import threading
import time

import numpy as np
import pytest
import torch

if importlib.util.find_spec("openenv") is None:  # found, not imported: the fixture below imports it
    pytest.skip("OpenEnv is not installed (pip install 'reinforge[openenv]')", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def _no_web_ui():
    """OpenEnv imports its optional Gradio web UI (about 5 s of imports here) when gradio is
    installed, and does without it when it is not: the environments run the same."""
    blocked = "gradio" not in sys.modules
    if blocked:
        sys.modules["gradio"] = None
    yield
    if blocked and sys.modules.get("gradio", 0) is None:
        del sys.modules["gradio"]


@pytest.fixture(scope="module")
def echo(tmp_path_factory, _no_web_ui):
    """The package's template environment, generated with `openenv init word_echo` (its uv.lock
    step, for building a Docker image, is skipped: it would reach the network)."""
    from openenv.cli.commands import init as init_cmd

    root = tmp_path_factory.mktemp("openenv_envs")
    real_lock = init_cmd._generate_uv_lock
    init_cmd._generate_uv_lock = lambda env_dir: False
    try:
        init_cmd.init("word_echo", output_dir=str(root))
    finally:
        init_cmd._generate_uv_lock = real_lock
    sys.path.insert(0, str(root))
    from word_echo.models import WordEchoAction, WordEchoObservation
    from word_echo.server.word_echo_environment import WordEchoEnvironment

    yield WordEchoEnvironment, WordEchoAction, WordEchoObservation
    sys.path.remove(str(root))


ECHO_CLASS = "word_echo.server.word_echo_environment:WordEchoEnvironment"


@pytest.fixture(scope="module")
def adapter(_no_web_ui):
    from reinforge.agents.adapters import openenv as oe_adapter  # registers env.name: openenv

    return oe_adapter


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _ex(seed: int, i: int = 0):
    from reinforge.tasks.base import Example

    return Example(f"oe/{i}", [{"role": "user", "content": "x"}], None, {"seed": seed})


def _spec():
    from reinforge.agents.adapters import TEXT_ENVS

    return TEXT_ENVS["openenv"]


def _serve(env_cls, action_cls, observation_cls, sessions: int = 8):
    """An OpenEnv server (the package's HTTPEnvServer routes in FastAPI, under uvicorn) on a free
    local port, in a thread: (url, server, stop)."""
    import uvicorn
    from fastapi import FastAPI
    from openenv.core.env_server.http_server import HTTPEnvServer

    env_server = HTTPEnvServer(env_cls, action_cls, observation_cls, max_concurrent_envs=sessions)
    app = FastAPI()
    env_server.register_routes(app)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the OpenEnv server did not start"
        time.sleep(0.02)

    def stop():
        server.should_exit = True
        thread.join(timeout=10)

    return f"http://127.0.0.1:{port}", env_server, stop


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- a small game on OpenEnv's base classes --------------------------------------------------------

def _word_game():
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class GuessAction(Action):
        guess: str

    class GuessObservation(Observation):
        prompt: str = ""

    class WordGuessEnvironment(Environment):
        """A word drawn from the global `random` seeded in reset (as OpenEnv's game servers do),
        guessed within `tries`; a right guess says so in metadata["success"]."""

        SUPPORTS_CONCURRENT_SESSIONS = True
        WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple")

        def __init__(self, tries: int = 3):
            super().__init__()
            self.tries = tries
            self._state = State(step_count=0)
            self.word = ""

        def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
            if seed is not None:
                random.seed(seed)
            self.word = random.choice(self.WORDS)
            self._state = State(episode_id=episode_id, step_count=0)
            return GuessObservation(prompt=f"Guess my word: one of {', '.join(self.WORDS)}.", reward=0.0)

        def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
            self._state.step_count += 1
            random.random()
            if action.guess.strip() == self.word:
                return GuessObservation(prompt="right", done=True, reward=1.0, metadata={"success": True})
            return GuessObservation(prompt="wrong", done=self._state.step_count >= self.tries, reward=0.0)

        @property
        def state(self) -> State:
            return self._state

    WordGuessEnvironment.step.__annotations__["action"] = GuessAction  # a local class: no string to resolve
    WordGuessEnvironment.step.__annotations__["return"] = GuessObservation
    return WordGuessEnvironment, GuessAction, GuessObservation


def _rng_state():
    return random.getstate(), np.random.get_state()[1].tolist(), np.random.get_state()[2]


def test_local_environment_maps_observations_rewards_done_and_success(adapter, echo):
    from reinforge.agents.adapters import TextEnvAdapter

    env = TextEnvAdapter(_spec(), {"env_class": ECHO_CLASS})
    assert env.reset(_ex(1)) == [{"role": "user", "content": "echoed_message: Word Echo environment ready!\n"
                                                             "message_length: 0"}]
    r = env.step({"role": "assistant", "content": "hello"})
    assert r.reward == pytest.approx(0.5) and not r.done and "success" not in r.info  # never ends, gives no verdict
    assert r.observations == [{"role": "user", "content": "echoed_message: hello\nmessage_length: 5"}]
    assert r.info["env_info"] == {"original_message": "hello", "step": 1}  # the observation's metadata

    game, _action, _obs = _word_game()
    random.seed(7)
    np.random.seed(7)
    before = _rng_state()
    words = []
    for _ in range(2):
        e = TextEnvAdapter(_spec(), {"env_class": game, "observation_field": "prompt", "success_reward": 1.0})
        assert e.reset(_ex(21))[0]["content"].startswith("Guess my word")
        words.append(e.env.env.word)
    assert words[0] == words[1] and _rng_state() == before  # the seed reached reset; its draws stayed inside
    r = e.step({"content": words[0]})
    assert r.done and r.reward == 1.0 and r.info["success"] is True and r.info["env_info"]["state"]["step_count"] == 1
    e.reset(_ex(21))
    for _ in range(3):
        r = e.step({"content": "nothing"})
    assert r.done and not r.truncated and r.reward == 0.0 and r.info["success"] is False  # below success_reward


def test_served_environment_over_websocket_one_session_per_episode(adapter, echo):
    from reinforge.agents.adapters import TextEnvAdapter

    url, server, stop = _serve(*echo)
    game_url, game_server, stop_game = _serve(*_word_game())
    try:
        env = TextEnvAdapter(_spec(), {"url": url, "observation_field": "echoed_message"})
        assert server.active_sessions == 0  # made (schema read), not connected
        assert env.reset(_ex(1)) == [{"role": "user", "content": "Word Echo environment ready!"}]
        assert server.active_sessions == 1
        r = env.step({"content": "served"})
        assert r.reward == pytest.approx(0.6) and r.observations[0]["content"] == "served"
        del env, r  # an episode cut by the trainer's budgets: its session closes with the adapter
        gc.collect()
        assert _wait_for(lambda: server.active_sessions == 0)

        e = TextEnvAdapter(_spec(), {"url": game_url, "success_reward": 1.0})
        for seed in (5, 6):
            assert e.reset(_ex(seed))[0]["content"].startswith("Guess my word")
            word = random.Random(seed).choice(("apple", "river", "stone", "cloud", "tiger", "maple"))
            r = e.step({"content": word})  # the word the seed draws: the seed went with the reset request
            assert r.reward == 1.0 and r.info["success"] is True and r.info["env_info"]["state"]["step_count"] == 1
            assert _wait_for(lambda: game_server.active_sessions == 0)  # closed when the episode ended
        e.reset(_ex(5))
        for _ in range(3):
            r = e.step({"content": "nothing"})
        assert r.done and r.reward == 0.0 and r.info["success"] is False
        with pytest.raises(ValueError, match="observation_field='nope'"):
            from reinforge.agents import env_factory

            env_factory("openenv", {"url": url, "observation_field": "nope"}, None)
    finally:
        stop()
        stop_game()


@pytest.mark.parametrize("options, message", [
    ({}, "exactly one of env_class.*and url"),
    ({"env_class": ECHO_CLASS, "action_field": "text"}, "action_field='text': WordEchoAction has"),
    ({"env_class": ECHO_CLASS, "colour": "red"}, "does not take these options.*colour"),
    ({"url": "http://127.0.0.1:9", "colour": "red"}, "go to a local environment's class"),
])
def test_bad_options_are_one_clear_line(adapter, echo, options, message):
    from reinforge.agents import env_factory

    with pytest.raises(ValueError, match=message):
        env_factory("openenv", options, None)


def test_an_unreachable_server_names_the_url(adapter):
    from reinforge.config import ConfigError

    with pytest.raises(ConfigError, match=r"env.options.url='http://127.0.0.1:9': no OpenEnv server answers"):
        adapter.make_openenv(url="http://127.0.0.1:9", timeout_s=2)


def test_missing_openenv_names_the_extra(adapter, monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv", None)
    monkeypatch.setitem(sys.modules, "openenv.core", None)
    with pytest.raises(ImportError, match=r"pip install 'reinforge\[openenv\]'"):
        adapter.make_openenv(env_class=ECHO_CLASS)


@pytest.fixture
def short_turns(monkeypatch):
    """The trainer's model loader with the tiny model's stop token likelier (a forward hook on
    the head), so its turns end and the environment is stepped."""
    import reinforge.learner.build as build_mod

    real = build_mod.load_model

    def load(*a, **k):
        model = real(*a, **k)
        eos = model.generation_config.eos_token_id
        model.lm_head.register_forward_hook(lambda _m, _i, out: out + torch.nn.functional.one_hot(
            torch.tensor(eos), out.shape[-1]).to(out.dtype) * 3.0)
        return model

    monkeypatch.setattr(build_mod, "load_model", load)


def test_the_packaged_echo_environment_trains(tmp_path, adapter, echo, short_turns):
    from reinforge.config import build_config
    from reinforge.tracking import RunDir
    from reinforge.trainer import Trainer

    from conftest import save_tiny_model

    model = save_tiny_model(tmp_path / "model", hidden=32, layers=1, max_positions=1024)
    cfg = build_config({}, [
        f"model.path={model}", "task.source=env", "task.train_size=8", "task.eval_size=2",
        "env.name=openenv", f"env.options={{env_class: '{ECHO_CLASS}'}}", "env.max_turns=2",
        "env.max_tokens_per_turn=8", "env.max_tokens=200", "env.overlap_tools=false", "rollout.num_samples=2",
        "rollout.max_new_tokens=8", "trainer.prompts_per_step=2", "trainer.steps=2", "trainer.eval_every=0",
        "trainer.eval_at_start=false", "trainer.checkpoint_every=0", "trainer.seed=5", "trainer.num_threads=1",
        "learner.lr=3e-3", f"tracking.output_dir={tmp_path / 'runs'}", "tracking.progress=false"])
    rd = RunDir.open(Trainer(cfg).run().run_dir)
    metrics = rd.read_metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    trajectories = [json.loads(line) for line in (rd.path / "trajectories" / "step_000002.jsonl").read_text().splitlines()]
    assert len(trajectories) == 4
    for t in trajectories:
        assert t["messages"][0]["content"].startswith("echoed_message: Word Echo environment ready!")
        mask = t["trained_mask"]
        assert {i for i, m in enumerate(mask) if m} == {i for turn in t["turns"] for i in range(*turn["action_span"])}
        stepped = [turn for turn in t["turns"] if turn["info"]]  # a turn cut by a budget was not sent
        for turn in stepped:
            assert turn["reward"] == pytest.approx(0.1 * len(turn["text"]))  # the echo environment's reward
            assert turn["info"]["env_info"]["original_message"] == turn["text"]
        assert t["success"] is None  # OpenEnv gives no verdict and no success_reward was set
    stepped = [turn["reward"] for t in trajectories for turn in t["turns"] if turn["info"]]
    assert stepped and len(set(stepped)) > 1  # rewards differ within the step: GRPO has a signal
    assert all(np.isfinite(m["loss"]) for m in metrics) and metrics[-1]["grad_norm"] > 0
