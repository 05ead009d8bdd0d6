"""An in-process chat harness for ``verifiers`` (0.4, the ``verifiers.v1`` API) environments.

verifiers drives the model through a harness program that talks to its interception server over
the OpenAI chat API. Its bundled chat loops (``null``, ``bash``) are PEP 723 scripts launched with
``uv``, which resolves their dependencies from PyPI when a rollout starts: that needs ``uv`` and a
network. ``Harness.launch`` may instead run the loop in-process as long as every model call goes
through ``endpoint`` + ``secret``; this harness does that, non-streaming, with ``httpx`` (a
verifiers dependency), so a taskset runs offline with the subprocess runtime.

It asks for one completion per launch (a chat loop without tools ends at the first reply); a
multi-turn taskset that speaks again (a simulated user) resumes it with the whole conversation
(``SUPPORTS_RESUME``). Tools (MCP toolsets) are refused: wiring them needs the MCP servers that
verifiers builds with ``uv`` at run time.

verifiers loads a harness by module name (``__all__`` exporting the class); the id of this one is
``reinforge_chat`` (``reinforge.agents.verifiers_source`` registers the module under that name).
"""

from __future__ import annotations

import httpx
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import HarnessError
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult

HARNESS_ID = "reinforge_chat"


class ReinforgeChatConfig(HarnessConfig):
    id: str = HARNESS_ID
    request_timeout_s: float = 600.0
    """Seconds one model call may take (the policy decodes on this machine)."""


class ReinforgeChatHarness(Harness[ReinforgeChatConfig]):
    """One chat completion against the interception endpoint, in this process."""

    APPENDS_SYSTEM_PROMPT = True  # the system prompt stays a system message (the template renders it)
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_) -> ProgramResult:
        if mcp_urls:
            raise HarnessError(f"harness {HARNESS_ID!r} runs no tools, but the task has tool servers "
                               f"{sorted(mcp_urls)}")
        system, prompt = self.resolve_prompt(data)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages.extend(message_to_wire(m) for m in prompt)
        if not messages:
            raise HarnessError(f"harness {HARNESS_ID!r} has no prompt to send (the task's prompt is empty)")
        async with httpx.AsyncClient(timeout=self.config.request_timeout_s) as client:
            r = await client.post(endpoint.rstrip("/") + "/chat/completions",
                                  json={"model": ctx.model, "messages": messages},
                                  headers={"Authorization": f"Bearer {secret}"})
        if r.status_code != 200:
            return ProgramResult(1, "", f"model call failed ({r.status_code}): {r.text[-2000:]}")
        return ProgramResult(0, "", "")


__all__ = ["ReinforgeChatHarness"]
