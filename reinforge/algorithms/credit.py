"""Credit assignment from step scores: a process reward model's per-step scores in, per-step
rewards out. Pure tensor functions (imports only torch).

Shapes: N trajectories, S steps (right-padded), ``step_mask`` [N, S] bool True on real steps.

Every rule returns step rewards ``r'`` [N, S] (0 on padding) that a return-to-go estimator sums
back up: with an undiscounted sum (``algorithm.gamma=1``, as REINFORCE++ and GAE with
``gamma=lam=1`` compute), the return at step k, ``sum_{j>=k} r'_j``, is the return the rule
defines. The reward side places each step's reward on the step's last token (``Scores.token_rewards``);
every token of a step then sees the step's return.

Rules are registered by the name ``reward.verifiers[].options.credit`` takes::

    @register_credit("my_rule")
    def my_rule(scores: Tensor, step_mask: Tensor, *, my_option: float = 1.0) -> Tensor: ...

Options of a rule are its keyword arguments (``credit_options``), so a config naming an unknown
one is refused with the accepted list.

PRIME's implicit process reward (token rewards from a model's log-ratio, Cui et al. 2025) and the
outcome + process mixture work on tokens, not steps; they are the two functions at the end.
"""

from __future__ import annotations


import torch
from torch import Tensor

from reinforge.algorithms.advantages import token_level_rewards
from reinforge.algorithms.registry import Registry

__all__ = [
    "CREDIT_RULES",
    "register_credit",
    "credit_options",
    "step_returns",
    "sum_form_credit",
    "min_form_credit",
    "outcome_process_mixture",
    "implicit_process_rewards",
    "implicit_prm_loss",
]

#: Every credit-assignment rule, by its ``credit`` option name.
CREDIT_RULES = Registry("credit assignment rule", "reward.verifiers[].options.credit")


def register_credit(name: str):
    """Decorator: register ``fn(scores [N, S], step_mask [N, S], **options) -> [N, S]`` as the
    credit rule ``name``."""
    return CREDIT_RULES.register(name)


def credit_options(name: str) -> tuple[str, ...]:
    """The option names (keyword arguments) the rule ``name`` accepts."""
    fn = CREDIT_RULES.lookup(name)
    code = fn.__code__  # keyword-only names follow the positional ones (no inspect: algorithms import only torch)
    return code.co_varnames[code.co_argcount: code.co_argcount + code.co_kwonlyargcount]


def _check(scores: Tensor, step_mask: Tensor) -> tuple[Tensor, Tensor]:
    if scores.dim() != 2 or step_mask.shape != scores.shape:
        raise ValueError(f"scores and step_mask must both be [N, S]; got {tuple(scores.shape)} and "
                         f"{tuple(step_mask.shape)}")
    return scores.detach().to(torch.float64), step_mask.bool()


def step_returns(step_rewards: Tensor, step_mask: Tensor) -> Tensor:
    """[N, S] undiscounted return-to-go over the real steps, ``G_k = sum_{j>=k} r_j`` (0 on
    padding): what an estimator with ``gamma=1`` makes of the step rewards of any rule here."""
    r, mask = _check(step_rewards, step_mask)
    r = torch.where(mask, r, torch.zeros_like(r))
    out = r.flip(1).cumsum(1).flip(1)
    return torch.where(mask, out, torch.zeros_like(out)).to(step_rewards.dtype)


@register_credit("sum")
def sum_form_credit(scores: Tensor, step_mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """Sum-form (discounted) credit: step k's return is ``G_k = sum_{j>=k} gamma^(j-k) s_j``, the
    usual RL return over steps (as Math-Shepherd, Wang et al. 2024, arXiv:2312.08935, feed step
    rewards to PPO). Returned as ``r'_k = G_k - G_{k+1}`` (``G`` after the last step is 0), so an
    undiscounted sum recovers ``G_k``; with ``gamma=1``, ``r' = s``. The discount counts steps,
    not tokens.

    "Stop Summation: Min-Form Credit Assignment Is All Process Reward Model Needs for Reasoning"
    (Cheng et al., 2025, arXiv:2504.15275) show this form is easily hacked: the policy learns to
    write many steps the PRM scores positively."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"credit gamma must be in [0, 1], got {gamma}")
    s, mask = _check(scores, step_mask)
    n, S = s.shape
    returns = torch.zeros_like(s)
    running = torch.zeros(n, dtype=s.dtype, device=s.device)
    for k in range(S - 1, -1, -1):
        running = torch.where(mask[:, k], s[:, k] + gamma * running, running)
        returns[:, k] = torch.where(mask[:, k], running, torch.zeros_like(running))
    nxt = torch.zeros_like(returns)
    nxt[:, :-1] = returns[:, 1:]
    out = torch.where(mask, returns - nxt, torch.zeros_like(s))
    return out.to(scores.dtype if scores.is_floating_point() else torch.float32)


@register_credit("min")
def min_form_credit(scores: Tensor, step_mask: Tensor, *, temperature: float = 0.1) -> Tensor:
    """Min-form credit (PURE: "Stop Summation: Min-Form Credit Assignment Is All Process Reward
    Model Needs for Reasoning", Cheng et al., 2025, arXiv:2504.15275): a trajectory is worth its
    worst step, not the sum of its steps. Each step score is weighted by a softmax over the
    negated scores of the trajectory's steps::

        w_k  = exp(-s_k / T) / sum_j exp(-s_j / T)
        r'_k = w_k * s_k

    so the return of the first step, ``sum_k w_k s_k``, is a softmax-weighted minimum: the minimum
    as ``T -> 0``, the mean as ``T -> inf``. Adding steps cannot raise it beyond the worst step,
    which is what stops the "many good-looking steps" hack of the sum form. PURE uses T = 0.1."""
    if temperature <= 0:
        raise ValueError(f"credit temperature must be > 0, got {temperature}")
    s, mask = _check(scores, step_mask)
    logits = torch.where(mask, -s / temperature, torch.full_like(s, -torch.inf))
    has = mask.any(dim=1, keepdim=True)
    w = torch.softmax(torch.where(has, logits, torch.zeros_like(logits)), dim=1)
    out = torch.where(mask, w * s, torch.zeros_like(s))
    return out.to(scores.dtype if scores.is_floating_point() else torch.float32)


def outcome_process_mixture(
    outcome: Tensor, process: Tensor, mask: Tensor, *, outcome_weight: float = 1.0, process_weight: float = 1.0
) -> Tensor:
    """Token rewards [N, T] mixing an outcome reward with process token rewards::

        r_t = outcome_weight * outcome * [t is the last action token] + process_weight * process_t

    (0 off the action ``mask``). This is what the reward side computes when a correctness verifier
    (weight ``outcome_weight``) and a PRM verifier (weight ``process_weight``) are composed:
    the outcome reaches the estimator on the last token, the PRM's credit on each step's last
    token. PURE (Cheng et al., 2025, arXiv:2504.15275) found a small share of verifiable outcome
    reward next to the PRM's (their "mix", 10% of the prompts with verifiable rewards) what kept
    PRM training from collapsing; Math-Shepherd (Wang et al., 2024, arXiv:2312.08935) trained
    with step rewards plus the outcome too."""
    return token_level_rewards(outcome_weight * outcome, mask, token_rewards=process_weight * process)


def implicit_process_rewards(prm_logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, *, beta: float) -> Tensor:
    """PRIME's implicit process reward per token ("Process Reinforcement through Implicit Rewards",
    Cui et al., 2025, arXiv:2502.01456; the implicit PRM of "Free Process Rewards without Process
    Labels", Yuan et al., 2024, arXiv:2412.01981)::

        r_t = beta * (log pi_phi(y_t | y_<t) - log pi_ref(y_t | y_<t))

    for the implicit PRM ``pi_phi`` (a causal LM) and its frozen reference; 0 off ``mask``."""
    mask = mask.bool()
    diff = (prm_logprobs.to(torch.float64) - ref_logprobs.to(torch.float64)) * beta
    return torch.where(mask, diff, torch.zeros_like(diff)).to(prm_logprobs.dtype)


def implicit_prm_loss(prm_logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, labels: Tensor, *, beta: float) -> Tensor:
    """PRIME's cross-entropy loss for updating the implicit PRM online from outcome labels (Cui et
    al., 2025, arXiv:2502.01456, eq. for L_CE): the sequence's implicit outcome logit is the sum of
    its token rewards, ``z = beta * sum_t log(pi_phi / pi_ref)``, and::

        L = -mean_i [ y_i log sigmoid(z_i) + (1 - y_i) log(1 - sigmoid(z_i)) ]

    with ``y`` the verifier's 0/1 outcome of each trajectory. Differentiable in ``prm_logprobs``."""
    mask = mask.bool()
    if labels.dim() != 1 or labels.shape[0] != mask.shape[0]:
        raise ValueError(f"labels must be [N] with N = {mask.shape[0]}; got {tuple(labels.shape)}")
    diff = torch.where(mask, prm_logprobs - ref_logprobs.detach(), torch.zeros_like(prm_logprobs))
    z = beta * diff.sum(dim=1)
    return torch.nn.functional.binary_cross_entropy_with_logits(z, labels.to(z.dtype))
