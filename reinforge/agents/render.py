"""Token ids of a conversation built by appending, never by re-rendering.

The prompt (the environment's opening messages, with the tools) is rendered once through the chat
template. After that a trajectory grows by two kinds of pieces: the model's sampled tokens, kept
exactly as sampled, and an observation's tokens: the text the chat template would put after an
assistant turn for these observation messages, up to and including the opening of the next
assistant turn, tokenized on its own. Earlier turns are never rendered or tokenized again, so

- the ids the learner trains on are the ids that were sampled (decoding and re-encoding text can
  give other ids, and the log-prob ratio would compare different sequences), and
- templates that rewrite history (dropping the <think> blocks of earlier assistant turns, as
  Qwen3's and DeepSeek-R1's do) cannot change what was sampled: the model is trained on its own
  reasoning, and sees it in its context in later turns, exactly as when it sampled them.

How an observation is rendered: a two-message conversation [user "u", assistant SENTINEL] is
rendered with the observations after it and the generation prompt, twice, with sentinels that
differ in their last character; the common suffix of the two is what the template writes between
the end of an assistant turn's content and the next assistant turn. If it starts with the stop
token the model just sampled (ChatML's <|im_end|>), that part was sampled already and is dropped.
"""

from __future__ import annotations

import json

from reinforge.agents.tools import template_renders_tools, with_tool_prompt

SENTINELS = ("REINFORGE-SENTINEL-A", "REINFORGE-SENTINEL-B")


class ChatRenderer:
    """Renders prompts and observation turns for one tokenizer.

    tool_format: "auto" (the template's ``tools=`` when it shows them, else the fallback system
    prompt of ``tools.FALLBACK_TOOL_PROMPT``), "template" or "fallback"."""

    def __init__(self, tokenizer, tool_format: str = "auto"):
        if tool_format not in ("auto", "template", "fallback"):
            raise ValueError(f"tool_format={tool_format!r}; accepted: auto, template, fallback")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("multi-turn agents need a tokenizer with a chat template (tokenizer.chat_template "
                             "is empty); use an instruct/chat model")
        self.tokenizer = tokenizer
        self.tool_format = tool_format
        self._uses_template: dict[str, bool] = {}

    def _render(self, messages: list[dict], **kw) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, **kw)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def uses_template_tools(self, tools: list[dict]) -> bool:
        key = json.dumps(tools, sort_keys=True)
        if key not in self._uses_template:
            if self.tool_format == "fallback":
                self._uses_template[key] = False
            else:
                shows = template_renders_tools(self.tokenizer, tools)
                if self.tool_format == "template" and not shows:
                    raise ValueError("env.tool_format=template but this chat template does not render tools=; "
                                     "use tool_format=auto or fallback")
                self._uses_template[key] = shows
        return self._uses_template[key]

    def prompt_messages(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], list[dict] | None]:
        """(messages, tools=) as they go into the template: with the fallback, the tools are
        described in the system message and ``tools=`` is None."""
        if not tools:
            return messages, None
        if self.uses_template_tools(tools):
            return messages, tools
        return with_tool_prompt(messages, tools), None

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The opening messages, rendered once, with the generation prompt."""
        msgs, template_tools = self.prompt_messages(messages, tools)
        kw = {"tools": template_tools} if template_tools else {}
        return self._encode(self._render(msgs, add_generation_prompt=True, **kw))

    def observation_text(self, observations: list[dict], stop_text: str | None) -> str:
        """What follows a finished assistant turn whose last sampled token decodes to
        ``stop_text``: the observations as the template renders them, and the next assistant turn's
        opening."""
        # Two renderings differing only in the assistant content's last character: their common
        # suffix is what the template writes after the content (templates that rewrite earlier
        # assistant turns, keeping some tail of them, are handled too).
        full, other = (self._render([{"role": "user", "content": "u"}, {"role": "assistant", "content": sentinel}]
                                    + list(observations), add_generation_prompt=True) for sentinel in SENTINELS)
        if full == other:
            raise ValueError("the chat template drops earlier assistant turns' content entirely; observation "
                             "turns cannot be located and appended token-in/token-out")
        n = 0
        while full[len(full) - 1 - n] == other[len(other) - 1 - n]:
            n += 1
        rest = full[len(full) - n:]
        if stop_text and rest.startswith(stop_text):
            rest = rest[len(stop_text):]
        return rest

    def observation_ids(self, observations: list[dict], stop_text: str | None) -> list[int]:
        return self._encode(self.observation_text(observations, stop_text))
