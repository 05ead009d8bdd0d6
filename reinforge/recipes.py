"""Named recipes: each is a preset of config values that composes components from
``reinforge.algorithms`` as its paper did. The learner and the trainer never look at a recipe's
name; ``build_config`` merges the preset under the user's YAML and ``key=value`` overrides, so any
component can be changed on top of a recipe.

Presets set only what the method defines (advantage estimator, policy loss and clip ranges, loss
aggregation, KL placement, sampling-side pieces). Sizes (prompts, samples, lengths, learning
rate) are the user's: the papers' values are for 7B-32B models on many GPUs. docs/algorithms.md
has each recipe's formula.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Paper", "Recipe", "RECIPES"]


@dataclass(frozen=True)
class Paper:
    title: str
    authors: str
    year: int
    arxiv: str

    def cite(self) -> str:
        return f'"{self.title}", {self.authors}, {self.year}, arXiv:{self.arxiv}'


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    paper: Paper
    preset: dict[str, Any] = field(default_factory=dict)
    notes: str = ""


_DEEPSEEKMATH = Paper(
    "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models", "Shao et al.", 2024, "2402.03300"
)
_DR_GRPO = Paper("Understanding R1-Zero-Like Training: A Critical Perspective", "Liu et al.", 2025, "2503.20783")
_DAPO = Paper("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", "Yu et al.", 2025, "2503.14476")
_RLOO = Paper(
    "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs",
    "Ahmadian et al.", 2024, "2402.14740",
)
_REINFORCE_PP = Paper(
    "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models", "Hu et al.", 2025, "2501.03262"
)
_REMAX = Paper(
    "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large Language Models",
    "Li et al.", 2023, "2310.10505",
)
_GSPO = Paper("Group Sequence Policy Optimization", "Zheng et al.", 2025, "2507.18071")
_CISPO = Paper(
    "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", "MiniMax", 2025, "2506.13585"
)
_ORZ = Paper(
    "Open-Reasoner-Zero: An Open Source Approach to Scaling Up Reinforcement Learning on the Base Model",
    "Hu et al.", 2025, "2503.24290",
)
_LITE_PPO = Paper("Tricks or Traps? A Deep Dive into RL for LLM Reasoning", "Liu et al.", 2025, "2508.08221")
_PASSK = Paper(
    "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large Reasoning Models",
    "Chen et al.", 2025, "2508.10751",
)
_ENTROPY = Paper(
    "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", "Cui et al.", 2025, "2505.22617"
)
_OPO = Paper("On-Policy RL with Optimal Reward Baseline", "Hao et al.", 2025, "2505.23585")
_GPG = Paper(
    "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning", "Chu et al.", 2025, "2504.02546"
)
_SAPO = Paper("Soft Adaptive Policy Optimization", "Gao et al.", 2025, "2511.20347")
_GMPO = Paper("Geometric-Mean Policy Optimization", "Zhao et al.", 2025, "2507.20673")
_DPPO = Paper("Rethinking the Trust Region in LLM Reinforcement Learning", "Qi et al.", 2026, "2602.04879")
_DRO = Paper(
    "Offline Regularised Reinforcement Learning for Large Language Models Alignment", "Richemond et al.", 2024,
    "2405.19107",
)

# Every preset names every algorithm component it relies on, so a recipe does not silently
# inherit a default that another recipe changed.
_BASE = {
    "advantage": "grpo", "scale_rewards": "group", "policy_loss": "clipped",
    "clip_eps_low": 0.2, "clip_eps_high": 0.2, "dual_clip": None, "loss_agg": "token_mean",
    "kl_coef": 0.0, "kl_estimator": "k3", "kl_reward_coef": 0.0, "kl_reward_estimator": "k1",
    "entropy_coef": 0.0, "cov_penalty": "none", "off_policy": "none", "tis_cap": None, "epochs": 1, "mini_batches": 1,
    "dynamic_sampling": False, "overlong_filter": False,
}


def _algo(**kw: Any) -> dict[str, Any]:
    unknown = set(kw) - set(_BASE) - {"gamma", "lam", "passk_k", "cov_ratio", "cov_bounds", "kl_cov_coef",
                                      "tis_level", "icepop_band", "decoupled_cap", "sapo_tau_pos",
                                      "sapo_tau_neg", "dppo_ratio_cap", "dro_beta"}
    if unknown:  # a typo here would otherwise surface only when the recipe is used
        raise KeyError(f"recipe preset keys not in _BASE: {sorted(unknown)}")
    return {**_BASE, **kw}


_RECIPE_LIST = [
    Recipe(
        "grpo",
        "Group-relative advantages (mean/std over a prompt's samples), clipped ratio, per-sequence "
        "token-mean loss, k3 KL to the reference in the loss (beta 0.04).",
        _DEEPSEEKMATH,
        {"algorithm": _algo(loss_agg="seq_mean_token_mean", kl_coef=0.04, kl_estimator="k3")},
        "With full fine-tuning the KL term keeps a frozen copy of the model; with LoRA the "
        "reference is the base model with adapters off.",
    ),
    Recipe(
        "dr_grpo",
        "GRPO without its two biases: no std division, token sum over a constant (no length bias), no KL.",
        _DR_GRPO,
        {"algorithm": _algo(scale_rewards="none", loss_agg="token_sum_norm")},
    ),
    Recipe(
        "dapo",
        "Clip-higher (0.2/0.28), token-mean loss, dynamic sampling of informative groups, soft "
        "overlong punishment, 4 updates per rollout batch, no KL.",
        _DAPO,
        {"algorithm": _algo(clip_eps_high=0.28, dynamic_sampling=True, mini_batches=4),
         "reward": {"overlong_buffer": 0.2, "overlong_penalty": 1.0}},
        "The overlong buffer is the paper's 4096 of 20480 new tokens: the last fifth of "
        "rollout.max_new_tokens. The paper makes 16 updates per rollout batch (512 prompts, "
        "mini-batches of 32); with a handful of prompts per step we make 4. Clipping only bites "
        "from the second update on.",
    ),
    Recipe(
        "rloo",
        "REINFORCE with a leave-one-out baseline over a prompt's samples, whole sequence as one action.",
        _RLOO,
        {"algorithm": _algo(advantage="rloo", scale_rewards="none", policy_loss="reinforce",
                            loss_agg="seq_mean_token_sum")},
    ),
    Recipe(
        "reinforce_pp",
        "REINFORCE++: per-token KL in the reward, returns whitened over the whole batch (no critic, "
        "no group std), clipped ratio, token-mean loss.",
        _REINFORCE_PP,
        {"algorithm": _algo(advantage="reinforce_pp", kl_reward_coef=0.01, kl_reward_estimator="k1")},
    ),
    Recipe(
        "reinforce_pp_baseline",
        "REINFORCE++ with a group-mean baseline before the batch whitening (for several samples per prompt).",
        _REINFORCE_PP,
        {"algorithm": _algo(advantage="reinforce_pp_baseline", kl_reward_coef=0.01, kl_reward_estimator="k1")},
    ),
    Recipe(
        "remax",
        "REINFORCE with the reward of the prompt's greedy completion as baseline (one extra greedy sample per prompt).",
        _REMAX,
        {"algorithm": _algo(advantage="remax", scale_rewards="none", policy_loss="reinforce",
                            loss_agg="seq_mean_token_sum")},
    ),
    Recipe(
        "gspo",
        "Sequence-level importance ratio (length-normalised) clipped to [1-3e-4, 1+4e-4], group "
        "advantages, 4 mini-batches per rollout batch.",
        _GSPO,
        {"algorithm": _algo(policy_loss="gspo", clip_eps_low=3e-4, clip_eps_high=4e-4,
                            loss_agg="seq_mean_token_mean", mini_batches=4)},
    ),
    Recipe(
        "cispo",
        "Clipped, detached importance weights times the log-prob: every token keeps its gradient; "
        "no lower clip, token-mean loss, group advantages.",
        _CISPO,
        {"algorithm": _algo(policy_loss="cispo", clip_eps_low=1.0, clip_eps_high=0.28, mini_batches=4)},
        "The paper tunes only the upper bound and publishes no single value; 0.28 follows "
        "DAPO's clip-higher. The weights differ from 1 only on off-policy updates, hence 4 "
        "mini-batches per rollout batch.",
    ),
    Recipe(
        "ppo",
        "PPO with a learned critic: GAE (gamma 1, lambda 1), whitened advantages, clipped ratio and "
        "clipped value loss, no KL, as in Open-Reasoner-Zero's PPO for reasoning.",
        _ORZ,
        {"algorithm": _algo(advantage="gae", gamma=1.0, lam=1.0)},
        "With one update per rollout batch the ratio and value clipping are inactive; raise "
        "algorithm.mini_batches or epochs for classic multi-update PPO. PPO itself: 'Proximal Policy Optimization Algorithms', Schulman et al., 2017, "
        "arXiv:1707.06347; GAE: Schulman et al., 2015, arXiv:1506.02438.",
    ),
    Recipe(
        "lite_ppo",
        "Group-mean advantage with batch-level std, token-mean loss, plain clipped PPO loss, no KL.",
        _LITE_PPO,
        {"algorithm": _algo(scale_rewards="batch")},
    ),
    Recipe(
        "passk",
        "Advantages of the pass@k objective in closed form (k=4): rewards exploration of prompts "
        "the policy solves only sometimes.",
        _PASSK,
        {"algorithm": _algo(advantage="passk", passk_k=4)},
        "Uses correctness (reward.correct_threshold), not the reward's value; needs rollout.num_samples >= k.",
    ),
    Recipe(
        "clip_cov",
        "GRPO with Clip-Cov: the gradient of a few high-covariance tokens is dropped to slow entropy collapse.",
        _ENTROPY,
        {"algorithm": _algo(cov_penalty="clip_cov", cov_ratio=2e-4, cov_bounds=(1.0, 5.0), mini_batches=2)},
        "The selected tokens lose their gradient in every update; they are drawn among tokens that "
        "still have one (not cut off by the ratio clip), as in the authors' code, which after a "
        "batch's first update costs one no-grad forward; zero-advantage tokens stay in the draw, "
        "as in the paper. Covariances use the current policy's log-probs, as in the paper.",
    ),
    Recipe(
        "kl_cov",
        "GRPO advantages with KL-Cov in place of PPO's clip: the unclipped surrogate on every token, "
        "plus a |logp - logp_old| penalty on the top high-covariance tokens.",
        _ENTROPY,
        {"algorithm": _algo(cov_penalty="kl_cov", cov_ratio=2e-3, kl_cov_coef=1.0, mini_batches=2)},
        "The penalty is zero on the first, fresh update of a batch (logp = logp_old, the plain "
        "policy gradient); it acts from the second mini-batch on. Covariances use the current "
        "log-probs (one no-grad forward per update after the first), as in the paper.",
    ),
    Recipe(
        "opo",
        "Exact on-policy REINFORCE-style update with the optimal baseline: reward minus the "
        "length-weighted group mean, no std division, no KL, no entropy bonus.",
        _OPO,
        {"algorithm": _algo(advantage="opo", scale_rewards="none")},
        "Exact on-policy: one update per rollout batch (verl: ppo_mini_batch_size = train_batch_size), "
        "so the ratio is 1 and the clipped loss is the plain policy gradient. Lengths are the "
        "completions' action tokens.",
    ),
    Recipe(
        "gpg",
        "Group Policy Gradient: -A log-prob with no surrogate, clip, KL or critic; group-mean "
        "advantage times N / (samples in informative groups), token-mean loss.",
        _GPG,
        {"algorithm": _algo(advantage="gpg", scale_rewards="none", policy_loss="gpg")},
        "F_norm = 1 and alpha = B / (B - M), the paper's main setting. Its optional threshold "
        "beta_th (resample until enough groups are informative) is not implemented; "
        "algorithm.dynamic_sampling drops those groups instead (then alpha = 1). One update per "
        "batch: the loss has no ratio, so it is exact only on fresh samples.",
    ),
    Recipe(
        "sapo",
        "Soft Adaptive Policy Optimization: a sigmoid gate on the token ratio replaces the hard "
        "clip (temperatures 1.0 / 1.05 for positive / negative advantages), group advantages, "
        "per-sequence token-mean loss.",
        _SAPO,
        {"algorithm": _algo(policy_loss="sapo", sapo_tau_pos=1.0, sapo_tau_neg=1.05,
                            loss_agg="seq_mean_token_mean", mini_batches=4)},
        "The gate differs from 1 only off-policy, hence 4 mini-batches per rollout batch (verl's "
        "example makes 8).",
    ),
    Recipe(
        "gmpo",
        "Geometric-Mean Policy Optimization: the sequence ratio is the geometric mean of token "
        "ratios, each clipped in log space to [-0.4, 0.4]; group advantages, per-sequence loss.",
        _GMPO,
        {"algorithm": _algo(policy_loss="gmpo", clip_eps_low=0.4, clip_eps_high=0.4,
                            loss_agg="seq_mean_token_mean", mini_batches=4)},
        "clip_eps_low/high are log-ratio bounds here (ratio range [e^-0.4, e^0.4]), the paper's "
        "and verl's example values; 4 updates per rollout batch as in that example (1024 / 256).",
    ),
    Recipe(
        "dppo",
        "Divergence PPO (Binary-TV): a token is masked when |p - p_old| leaves the trust region "
        "0.15 in the advantage's direction, otherwise a truncated-IS policy gradient; Dr. GRPO "
        "advantages and aggregation.",
        _DPPO,
        {"algorithm": _algo(policy_loss="dppo_tv", clip_eps_low=0.15, clip_eps_high=0.15, dppo_ratio_cap=20.0,
                            scale_rewards="none", loss_agg="token_sum_norm", mini_batches=4)},
        "The Binary-KL variant is policy_loss=dppo_kl with thresholds 0.05. The authors recommend "
        "Dr. GRPO's advantages and length normalisation, and measuring the region against the "
        "sampler's log-probs; here it is measured against the learner's at rollout time (verl's "
        "registered loss does the same).",
    ),
    Recipe(
        "dro",
        "Policy gradient with a quadratic trust region instead of a clip: "
        "-(A log-prob - 0.05 (logp - logp_old)^2) per token (verl's dro loss), group advantages.",
        _DRO,
        {"algorithm": _algo(policy_loss="dro", dro_beta=0.1, mini_batches=4)},
        "The DRO paper is offline, with a learned value function; this is the online per-token "
        "form verl and Tinker call dro, composed with GRPO advantages. The penalty is 0 on a "
        "batch's first update, hence 4 mini-batches per rollout batch.",
    ),
]

RECIPES: dict[str, Recipe] = {r.name: r for r in _RECIPE_LIST}
