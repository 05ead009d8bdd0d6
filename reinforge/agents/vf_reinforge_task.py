"""A verifiers (0.4) taskset made from any reinforge task (a reasoning-gym task, a JSONL/Parquet
file, ...), scored as reinforge scores it: the answer is extracted from the reply in
``answer_format`` and checked with the task's own scorer (reasoning-gym's ``score_answer`` for
reasoning-gym tasks). It lets a reinforge task run through verifiers end to end, e.g. to compare
the verifiers path with reinforge's own on the same task (configs/agent_verifiers.yaml):

    env: {name: verifiers, options: {taskset: reinforge_task,
                                     taskset_options: {reinforge_task: {source: reasoning_gym, name: needle_haystack},
                                                       answer_format: tags}}}

verifiers imports a taskset by a top-level module name, so reinforge.agents.verifiers_source
registers this module as ``reinforge_task``.
"""

from __future__ import annotations

from typing import Any, Literal

import verifiers.v1 as vf

TASKSET_ID = "reinforge_task"

# The reinforge task, example and answer format behind each verifiers task, by task id: the reward
# scores against them (TaskData is frozen JSON-like data; a reasoning-gym entry's metadata need not be).
_EXAMPLES: dict[str, tuple[Any, Any, str]] = {}


class ReinforgeTasksetConfig(vf.TasksetConfig):
    reinforge_task: dict[str, Any] = {"source": "reasoning_gym", "name": "needle_haystack"}
    """A reinforge ``task:`` section (TaskConfig keys: source, name, options, path, prompt_suffix,
    few_shot, train_size, eval_size, seed, ...); its training and held-out examples are the tasks."""
    answer_format: Literal["tags", "boxed", "last_line", "raw"] = "tags"
    """Where the answer is in the reply (reinforge's ``reward.answer_format``)."""


class ReinforgeData(vf.TaskData):
    answer: str | None = None


def _reply(trace) -> str:
    """The last assistant message of the trace (what the answer is extracted from)."""
    for message in reversed(trace.branches[-1].messages if trace.branches else []):
        if message.role == "assistant":
            return message.content if isinstance(message.content, str) else ""
    return ""


class ReinforgeTask(vf.Task[ReinforgeData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace) -> float:
        """The task's score of the extracted answer (0 when there is none)."""
        from reinforge.rewards.extract import extract_answer

        task, example, fmt = _EXAMPLES[self.data.id]
        answer = extract_answer(_reply(trace), fmt)
        return 0.0 if answer is None else float(task.score(answer, example))


class ReinforgeTaskset(vf.Taskset[ReinforgeTask, ReinforgeTasksetConfig]):
    def load(self):
        from reinforge.config import TaskConfig
        from reinforge.tasks import build_task

        task = build_task(TaskConfig(**self.config.reinforge_task))
        for split, examples in (("train", task.train_examples()), ("eval", task.eval_examples())):
            for e in examples:
                _EXAMPLES[e.id] = (task, e, self.config.answer_format)
                system = next((m["content"] for m in e.messages if m["role"] == "system"), None)
                prompt = [m for m in e.messages if m["role"] != "system"]
                yield ReinforgeTask(ReinforgeData(id=e.id, name=f"{split}/{e.id}", prompt=prompt, system_prompt=system,
                                                  answer=None if e.answer is None else str(e.answer)),
                                    self.config.task)


__all__ = ["ReinforgeTaskset"]
