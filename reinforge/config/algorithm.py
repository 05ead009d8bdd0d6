"""The ``algorithm`` section (the RL algorithm as components of ``reinforge.algorithms``) and the
``critic`` section (PPO's value model)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..algorithms import (
    ADVANTAGE_ESTIMATORS,
    COV_PENALTIES,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    OFF_POLICY_CORRECTIONS,
    POLICY_LOSSES,
    SCALE_MODES,
    TIS_LEVELS,
    scale_mode,
)
from .base import _rename_key, _Section


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
        "advantages of the pass@k objective (arXiv:2508.10751; uses correctness, see passk_k); "
        "'opo': reward minus the length-weighted group mean, the optimal baseline (OPO, "
        "arXiv:2505.23585); 'gpg': group-mean advantage times N / (samples in informative groups) "
        "(GPG, arXiv:2504.02546). "
        "Any estimator registered with reinforge.algorithms.register_advantage is accepted.",
    )
    scale_rewards: Literal[SCALE_MODES] = Field(
        "group",
        description="For grpo/rloo/remax/opo/gpg: divide advantages by the std of rewards in the group "
        "('group', GRPO), in the whole batch ('batch', Lite PPO), or not at all ('none', Dr. "
        "GRPO). true/false are read as 'group'/'none'.",
    )
    policy_loss: str = Field(
        "clipped",
        description="'clipped': PPO's clipped surrogate with clip_eps_low/high (arXiv:1707.06347, "
        "clip-higher from DAPO arXiv:2503.14476) and optional dual_clip; 'gspo': sequence-level "
        "ratio (arXiv:2507.18071); 'cispo': clipped, detached importance weight times log-prob "
        "(arXiv:2506.13585); 'reinforce' and 'gpg' (GPG, arXiv:2504.02546): -A * log-prob, no "
        "ratio (exact only on fresh samples); 'sapo': a smooth sigmoid gate on the ratio instead of "
        "the clip, temperatures sapo_tau_pos/neg (SAPO, arXiv:2511.20347); 'gmpo': geometric mean "
        "of the token ratios, clipped in log space to [-clip_eps_low, clip_eps_high] (GMPO, "
        "arXiv:2507.20673; verl's geo_mean); 'dppo_tv' / 'dppo_kl': truncated-IS policy gradient "
        "masked where the token's TV / binary-KL divergence leaves the trust region clip_eps_low/high "
        "(DPPO, arXiv:2602.04879); 'dro': -A * log-prob + dro_beta/2 * (logp - logp_old)^2 "
        "(verl's dro, after arXiv:2405.19107). "
        "Any loss registered with reinforge.algorithms.register_policy_loss is accepted.",
    )
    clip_eps_low: float = Field(
        0.2, ge=0, description="Lower clip range of the ratio, 1-eps (gmpo: of the log-ratio, -eps; "
        "dppo_tv/dppo_kl: the divergence threshold for negative advantages)."
    )
    clip_eps_high: float = Field(
        0.2, ge=0, description="Upper clip range of the ratio, 1+eps (DAPO's clip-higher: 0.28; gmpo: of "
        "the log-ratio, +eps; dppo_tv/dppo_kl: the divergence threshold for positive advantages)."
    )
    sapo_tau_pos: float = Field(
        1.0, gt=0, description="SAPO's gate temperature for positive advantages (policy_loss=sapo; "
        "'Soft Adaptive Policy Optimization', arXiv:2511.20347: 1.0)."
    )
    sapo_tau_neg: float = Field(
        1.05, gt=0, description="SAPO's gate temperature for negative advantages (policy_loss=sapo; "
        "paper: 1.05, above tau_pos so that negative updates fade faster)."
    )
    dppo_ratio_cap: float = Field(
        20.0, gt=0, description="Truncation of DPPO's importance weight min(ratio, cap) (policy_loss="
        "dppo_tv/dppo_kl; 'Rethinking the Trust Region in LLM RL', arXiv:2602.04879, section 5.4: "
        "keep it large)."
    )
    dro_beta: float = Field(
        0.1, ge=0, description="Weight of the quadratic log-ratio penalty of policy_loss=dro "
        "(beta/2 * (logp - logp_old)^2; after DRO, arXiv:2405.19107)."
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
        "k3 is clamped to at most 10, with zero gradient beyond; 'k3+': k3's value with k2's "
        "gradient (straight-through, unbiased KL gradient; verl's k3+); 'abs': |logp - logp_ref|.",
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
        "tokens not cut off by the ratio clip (zero-advantage tokens included, as in the paper); "
        "'kl_cov' replaces the ratio clip: the unclipped surrogate -A*ratio on every token plus "
        "kl_cov_coef*|logp - logp_old| on the top cov_ratio tokens (the penalty is zero on the "
        "first, fresh update of a batch: it needs epochs or mini_batches > 1; policy_loss=clipped "
        "only). Covariances use the current policy's log-probs over the whole (mini-)batch, as the "
        "paper does: after a batch's first update that costs one no-grad forward per update.",
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

    @field_validator("cov_bounds")
    @classmethod
    def _cov_window(cls, v: tuple[float, float]) -> tuple[float, float]:
        # a window with lower > upper selects no token: Clip-Cov would silently do nothing
        if v[0] > v[1]:
            raise ValueError(f"algorithm.cov_bounds={list(v)}: needs lower <= upper (the paper's window: [1, 5])")
        return v

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
