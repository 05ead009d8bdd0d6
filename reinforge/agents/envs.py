"""The bundled environments (offline; docs/agents.md):

- ``calculator``: answer an arithmetic task (reasoning-gym ``products``, ``basic_arithmetic``, ...)
  calling a calculator tool, or the sandboxed ``python`` tool with ``tool: python``;
- ``guess_number``: find a hidden integer over several turns from "higher"/"lower" hints
  (``task.source: env`` makes its examples);
- ``code_feedback``: write a program for a code task (``task.source: code``), read the failing
  tests' verdicts from the sandbox, and revise.
"""

from __future__ import annotations

import ast
import functools
import operator
import random
import re
from collections.abc import Sequence

from reinforge.agents.env import StepResult, ToolEnv
from reinforge.agents.python_tool import make_python_tool
from reinforge.tasks.base import Example, PromptFormat, Task, TaskError

# -- calculator --------------------------------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(node):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10**6):
            raise ValueError("exponent too large (the calculator allows |exponent| <= 64, |base| <= 10^6)")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ValueError("only numbers, + - * / // % ** and parentheses are allowed")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (integers have no size limit).

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(12 + 3) * 4567".
    """
    if len(expression) > 500:
        raise ValueError("expression longer than 500 characters")
    value = _evaluate(ast.parse(expression.strip(), mode="eval"))
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return str(value)


CALCULATOR_SYSTEM = ("Use the calculator tool for arithmetic instead of computing in your head. When you know "
                     "the result, answer with <answer>RESULT</answer>.")


def calculator_env(task, *, tool: str = "calculator", max_turns: int | None = None, timeout_s: float = 5.0,
                   max_output_chars: int = 500, sandbox_timeout_s: float = 2.0, memory_mb: int = 512,
                   max_processes: int = 32, isolation: str = "full") -> ToolEnv:
    """Arithmetic with a calculator tool (tool: calculator) or the sandboxed python tool (tool: python)."""
    if tool == "calculator":
        tools = [calculator]
    elif tool == "python":
        tools = [make_python_tool(timeout_s=sandbox_timeout_s, memory_mb=memory_mb, max_processes=max_processes,
                                  isolation=isolation)]
    else:
        raise TypeError(f"tool={tool!r}; accepted: calculator, python")
    return ToolEnv(tools, max_turns=max_turns, timeout_s=timeout_s, max_output_chars=max_output_chars)


# -- guess the number --------------------------------------------------------------------------

_ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


class GuessNumberTask(Task):
    """Hidden integers from 1 to ``high``; held-out targets come from another seed stream (the
    question text is the same for every target, so the split is by example, not by text)."""

    name = "guess_number"

    def __init__(self, *, high: int = 100, train_size: int = 1000, eval_size: int = 50, seed: int = 0,
                 prompt_format: PromptFormat | None = None):
        if high < 2:
            raise TaskError(f"guess_number: high must be at least 2, got {high}")
        self.high = high
        self.format = prompt_format or PromptFormat()
        self._train = self._make("train", train_size, seed)
        self._eval = self._make("eval", eval_size, seed + 1_000_003)

    def question(self) -> str:
        return (f"I am thinking of an integer from 1 to {self.high}. Guess it. Each turn, give one guess as "
                "<answer>N</answer>; I will reply whether my number is higher or lower.")

    def _make(self, split: str, n: int, seed: int) -> list[Example]:
        rng = random.Random(seed)
        out = []
        for i in range(n):
            target = rng.randint(1, self.high)
            out.append(Example(id=f"guess_number/{split}/{i}", messages=self.format.messages(self.question()),
                               answer=str(target), metadata={"target": target, "high": self.high}))
        return out

    def train_examples(self) -> Sequence[Example]:
        return self._train

    def eval_examples(self) -> Sequence[Example]:
        return self._eval

    def score(self, answer: str, example: Example) -> float:
        try:
            return float(int(str(answer).strip()) == int(example.metadata["target"]))
        except ValueError:
            return 0.0


def _guess_task(task_cfg) -> GuessNumberTask:
    high = int(task_cfg.options.get("high", 100))
    unknown = sorted(set(task_cfg.options) - {"high"})
    if unknown:
        raise TaskError(f"task.options for guess_number: unknown option(s) {unknown}; accepted: high")
    fmt = PromptFormat(task_cfg.system_prompt, task_cfg.prompt_suffix,
                       tuple({"user": s.user, "assistant": s.assistant} for s in task_cfg.few_shot))
    return GuessNumberTask(high=high, train_size=task_cfg.train_size, eval_size=task_cfg.eval_size,
                           seed=task_cfg.seed, prompt_format=fmt)


class GuessNumberEnv:
    """Replies "higher"/"lower" to each guess; a correct guess ends the episode (its outcome is
    scored by the task verifier on that final turn). ``wrong_guess_reward``: each wrong or
    unreadable guess's per-turn reward (0: outcome only)."""

    tools: list[dict] = []

    def __init__(self, *, max_turns: int | None = None, wrong_guess_reward: float = 0.0):
        self.max_turns = max_turns
        self.wrong_guess_reward = float(wrong_guess_reward)
        self.target: int | None = None

    def reset(self, example: Example) -> list[dict]:
        self.target = int(example.metadata["target"])
        return [dict(m) for m in example.messages]

    def step(self, message: dict) -> StepResult:
        found = _ANSWER.findall(str(message.get("content", "")))
        if not found:
            return StepResult([{"role": "user", "content": "Give one guess as <answer>N</answer>."}],
                              self.wrong_guess_reward, False, {"invalid_guess": 1})
        guess = int(found[-1])
        if guess == self.target:
            return StepResult([], 0.0, True, {"guess": guess})
        hint = "higher" if self.target > guess else "lower"
        return StepResult([{"role": "user", "content": f"My number is {hint} than {guess}."}],
                          self.wrong_guess_reward, False, {"guess": guess})


def guess_number_env(task, *, max_turns: int | None = None, wrong_guess_reward: float = 0.0) -> GuessNumberEnv:
    """Find a hidden integer from higher/lower hints (task.source: env; task.options.high)."""
    return GuessNumberEnv(max_turns=max_turns, wrong_guess_reward=wrong_guess_reward)


# -- code with test feedback -------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _code_verifier(timeout_s: float, memory_mb: int, max_processes: int, isolation: str):
    from reinforge.rewards.code import CodeVerifier

    return CodeVerifier(None, mode="tests", timeout_s=timeout_s, memory_mb=memory_mb,
                        max_processes=max_processes, isolation=isolation)


class CodeFeedbackEnv:
    """Each turn's program is run against the problem's tests in the sandbox (the code verifier's
    runner and limits); passing them all ends the episode, otherwise the model reads which tests
    failed (their inputs and the verdicts, never the expected outputs) and may revise."""

    tools: list[dict] = []

    def __init__(self, verifier, *, max_turns: int | None = None, max_output_chars: int = 1500):
        self.verifier = verifier
        self.max_turns = max_turns
        self.max_output_chars = max_output_chars
        self.example: Example | None = None

    def reset(self, example: Example) -> list[dict]:
        if "tests" not in example.metadata:
            raise TaskError("code_feedback needs a code task (task.source: code): this example has no tests")
        self.example = example
        return [dict(m) for m in example.messages]

    def step(self, message: dict) -> StepResult:
        from reinforge.agents.tools import truncate_output

        result = self.verifier.score_batch([str(message.get("content", ""))], [self.example])[0]
        if isinstance(result, Exception):
            raise result
        if result.correct:
            return StepResult([], 0.0, True, {"passed": result.details.get("passed")})
        details = result.details
        if "tests" not in details:
            text = f"{details.get('reason', 'the program did not run')}. Answer with the complete program in one ```python code block."
        else:
            tests = self.example.metadata["tests"]
            lines = []
            for i, verdict in enumerate(details["tests"]):
                if verdict != "passed":
                    t = tests[i]
                    given = (f"args={t.get('args', [])}" + (f", kwargs={t['kwargs']}" if t.get("kwargs") else "")
                             if "args" in t or "kwargs" in t else f"stdin={t.get('stdin', '')!r}")
                    lines.append(f"- test {i} ({given}): {verdict}")
            text = (f"{details['passed']}/{details['total']} tests passed. Failing tests:\n" + "\n".join(lines) +
                    "\nFix the program and answer with the complete program in one ```python code block.")
        return StepResult([{"role": "user", "content": truncate_output(text, self.max_output_chars)}], 0.0, False,
                          {"passed": details.get("passed"), "total": details.get("total")})


def code_feedback_env(task, *, max_turns: int | None = None, timeout_s: float = 2.0, memory_mb: int = 512,
                      max_processes: int = 32, isolation: str = "full",
                      max_output_chars: int = 1500) -> CodeFeedbackEnv:
    """Code with test feedback from the sandbox (task.source: code)."""
    return CodeFeedbackEnv(_code_verifier(float(timeout_s), int(memory_mb), int(max_processes), isolation),
                           max_turns=max_turns, max_output_chars=max_output_chars)


# name -> (factory, make_task): registered by agents/registry.py at the first lookup of any name.
BUNDLED = {
    "calculator": (calculator_env, None),
    "guess_number": (guess_number_env, _guess_task),
    "code_feedback": (code_feedback_env, None),
}
