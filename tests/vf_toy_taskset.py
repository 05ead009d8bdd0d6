"""A tiny in-memory verifiers (0.4) taskset for tests/test_verifiers_env.py: a short prompt per
task, rewarded 1.0 when the reply holds a vowel (a random tiny model sometimes writes one, so
rewards vary within a group). verifiers loads it by module name (``taskset: vf_toy_taskset``)."""

import verifiers.v1 as vf

WORDS = ["cat", "dog", "sun", "map", "pen", "cup"]


def reply_text(trace) -> str:
    """The last assistant message's text."""
    for message in reversed(trace.branches[-1].messages if trace.branches else []):
        if message.role == "assistant":
            return message.content if isinstance(message.content, str) else ""
    return ""


class ToyTask(vf.Task):
    @vf.reward
    async def vowel(self, trace) -> float:
        return 1.0 if any(c in reply_text(trace) for c in "aeiou") else 0.0


class ToyTaskset(vf.Taskset[ToyTask]):
    def load(self):
        for word in WORDS:
            yield ToyTask(vf.TaskData(prompt=f"Say {word}.", system_prompt="Be brief."), self.config.task)


__all__ = ["ToyTaskset"]
