"""The ``task`` and ``reward`` sections: where the examples come from, and the verifiers that
score completions (with the reward-hacking guard)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import _Section
from .plugins import REGISTERED_VERIFIERS, VERIFIER_GROUP, entry_point_names


class FewShotExample(_Section):
    user: str = Field(..., description="A solved question (task.prompt_suffix is appended to it).")
    assistant: str = Field(..., description="Its answer, written in the answer format.")


class TaskConfig(_Section):
    source: Literal["reasoning_gym", "file", "code", "env"] = Field(
        "reasoning_gym",
        description="'reasoning_gym': a procedural task by name; 'file': a local JSONL/Parquet/CSV "
        "file or a `datasets.save_to_disk` directory of prompts and answers; 'code': programming "
        "problems with tests (a JSONL file as `path`, or a bundled set as `name`: 'basic'), "
        "scored by the 'code' verifier (docs/sandbox.md); 'env': the examples of the environment "
        "named by env.name (e.g. guess_number; docs/agents.md).",
    )
    name: str = Field(
        "leg_counting",
        description="reasoning-gym dataset name (source=reasoning_gym), or the bundled problem "
        "set (source=code; used when `path` is not given).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword options of the reasoning-gym dataset config (e.g. min_animals).",
    )
    path: str | None = Field(
        None, description="Data file or directory (source=file), or a JSONL file of code problems "
        "(source=code)."
    )
    eval_path: str | None = Field(
        None,
        description="Separate held-out file (source=file). Without it, eval_size rows are held out "
        "from `path` by a seeded shuffle.",
    )
    prompt_field: str = Field("prompt", description="Row field holding the question (source=file).")
    id_field: str | None = Field(
        None, description="Row field holding each row's own identity (source=file), e.g. an environment's "
        "`seed` or an `id` column: the held-out split then leaves out of training the rows whose id is a "
        "held-out row's id, so distinct episodes that open with the same prompt (a game's opening text) all "
        "stay. null: rows whose prompt equals a held-out prompt are left out of training.",
    )
    answer_field: str = Field("answer", description="Row field holding the reference answer.")
    system_prompt: str | None = Field(
        None, description="System message put before every prompt (None: none is added)."
    )
    prompt_suffix: str = Field(
        "", description="Text appended to every question, e.g. an instruction about answer format."
    )
    few_shot: list[FewShotExample] = Field(
        default_factory=list,
        description="Solved examples shown as earlier chat turns before every question "
        "(in-context demonstrations, as in 'Language Models are Few-Shot Learners', Brown et al., "
        "2020, arXiv:2005.14165); they show the answer format without training on it.",
    )
    train_size: int = Field(5000, gt=0, description="Number of training prompts.")
    eval_size: int = Field(200, gt=0, description="Number of held-out prompts, never trained on.")
    seed: int = Field(0, description="Seed of the data generation and of the train/held-out split.")
    truncate_prompts: Literal["off", "left"] = Field(
        "off",
        description="A prompt (chat template, system prompt and few-shot turns included) whose tokens "
        "plus rollout.max_new_tokens exceed the model's context (its max_position_embeddings) is "
        "refused before training, with its example id and the numbers ('off'). 'left' cuts the "
        "start of each such prompt, training and held-out, so that it fits; how many prompts and "
        "tokens were cut is printed when the run starts. Single-turn runs (not env).",
    )

    @field_validator("truncate_prompts", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML reads a bare `off` as false

    @model_validator(mode="after")
    def _file_needs_path(self) -> "TaskConfig":
        if self.source == "file" and not self.path:
            raise ValueError("task.source=file needs task.path (a .jsonl, .parquet or .csv file)")
        return self


BUILTIN_VERIFIERS = ("task", "math_verify", "exact_match", "format", "python", "code",
                     "outcome_rm", "prm", "judge", "implicit_prm")


class VerifierSpec(_Section):
    name: str = Field(
        ...,
        description="'task': the task's own scorer (reasoning-gym's score_answer); 'math_verify': "
        "symbolic equivalence with math-verify; 'exact_match': normalised string equality; "
        "'format': 1 when the completion follows the answer format; 'python': your own function "
        "given as options.function='module:function' or 'file.py:function'; 'code': runs the "
        "completion's code in a sandbox against the problem's tests (options: mode, "
        "partial_credit, timeout_s, memory_mb, max_processes, max_output_bytes, total_memory_mb, "
        "isolation, workers, scorer_timeout_s; docs/sandbox.md). reasoning-gym's scorers run in "
        "sandboxed worker processes (task options: timeout_s, memory_mb, isolation, workers). "
        "Reward models, loaded from local folders onto model.device (docs/reward_models.md): "
        "'outcome_rm' (a score per completion), 'prm' (a process reward model's step scores, "
        "credit-assigned to token rewards: options credit=min|sum, temperature, gamma), 'judge' "
        "(a causal LM's probability of 'Yes', per answer or per step), 'implicit_prm' (PRIME's "
        "online-updated implicit PRM, arXiv:2502.01456). Or a verifier a plugin registered with "
        "reinforge.rewards.register_verifier (a module in `imports`) or an installed package offers as a "
        "`reinforge.verifiers` entry point (docs/agents.md, Plugins).",
    )
    weight: float = Field(1.0, description="Weight of this verifier in the summed reward.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the verifier, e.g. {function: my_rewards:score} for python, {case_sensitive: true} for exact_match; an unknown option is refused naming the accepted ones.")

    @field_validator("name")
    @classmethod
    def _known_verifier(cls, v: str) -> str:
        if v in BUILTIN_VERIFIERS or v in REGISTERED_VERIFIERS or v in entry_point_names(VERIFIER_GROUP):
            return v
        plugins = sorted(REGISTERED_VERIFIERS | set(entry_point_names(VERIFIER_GROUP)))
        extra = f"; registered by plugins: {', '.join(plugins)}" if plugins else ""
        raise ValueError(f"unknown verifier {v!r}; accepted: {', '.join(BUILTIN_VERIFIERS)}{extra}. A plugin's "
                         "verifier needs its module in `imports` (or --import MODULE)")


class HackingGuardConfig(_Section):
    """The reward-hacking guard (reinforge/rewards/models/guard.py), on when a reward-model
    verifier is configured: logs rm_reward beside verifier_accuracy each step and warns (metric
    rm_hacking=1) when the first rises while the second falls over a window, the failure PURE
    (Cheng et al., 2025, arXiv:2504.15275) saw within 200 steps of PRM-only training."""

    enabled: bool = Field(True, description="Watch the reward models' reward against verifier accuracy.")
    window: int = Field(20, ge=4, description="Steps compared: the window's second half against its first.")
    min_rise: float = Field(0.02, ge=0, description="Rise of the mean reward-model reward that counts.")
    min_fall: float = Field(0.02, ge=0, description="Fall of the verifier accuracy that counts.")


class RewardConfig(_Section):
    verifiers: list[VerifierSpec] = Field(
        default_factory=lambda: [VerifierSpec(name="task")],
        description="Verifiers whose weighted scores are summed into the reward.",
    )
    answer_format: Literal["tags", "boxed", "last_line", "raw"] = Field(
        "tags",
        description="How the answer is taken from a completion: the last <answer>...</answer>, "
        "the last \\boxed{...}, the last non-empty line, or the whole completion.",
    )
    overlong_buffer: float = Field(
        0.0, ge=0, lt=1,
        description="DAPO's soft overlong punishment (arXiv:2503.14476), as a fraction of "
        "rollout.max_new_tokens: completions that run into the last overlong_buffer x "
        "max_new_tokens tokens lose reward linearly, up to overlong_penalty at the limit "
        "(DAPO: 0.2; 0: off).",
    )
    overlong_penalty: float = Field(1.0, ge=0, description="The largest overlong punishment.")
    correct_threshold: float = Field(
        1.0,
        description="A sample counts as correct (accuracy) when the 'task'/'math_verify'/"
        "'exact_match' correctness score reaches this value; partial credit does not count.",
    )
    max_abs_score: float = Field(
        1e6, gt=0,
        description="The largest |score| (and |token reward|) a verifier may return. A score that is not a "
        "finite real number within it (a string such as \"0.75\", None, NaN, 1e39) is a reward error: that "
        "verifier scores 0 for the sample, and the error is counted in the step's reward_errors and logged "
        "with its reason. True/False count as 1/0. It keeps one runaway score from swamping a group's "
        "advantages or overflowing float32.",
    )
    hacking_guard: HackingGuardConfig = Field(default_factory=HackingGuardConfig)
