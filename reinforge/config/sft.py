"""The ``sft`` section: a supervised warm start before RL, or expert iteration."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import _Section

# ----------------------------------------------------------------------------- warm starts (SFT)
# Read by reinforge/sft/: `reinforge sft CONFIG`, and the SFT stage that `reinforge train` runs
# before RL when a config has an `sft:` section (docs/sft.md).


class ExpertIterationConfig(_Section):
    """Rejection-sampling fine-tuning (expert iteration): rounds of sampling completions from the
    current model, keeping those the verifier accepts, and fine-tuning on them. STaR ("STaR:
    Bootstrapping Reasoning With Reasoning", Zelikman et al., 2022, arXiv:2203.14465), ReST
    ("Reinforced Self-Training for Language Modeling", Gulcehre et al., 2023, arXiv:2308.08998),
    RAFT ("RAFT: Reward rAnked FineTuning", Dong et al., 2023, arXiv:2304.06767). Each round
    makes ``sft.steps`` optimiser steps on that round's accepted samples."""

    rounds: int = Field(3, gt=0, description="Sample / filter / fine-tune rounds (STaR's outer loop).")
    prompts_per_round: int = Field(
        64, gt=0, description="Training prompts sampled per round (a seeded draw without replacement).")
    samples_per_prompt: int = Field(4, gt=0, description="Completions sampled per prompt (k).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the round's completions.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the round's completions (1: the whole distribution).")
    accept_threshold: float = Field(
        1.0, description="A completion is kept when its reward (the weighted verifier sum of the "
        "`reward` section) is at least this (ReST's filtering threshold; 1.0 with one 0/1 "
        "verifier: only correct answers).")
    dedupe: bool = Field(True, description="Keep identical accepted completions of one prompt once.")
    max_per_prompt: int | None = Field(
        None, gt=0, description="Keep at most this many accepted completions per prompt, the "
        "highest rewards first (RAFT keeps the best one: 1; None: all).")


class SFTConfig(_Section):
    """Supervised fine-tuning on demonstrations, with the loss on the response tokens only (the
    prompt, chat template included, is context): the warm start before RL of DeepSeek-R1's cold
    start ("DeepSeek-R1", DeepSeek-AI, 2025, arXiv:2501.12948) and of InstructGPT's SFT stage
    (Ouyang et al., 2022, arXiv:2203.02155). The model, LoRA, optimiser betas, weight decay,
    gradient clipping and micro-batching are the `model` and `learner` sections' (as in RL)."""

    source: Literal["task", "file", "expert_iteration"] = Field(
        "task",
        description="'task': demonstrations made from the task's training examples: the gold "
        "answer in reward.answer_format, after the worked solution where the example's metadata "
        "has one (solution_keys); 'file': a JSONL/JSON/Parquet file of prompt/response pairs or "
        "chat `messages` rows (path); 'expert_iteration': the model's own accepted samples, "
        "round by round (the expert_iteration section).",
    )
    path: str | None = Field(None, description="Demonstrations file (source=file).")
    prompt_field: str = Field("prompt", description="Row field of the prompt: a string or chat messages.")
    response_field: str = Field("response", description="Row field of the response (a string).")
    messages_field: str = Field(
        "messages", description="Row field of a whole chat; its last message is the assistant's response.")
    apply_prompt_format: bool = Field(
        True, description="Give file prompts the task's system prompt, suffix and few-shot turns, so "
        "they look like the prompts RL and the evaluation use.")
    num_examples: int | None = Field(
        256, gt=0, description="source=task: demonstrations made from the first N training "
        "examples; source=file: use at most the first N rows (None: every row).")
    solution_keys: list[str] = Field(
        default_factory=lambda: ["answer_cot"],
        description="source=task: metadata keys holding a worked solution, written before the "
        "answer (reasoning-gym's gsm_symbolic has `answer_cot`); examples without one get the "
        "answer alone.")
    max_tokens: int = Field(
        1024, gt=0, description="Demonstrations longer than this (prompt + response tokens) are left "
        "out, and counted in the log.")
    steps: int = Field(
        50, gt=0, description="Optimiser steps (source=expert_iteration: per round).")
    batch_size: int = Field(16, gt=0, description="Demonstrations per optimiser step.")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate of the SFT steps.")
    lr_warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up, in SFT steps.")
    eval_every: int = Field(
        0, ge=0, description="Held-out greedy evaluation every N SFT steps (0: at the start and end "
        "only; expert iteration also evaluates at every round's end).")
    checkpoint_every: int = Field(0, ge=0, description="Checkpoint every N SFT steps (0: end only).")
    expert_iteration: ExpertIterationConfig = Field(default_factory=ExpertIterationConfig)

    @model_validator(mode="after")
    def _file_needs_path(self) -> "SFTConfig":
        if self.source == "file" and not self.path:
            raise ValueError("sft.source=file needs sft.path (a .jsonl, .json or .parquet file of demonstrations)")
        return self

    @property
    def total_steps(self) -> int:
        """Optimiser steps of the whole SFT run (expert iteration: rounds x steps)."""
        rounds = self.expert_iteration.rounds if self.source == "expert_iteration" else 1
        return rounds * self.steps
