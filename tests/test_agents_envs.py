"""The bundled environments: the calculator and the sandboxed python tool, guess-the-number, and
code with test feedback from the sandbox."""

from __future__ import annotations

import os

import pytest

from reinforge.agents import build_run_task, env_factory
from reinforge.config import build_config
from reinforge.tasks import build_task
from reinforge.tasks.base import Example


def _call(name: str, args: dict) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def test_calculator_env_on_products_answers_exactly():
    cfg = build_config({"task": {"name": "products", "options": {"min_terms": 2, "max_terms": 2, "min_digits": 4,
                                                                  "max_digits": 4}, "eval_size": 4},
                        "env": {"name": "calculator"}})
    task = build_run_task(cfg)
    example = task.eval_examples()[0]
    a, b = [int(x) for x in example.metadata["question"].split(":")[1].split(".")[0].split("*")]
    env = env_factory("calculator", {}, task)()
    assert env.tools[0]["function"]["name"] == "calculator"
    env.reset(example)
    obs, _, done, info = env.step({"role": "assistant", "content": _call("calculator", {"expression": f"{a} * {b}"})})
    assert not done and obs[0]["content"] == example.answer == str(a * b)
    obs, _, _, info = env.step({"role": "assistant", "content": _call("calculator", {"expression": "import os"})})
    assert info["tool_errors"] == 1 and obs[0]["content"].startswith("Error: calculator raised")


@pytest.fixture(scope="module")
def sandbox_ok():
    from reinforge.sandbox import Sandbox, SandboxUnavailable

    try:
        Sandbox()
    except SandboxUnavailable as err:  # the sandbox tests say why; these need it
        pytest.skip(f"sandbox unavailable: {err}")


def test_python_tool_runs_in_the_sandbox_not_in_the_trainer(sandbox_ok, tmp_path):
    env = env_factory("calculator", {"tool": "python", "sandbox_timeout_s": 1.0}, None)()
    env.reset(Example("e", [{"role": "user", "content": "x"}], "1"))
    marker = tmp_path / "written-by-the-model"
    code = (f"import os\nprint(2**100)\nprint(os.getpid())\nopen({str(marker)!r}, 'w').write('x')\n")
    obs, _, _, info = env.step({"role": "assistant", "content": _call("python", {"code": code})})
    lines = obs[0]["content"].splitlines()
    assert info["tool_errors"] == 1  # the write to the host's /tmp is refused, the run reports it
    assert not marker.exists()
    obs, _, _, info = env.step({"role": "assistant", "content": _call("python", {"code": "import os\nprint(2**100)\nprint(os.getpid())"})})
    lines = obs[0]["content"].splitlines()
    assert info["tool_errors"] == 0 and lines[0] == str(2**100)
    assert int(lines[1]) != os.getpid()  # another process (pid namespace: a small pid)
    obs, _, _, info = env.step({"role": "assistant", "content": _call("python", {"code": "while True: pass"})})
    assert info["tool_errors"] == 1 and "timeout" in obs[0]["content"]


def test_python_tool_errors_are_cut_like_its_output(sandbox_ok):
    """A failing program's error observation (its reason, its stderr, the stdout it printed) is
    cut to max_output_chars with the marker, as a long result is: the red team's failing program
    produced a 120,514-character observation under max_output_chars=500."""
    from reinforge.agents.tools import TRUNCATION_MARKER

    env = env_factory("calculator", {"tool": "python", "max_output_chars": 500}, None)()
    env.reset(Example("e", [{"role": "user", "content": "x"}], "1"))
    marker = TRUNCATION_MARKER.split("{")[0]
    for code in ("print('y' * 60000)\nraise ValueError('z' * 60000)",  # stdout, then a long traceback
                 "print('x' * 100000)",  # past the sandbox's output limit: an error too
                 "print('x' * 5000)"):  # a long result
        obs, _, _, info = env.step({"role": "assistant", "content": _call("python", {"code": code})})
        content, result = obs[0]["content"], info["tool_results"][0]
        assert result["truncated"] and content[500:].startswith(marker), code
        assert len(content) < 600, (code, len(content))
    assert result["error"] is None and info["tool_errors"] == 0  # the last one worked


def test_guess_number_task_and_split():
    cfg = build_config({"task": {"source": "env", "options": {"high": 50}, "train_size": 30, "eval_size": 10},
                        "env": {"name": "guess_number"}})
    task = build_run_task(cfg)
    train, held = task.train_examples(), task.eval_examples()
    assert len(train) == 30 and len(held) == 10
    assert all(1 <= e.metadata["target"] <= 50 for e in [*train, *held])
    assert "from 1 to 50" in train[0].messages[-1]["content"]
    e = held[0]
    assert task.score(e.answer, e) == 1.0 and task.score("0", e) == 0.0 and task.score("x", e) == 0.0


def test_code_feedback_shows_failing_tests_and_ends_when_they_pass(sandbox_ok):
    cfg = build_config({"task": {"source": "code", "name": "basic", "eval_size": 10},
                        "reward": {"verifiers": [{"name": "code"}]}, "env": {"name": "code_feedback"}})
    task = build_task(cfg.task)
    solutions = {"add": "def add(a, b):\n    return a + b", "multiply": "def multiply(a, b):\n    return a * b",
                 "sum_list": "def sum_list(xs):\n    return sum(xs)"}
    example = next(e for e in [*task.train_examples(), *task.eval_examples()] if e.metadata["id"] in solutions)
    entry = example.metadata["entry_point"]
    env = env_factory("code_feedback", {}, task)()
    env.reset(example)
    obs, _, done, info = env.step({"role": "assistant", "content": f"```python\ndef {entry}(*a, **k):\n    return None\n```"})
    text = obs[0]["content"]
    n = len(example.metadata["tests"])
    assert not done and f"0/{n} tests passed. Failing tests:" in text and "wrong answer" in text
    assert f"args={example.metadata['tests'][0]['args']}" in text and "expected" not in text
    assert info == {"passed": 0, "total": n}
    obs, _, done, _ = env.step({"role": "assistant", "content": "```python\ndef other():\n    pass\n```"})
    assert not done and "Failing tests" in obs[0]["content"]
    _, _, done, info = env.step({"role": "assistant", "content": f"```python\n{solutions[example.metadata['id']]}\n```"})
    assert done and info["passed"] == n


def test_the_docs_example_environment_runs(tmp_path):
    """docs/agents.md's example, loaded as env.name=file.py:function, does what the page says."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "agents.md").read_text()
    code = text.split("## A new tool and environment")[1].split("```python")[1].split("```")[0]
    (tmp_path / "my_env.py").write_text(code)
    env = env_factory(f"{tmp_path / 'my_env.py'}:unit_convert", {"max_turns": 3}, None)()
    env.reset(Example("e", [{"role": "user", "content": "2 km in m?"}], "2000"))
    obs, reward, done, _ = env.step({"content": _call("convert", {"value": 2, "unit_from": "km", "unit_to": "m"})})
    assert obs[0]["content"] == "2000.0" and reward == 0 and not done
    obs, reward, _, info = env.step({"content": _call("convert", {"value": 2, "unit": "km"})})
    assert info["invalid_calls"] == 1 and reward == pytest.approx(-0.1)


@pytest.mark.parametrize("name", ["agent.yaml", "agent_guess.yaml", "agent_code.yaml"])
def test_bundled_agent_configs_validate_and_build_their_environment(name):
    from pathlib import Path

    from reinforge.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / name)
    task = build_run_task(cfg)
    env = env_factory(cfg.env.name, dict(cfg.env.options), task)()
    example = task.train_examples()[0]
    messages = env.reset(example)
    assert messages and messages[-1]["role"] == "user"
    if name == "agent_guess.yaml":  # the task verifier scores the final guess
        from reinforge.rewards import build_reward

        reward = build_reward(cfg.reward, task)
        outcomes = reward([f"<answer>{example.answer}</answer>", "<answer>0</answer>"], [example, example])
        assert [o.reward for o in outcomes] == [1.0, 0.0]
