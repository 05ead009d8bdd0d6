"""The advantage estimators by name: what an estimator reads, what it returns, the registry and the
dispatch, and the built-in estimators as thin wrappers over the math in
:mod:`reinforge.algorithms.advantages`.

Every estimator is registered by name (the value of ``algorithm.advantage``) with what it needs
(:class:`~reinforge.algorithms.registry.Needs`), and ``compute_advantages`` dispatches through the
registry with one :class:`AdvantageInputs`. Adding one::

    @register_advantage("my_estimator", needs=Needs(token_rewards=True))
    def my_estimator(x: AdvantageInputs) -> Advantages:
        ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from reinforge.algorithms.advantages import (
    _check_1d,
    _gae64,
    _group_stats,
    _out_dtype,
    _scale_by_std,
    gpg_advantages,
    greedy_baseline_advantages,
    group_normalized_advantages,
    leave_one_out_advantages,
    masked_whiten,
    optimal_baseline_advantages,
    passk_advantages,
    reinforce_pp_advantages,
    scale_mode,
    token_level_rewards,
)
from reinforge.algorithms.registry import Needs, Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageInputs",
    "Advantages",
    "register_advantage",
    "compute_advantages",
    "is_group_relative",
]

#: Every advantage estimator, by its ``algorithm.advantage`` name; add one with ``register_advantage``.
ADVANTAGE_ESTIMATORS = Registry("advantage estimator", "algorithm.advantage")


#: Estimators that compare a prompt's samples with each other (a group mean or leave-one-out
#: baseline, pass@k over the group): with one sample per prompt their advantages are all exactly 0,
#: so the config refuses them with rollout.num_samples=1.
_GROUP_RELATIVE: set[str] = set()


def register_advantage(name: str, *, needs: Needs = Needs(), group_relative: bool = False):
    """Decorator: register ``fn(inputs: AdvantageInputs) -> Advantages`` as the advantage
    estimator ``name`` (then ``algorithm.advantage=name`` is accepted), declaring what it needs
    beyond the scalar rewards (``Needs(critic=True)``, ``Needs(token_rewards=True)``, ...).
    ``compute_advantages`` checks that the declared inputs are given before calling it.
    ``group_relative``: it compares each sample with the other samples of its prompt, so it needs
    at least two per prompt (``rollout.num_samples >= 2``, checked when the config is validated)."""
    register = ADVANTAGE_ESTIMATORS.register(name, needs=needs)

    def add(fn):
        register(fn)
        if group_relative:
            _GROUP_RELATIVE.add(name)
        else:
            _GROUP_RELATIVE.discard(name)
        return fn

    return add


def is_group_relative(name: str) -> bool:
    """Whether the advantage estimator ``name`` was registered as group-relative."""
    return name in _GROUP_RELATIVE


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may read, for one rollout batch. Optional tensors are given when
    the chosen estimator declares the matching need (``needs_of``); settings come from the
    ``algorithm`` config section.

    rewards:          [N] float, one scalar reward per trajectory (the outcome).
    group_index:      [N] long, the prompt each trajectory answers (any ids, any group sizes).
    mask:             [N, T] bool ACTION mask: True on the tokens the model wrote and is trained
                      on; holes (tool output, environment messages) and padding are False.
    token_rewards:    [N, T] float or None: per-token rewards from the reward side (process or
                      step rewards), added to the outcome on the last action token. Only for
                      estimators that declare ``Needs(token_rewards=True)``.
    token_kl:         [N, T] float or None: per-token KL estimate to the reference, subtracted
                      from the reward x ``kl_coef`` (token by token for token-level estimators,
                      summed over the trajectory for sequence-level ones).
    kl_coef:          the weight of ``token_kl`` (``algorithm.kl_reward_coef``).
    values:           [N, T] critic values (``Needs(critic=True)``).
    baseline_rewards: [P] reward of each prompt's greedy completion (``Needs(greedy_baseline=True)``).
    correct:          [N] 0/1 correctness per sample (``Needs(correctness=True)``).
    scale:            ``algorithm.scale_rewards`` ("group", "batch", "none"; true/false allowed).
    gamma, lam:       discount and GAE lambda (``algorithm.gamma``, ``algorithm.lam``).
    passk_k:          k of pass@k (``algorithm.passk_k``).
    whiten:           whiten GAE's advantages over the batch's action tokens.
    eps:              added to the group std by grpo/rloo/remax/passk/opo/gpg.
    """

    rewards: Tensor
    group_index: Tensor
    mask: Tensor
    token_rewards: Tensor | None = None
    token_kl: Tensor | None = None
    kl_coef: float = 0.0
    values: Tensor | None = None
    baseline_rewards: Tensor | None = None
    correct: Tensor | None = None
    scale: str | bool = "group"
    gamma: float = 1.0
    lam: float = 1.0
    passk_k: int = 1
    whiten: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        _check_1d(self.rewards, self.group_index)
        if self.mask.dim() != 2 or self.mask.shape[0] != self.rewards.shape[0]:
            raise ValueError(
                f"AdvantageInputs.mask must be [N, T] with N = {self.rewards.shape[0]} rows (one per reward); "
                f"got {tuple(self.mask.shape)}"
            )
        object.__setattr__(self, "mask", self.mask.bool())
        object.__setattr__(self, "scale", scale_mode(self.scale))
        for name in ("token_rewards", "token_kl", "values"):
            x = getattr(self, name)
            if x is not None and x.shape != self.mask.shape:
                raise ValueError(
                    f"AdvantageInputs.{name} must be [N, T] like the mask {tuple(self.mask.shape)}; got {tuple(x.shape)}"
                )
        if self.correct is not None and self.correct.shape != self.rewards.shape:
            raise ValueError(f"AdvantageInputs.correct must be [N] like rewards; got {tuple(self.correct.shape)}")

    def sequence_rewards(self) -> Tensor:
        """[N] reward per trajectory for sequence-level estimators: the outcome minus
        ``kl_coef`` x the KL summed over its action tokens."""
        dtype = _out_dtype(self.rewards)
        r = self.rewards.to(dtype)
        if self.token_kl is None or not self.kl_coef:
            return r
        zero = torch.zeros((), dtype=dtype, device=r.device)
        return r - self.kl_coef * torch.where(self.mask, self.token_kl.to(dtype), zero).sum(dim=1)

    def per_token_rewards(self) -> Tensor:
        """[N, T] rewards for token-level estimators, see :func:`token_level_rewards`."""
        return token_level_rewards(self.rewards, self.mask, self.token_kl, self.kl_coef, self.token_rewards)


class Advantages(NamedTuple):
    """What an estimator returns: advantages [N] or [N, T], and for estimators with a critic the
    critic's regression targets [N, T] (else None)."""

    advantages: Tensor
    returns: Tensor | None = None


def _check_inputs(name: str, needs: Needs, x: AdvantageInputs) -> None:
    missing = {
        "critic": (x.values, "critic values (AdvantageInputs.values)"),
        "greedy_baseline": (x.baseline_rewards, "baseline_rewards (the greedy completions' rewards)"),
        "correctness": (x.correct, "per-sample correctness (AdvantageInputs.correct)"),
    }
    for need, (value, what) in missing.items():
        if getattr(needs, need) and value is None:
            raise ValueError(f"the {name} estimator needs {what}")
    if x.token_rewards is not None and not needs.token_rewards:
        takers = [n for n in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS.needs(n).token_rewards]
        raise ValueError(
            f"the {name} estimator is sequence-level and does not use per-token rewards; they would be "
            f"dropped. Use an estimator that reads them ({', '.join(takers)}), or leave token_rewards out"
        )


def compute_advantages(estimator: str, inputs: AdvantageInputs) -> Advantages:
    """The advantages of ``inputs`` under the registered estimator ``estimator``
    (``algorithm.advantage``), so that the trainer never branches on a method. Checks first that
    the inputs the estimator declares (critic values, greedy baseline, correctness) are given, and
    that per-token rewards are not handed to an estimator that would ignore them."""
    fn = ADVANTAGE_ESTIMATORS.lookup(estimator)
    _check_inputs(estimator, ADVANTAGE_ESTIMATORS.needs(estimator), inputs)
    advantages, returns = fn(inputs)
    return Advantages(advantages, returns)


# --------------------------------------------------------------------------- the registered estimators


@register_advantage("grpo", group_relative=True)
def grpo_estimator(x: AdvantageInputs) -> Advantages:
    """Group-relative (GRPO / Dr. GRPO / Lite PPO per ``scale``): :func:`group_normalized_advantages`."""
    return Advantages(group_normalized_advantages(x.sequence_rewards(), x.group_index, scale=x.scale, eps=x.eps))


@register_advantage("rloo", group_relative=True)
def rloo_estimator(x: AdvantageInputs) -> Advantages:
    """Leave-one-out baseline: :func:`leave_one_out_advantages`."""
    return Advantages(leave_one_out_advantages(x.sequence_rewards(), x.group_index, scale=x.scale, eps=x.eps))


@register_advantage("remax", needs=Needs(greedy_baseline=True))
def remax_estimator(x: AdvantageInputs) -> Advantages:
    """The greedy completion's reward as baseline (:func:`greedy_baseline_advantages`), divided by
    the samples' reward std per ``scale`` (ReMax itself: "none")."""
    seq = x.sequence_rewards()
    adv = greedy_baseline_advantages(seq, x.group_index, x.baseline_rewards)
    if x.scale != "none":
        r = seq.detach().to(torch.float64)
        g, count, _, _ = _group_stats(r, x.group_index)
        adv = _scale_by_std(adv.to(torch.float64), r, g, count, x.scale, x.eps).to(adv.dtype)
    return Advantages(adv)


@register_advantage("reinforce_pp", needs=Needs(token_rewards=True))
def reinforce_pp_estimator(x: AdvantageInputs) -> Advantages:
    """Returns-to-go whitened over the batch: :func:`reinforce_pp_advantages`."""
    return Advantages(reinforce_pp_advantages(x.per_token_rewards(), x.mask, gamma=x.gamma))


@register_advantage("reinforce_pp_baseline", needs=Needs(token_rewards=True), group_relative=True)
def reinforce_pp_baseline_estimator(x: AdvantageInputs) -> Advantages:
    """Group-mean baseline on the sequence return, then batch whitening."""
    return Advantages(reinforce_pp_advantages(x.per_token_rewards(), x.mask, gamma=x.gamma, group_index=x.group_index))


@register_advantage("gae", needs=Needs(critic=True, token_rewards=True))
def gae_estimator(x: AdvantageInputs) -> Advantages:
    """GAE with the critic's values (:func:`gae_advantages`), whitened over the batch's action
    tokens in float64 when ``whiten``; returns are the critic's targets."""
    tok = x.per_token_rewards()
    adv, returns = _gae64(tok, x.values, x.mask, x.gamma, x.lam)
    if x.whiten:
        adv = masked_whiten(adv, x.mask)
    out = _out_dtype(tok)
    return Advantages(adv.to(out), returns.to(out))


@register_advantage("passk", needs=Needs(correctness=True), group_relative=True)
def passk_estimator(x: AdvantageInputs) -> Advantages:
    """The pass@k objective's advantages from correctness: :func:`passk_advantages`."""
    return Advantages(passk_advantages(x.correct, x.group_index, x.passk_k, eps=x.eps))


@register_advantage("opo", group_relative=True)
def opo_estimator(x: AdvantageInputs) -> Advantages:
    """OPO's length-weighted group baseline ("On-Policy RL with Optimal Reward Baseline", Hao et al.,
    2025, arXiv:2505.23585): :func:`optimal_baseline_advantages`, lengths = action tokens."""
    lengths = x.mask.sum(dim=1)
    return Advantages(optimal_baseline_advantages(x.sequence_rewards(), x.group_index, lengths, scale=x.scale,
                                                  eps=x.eps))


@register_advantage("gpg", group_relative=True)
def gpg_estimator(x: AdvantageInputs) -> Advantages:
    """GPG's group-mean advantage times N / N_valid ("GPG: A Simple and Strong Reinforcement Learning
    Baseline for Model Reasoning", Chu et al., 2025, arXiv:2504.02546): :func:`gpg_advantages`."""
    return Advantages(gpg_advantages(x.sequence_rewards(), x.group_index, scale=x.scale, eps=x.eps))
