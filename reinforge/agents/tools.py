"""Tools: plain Python functions the model may call, their JSON schemas, how the calls are written
in the model's text, and how a call becomes an observation whatever goes wrong.

A tool is a function with type hints and a Google-style docstring; its schema (the OpenAI
function-calling form chat templates take as ``tools=``) is derived by
``transformers.utils.get_json_schema``. The model calls a tool by writing

    <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>

(the Hermes/Qwen convention, which tool-aware chat templates also describe). Every way a call can
fail (text that is not JSON, an unknown tool, arguments that do not fit the signature, a tool that
raises, a tool that does not return within its time limit) becomes an error observation the model
reads on its next turn, and is counted; the run goes on. Every observation longer than
``max_output_chars`` (a result or an error: a traceback, a program's output quoted in its error, a
model-written tool name echoed back) is cut with a visible marker, so the model and the reader of a
trajectory both know it was cut.

In-process tools run in a thread of the trainer's process: they must be trusted code. Model-written
code is never run that way: the ``python`` tool (reinforge/agents/python_tool.py) runs it in the
sandbox.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
TRUNCATION_MARKER = "\n...[output truncated: {dropped} of {total} characters not shown]"

# The fallback format, for chat templates that do not render ``tools=`` (SmolLM2's does not):
# the schemas and the call convention go into the system message.
FALLBACK_TOOL_PROMPT = (
    "You can call tools. To call one, write on its own line\n"
    '<tool_call>{{"name": <tool name>, "arguments": <JSON object of arguments>}}</tool_call>\n'
    "and stop; its result comes back in the next message. When you have the final answer, write it "
    "without a tool call.\nAvailable tools (JSON schemas):\n{schemas}"
)


class ToolError(Exception):
    """A tool could not be called or failed; the message is what the model is shown."""


@dataclass(frozen=True)
class Tool:
    """A callable with its JSON schema. ``timeout_s``: its own time limit (None: the executor's)."""

    name: str
    fn: Callable[..., Any]
    schema: dict
    timeout_s: float | None = None

    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, name: str | None = None,
                      timeout_s: float | None = None) -> "Tool":
        """A tool from a typed, documented function (``transformers.utils.get_json_schema``)."""
        from transformers.utils import get_json_schema

        try:
            schema = get_json_schema(fn)
        except Exception as err:  # DocstringParsingException, TypeHintParsingException
            raise ValueError(
                f"tool {getattr(fn, '__name__', fn)!r}: cannot derive its JSON schema ({err}). A tool "
                "needs a type hint on every argument and a docstring with a description and an "
                "'Args:' section describing each argument."
            ) from None
        schema = {"type": "function", "function": dict(schema["function"])}
        if name is not None:
            schema["function"]["name"] = name
        return cls(schema["function"]["name"], fn, schema, timeout_s)


def as_tool(obj: "Tool | Callable[..., Any]") -> Tool:
    return obj if isinstance(obj, Tool) else Tool.from_function(obj)


@dataclass
class ToolCall:
    """One call as parsed from the model's text: ``error`` is set when it is malformed."""

    name: str | None
    arguments: dict[str, Any] | None
    raw: str
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` in ``text`` (and an unclosed one at its end), in order.
    A call that is not a JSON object with a string ``name`` and an object ``arguments`` is returned
    with ``error`` saying what is wrong."""
    end = _closed_end(text)
    calls = [_parse_one(m.group(1)) for m in TOOL_CALL.finditer(text, 0, end)]
    rest = text[end:]
    opened = rest.find("<tool_call>")
    if opened >= 0:
        calls.append(ToolCall(None, None, rest[opened + len("<tool_call>"):],
                              "the <tool_call> tag is not closed with </tool_call>"))
    return calls


def strip_tool_calls(text: str) -> str:
    """``text`` without its closed ``<tool_call>...</tool_call>`` blocks."""
    end = _closed_end(text)
    return TOOL_CALL.sub("", text[:end]) + text[end:]


def _closed_end(text: str) -> int:
    """Where the last ``</tool_call>`` ends (0 if none). The lazy search runs only up to there:
    from an opener after it, it would scan to the end of the text again for every opener
    (quadratic on ``"<tool_call>" * n``)."""
    close = text.rfind("</tool_call>")
    return close + len("</tool_call>") if close >= 0 else 0


def _parse_one(raw: str) -> ToolCall:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as err:
        return ToolCall(None, None, raw, f"the tool call is not valid JSON ({err})")
    if not isinstance(obj, dict):
        return ToolCall(None, None, raw, "the tool call must be a JSON object with 'name' and 'arguments'")
    name, args = obj.get("name"), obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            pass
    if not isinstance(name, str):
        return ToolCall(None, None, raw, "the tool call has no string 'name'")
    if not isinstance(args, dict):
        return ToolCall(name, None, raw, "'arguments' must be a JSON object")
    return ToolCall(name, args, raw)


def truncate_output(text: str, max_chars: int | None) -> str:
    """``text`` cut to ``max_chars`` characters plus a marker saying how much was dropped."""
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[:max_chars] + TRUNCATION_MARKER.format(dropped=len(text) - max_chars, total=len(text))


@dataclass
class ToolResult:
    """What one call produced: ``content`` is what the model sees (the result, or the error);
    ``error`` names the failure kind (None when it worked): "malformed", "unknown_tool",
    "bad_arguments", "raised", "timeout"."""

    name: str | None
    arguments: dict[str, Any] | None
    content: str
    error: str | None = None
    truncated: bool = False

    def to_dict(self) -> dict:
        return {"name": self.name, "arguments": self.arguments, "content": self.content,
                "error": self.error, "truncated": self.truncated}


@dataclass
class ToolExecutor:
    """Runs parsed calls against a set of tools, turning every failure into a ToolResult.

    timeout_s:        each call's time limit (a tool's own ``timeout_s`` wins). A call that does
                      not return in time is abandoned (its thread is asked to stop between
                      bytecodes; a call stuck inside C keeps its daemon thread until it returns)
                      and the model is told it timed out.
    max_output_chars: longer results are cut with a visible marker (None: never).
    """

    tools: Sequence[Tool | Callable[..., Any]]
    timeout_s: float | None = 10.0
    max_output_chars: int | None = 2000
    _by_name: dict[str, Tool] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.tools = [as_tool(t) for t in self.tools]
        self._by_name = {}
        for t in self.tools:
            if t.name in self._by_name:
                raise ValueError(f"two tools are named {t.name!r}; tool names must be unique")
            self._by_name[t.name] = t

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools]

    def run(self, call: ToolCall) -> ToolResult:
        """The call's result; its ``content`` (what the model reads: the result, or the error
        with whatever the tool or the model put in it) is cut to ``max_output_chars`` on every
        path, with the marker."""
        result = self._run(call)
        content = truncate_output(result.content, self.max_output_chars)
        if content != result.content:
            result.content, result.truncated = content, True
        return result

    def _run(self, call: ToolCall) -> ToolResult:
        if call.error is not None and call.name is None:
            return ToolResult(None, None, f"Error: {call.error}.", "malformed")
        tool = self._by_name.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._by_name)) or "(none)"
            return ToolResult(call.name, call.arguments, f"Error: unknown tool {call.name!r}; available tools: {known}.",
                              "unknown_tool")
        if call.error is not None:
            return ToolResult(call.name, call.arguments, f"Error: {call.error}.", "bad_arguments")
        try:
            inspect.signature(tool.fn).bind(**call.arguments)
        except TypeError as err:
            return ToolResult(call.name, call.arguments, f"Error: wrong arguments for {call.name}: {err}.",
                              "bad_arguments")
        limit = tool.timeout_s if tool.timeout_s is not None else self.timeout_s
        try:
            value = _call_with_timeout(lambda: tool.fn(**call.arguments), limit)
        except _ToolTimeout:
            return ToolResult(call.name, call.arguments, f"Error: {call.name} did not return within {limit:g} s.",
                              "timeout")
        except Exception as err:  # noqa: BLE001 - a failing tool is an observation, not a crash
            return ToolResult(call.name, call.arguments, f"Error: {call.name} raised {type(err).__name__}: {err}",
                              "raised")
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return ToolResult(call.name, call.arguments, text)


class _ToolTimeout(Exception):
    pass


class _StopTool(BaseException):
    """Raised inside an abandoned tool thread (between bytecodes) to make it stop."""


def _call_with_timeout(fn: Callable[[], Any], seconds: float | None) -> Any:
    """fn() in a daemon thread, or _ToolTimeout after ``seconds``. A thread (not the caller's)
    because a tool may block in C (a sleep, a socket) where no signal or async exception reaches
    it; the caller is then free at the deadline whatever the tool does."""
    if seconds is None or seconds <= 0:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except _StopTool:
            pass
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True, name="reinforge-tool")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_StopTool))
        raise _ToolTimeout
    if "error" in box:
        raise box["error"]
    return box.get("value")


# -- showing tools to the model ----------------------------------------------------------------


def template_renders_tools(tokenizer, schemas: list[dict]) -> bool:
    """Whether the tokenizer's chat template shows ``tools=`` (rendering with them differs)."""
    if not schemas or not getattr(tokenizer, "chat_template", None):
        return False
    probe = [{"role": "user", "content": "hi"}]
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=schemas, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that rejects tools does not support them
        return False
    without = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    return with_tools != without


def fallback_tool_prompt(schemas: list[dict]) -> str:
    return FALLBACK_TOOL_PROMPT.format(schemas="\n".join(json.dumps(s) for s in schemas))


def with_tool_prompt(messages: list[dict], schemas: list[dict]) -> list[dict]:
    """``messages`` with the fallback tool description at the end of the system message (one is
    added when there is none)."""
    text = fallback_tool_prompt(schemas)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content', '')}\n\n{text}".strip()
    else:
        out.insert(0, {"role": "system", "content": text})
    return out
