"""Credit assignment from step scores (reinforge/algorithms/credit.py) against values computed by hand."""

import math

import pytest
import torch

from reinforge.algorithms import (
    CREDIT_RULES,
    AdvantageInputs,
    compute_advantages,
    credit_options,
    implicit_prm_loss,
    implicit_process_rewards,
    min_form_credit,
    outcome_process_mixture,
    step_returns,
    sum_form_credit,
)

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def test_rules_are_registered_with_their_options():
    assert {"sum", "min"} <= set(CREDIT_RULES)
    assert credit_options("sum") == ("gamma",) and credit_options("min") == ("temperature",)
    with pytest.raises(ValueError, match="accepted: .*sum"):
        CREDIT_RULES.lookup("max")


def test_sum_form_undiscounted_is_the_scores_themselves():
    s, m = t([[0.5, -1.0, 1.0]]), torch.tensor([[True, True, True]])
    assert sum_form_credit(s, m, gamma=1.0).tolist() == [[0.5, -1.0, 1.0]]
    assert step_returns(s, m).tolist() == [[0.5, 0.0, 1.0]]  # 0.5 - 1 + 1, -1 + 1, 1


def test_sum_form_discounted_by_hand():
    # G_3 = 1, G_2 = -1 + 0.5 * 1 = -0.5, G_1 = 0.5 + 0.5 * -0.5 = 0.25; r'_k = G_k - G_{k+1}.
    s = t([[0.5, -1.0, 1.0], [0.2, 0.8, 9.0]])
    m = torch.tensor([[True, True, True], [True, True, False]])  # row 2: two steps, then padding
    r = sum_form_credit(s, m, gamma=0.5)
    # row 2 by hand: G_2 = 0.8, G_1 = 0.2 + 0.5 * 0.8 = 0.6; r' = [0.6 - 0.8, 0.8] = [-0.2, 0.8]
    assert torch.allclose(r, t([[0.75, -1.5, 1.0], [-0.2, 0.8, 0.0]]))
    # the undiscounted sum of the rewards gives back the discounted returns
    assert torch.allclose(step_returns(r, m), t([[0.25, -0.5, 1.0], [0.6, 0.8, 0.0]]))
    with pytest.raises(ValueError, match="gamma"):
        sum_form_credit(s, m, gamma=1.5)


def test_min_form_by_hand():
    s, m = t([[0.5, -1.0, 1.0]]), torch.tensor([[True, True, True]])
    e = [math.exp(-0.5), math.exp(1.0), math.exp(-1.0)]  # exp(-s/T) with T = 1
    w = [x / sum(e) for x in e]
    expected = [w[0] * 0.5, w[1] * -1.0, w[2] * 1.0]
    got = min_form_credit(s, m, temperature=1.0)
    assert torch.allclose(got, t([expected]))
    # The first step's return is the softmax-weighted minimum: close to min as T -> 0 ...
    assert step_returns(min_form_credit(s, m, temperature=0.01), m)[0, 0].item() == pytest.approx(-1.0, abs=1e-6)
    # ... the mean as T -> inf
    assert step_returns(min_form_credit(s, m, temperature=1e6), m)[0, 0].item() == pytest.approx((0.5 - 1.0 + 1.0) / 3, abs=1e-5)


def test_min_form_ignores_padding_and_cannot_be_raised_by_adding_good_steps():
    m2 = torch.tensor([[True, True, False]])
    r = min_form_credit(t([[0.2, 0.9, -5.0]]), m2, temperature=0.1)
    e = [math.exp(-2.0), math.exp(-9.0)]
    assert torch.allclose(r, t([[e[0] / sum(e) * 0.2, e[1] / sum(e) * 0.9, 0.0]]))
    # The sum form grows with every extra good step; the min form stays at the worst one.
    short, long_ = t([[0.1, 0.9]]), t([[0.1, 0.9, 0.9, 0.9, 0.9]])
    ms, ml = torch.ones_like(short, dtype=torch.bool), torch.ones_like(long_, dtype=torch.bool)
    assert step_returns(sum_form_credit(long_, ml), ml)[0, 0].item() == pytest.approx(3.7)  # 0.1 + 4 x 0.9
    assert step_returns(sum_form_credit(short, ms), ms)[0, 0].item() == pytest.approx(1.0)
    a = step_returns(min_form_credit(short, ms, temperature=0.05), ms)[0, 0]
    b = step_returns(min_form_credit(long_, ml, temperature=0.05), ml)[0, 0]
    assert a == pytest.approx(0.1, abs=1e-6) and b == pytest.approx(0.1, abs=1e-5)
    # a row without steps gets nothing (no NaN from an empty softmax)
    assert min_form_credit(t([[0.0, 0.0]]), torch.tensor([[False, False]])).tolist() == [[0.0, 0.0]]


def test_outcome_process_mixture_by_hand():
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    process = t([[0.0, 0.3, -0.2, 7.0], [0.5, 0.0, 0.0, 0.0]])
    out = outcome_process_mixture(t([1.0, 0.0]), process, mask, outcome_weight=2.0, process_weight=0.5)
    # outcome x 2 on the last action token, process x 0.5 on the mask, padding 0
    assert torch.allclose(out, t([[0.0, 0.15, -0.1 + 2.0, 0.0], [0.25, 0.0, 0.0, 0.0]]))


def test_implicit_process_rewards_and_loss_by_hand():
    lp_phi = t([[-1.0, -2.0, -0.5], [-0.2, -0.1, 0.0]])
    lp_ref = t([[-1.5, -1.0, -0.5], [-0.4, -0.1, -3.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    r = implicit_process_rewards(lp_phi, lp_ref, mask, beta=0.1)
    assert torch.allclose(r, t([[0.05, -0.1, 0.0], [0.02, 0.0, 0.0]]))
    # z_i = beta * sum_t log-ratio: z_1 = -0.05, z_2 = 0.02; labels 1 and 0.
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    expected = -(math.log(sig(-0.05)) + math.log(1 - sig(0.02))) / 2
    loss = implicit_prm_loss(lp_phi, lp_ref, mask, t([1.0, 0.0]), beta=0.1)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    # the gradient pushes the correct trajectory's log-probs up and the wrong one's down
    x = lp_phi.clone().requires_grad_(True)
    implicit_prm_loss(x, lp_ref, mask, t([1.0, 0.0]), beta=0.1).backward()
    assert (x.grad[0, :3] < 0).all() and (x.grad[1, :2] > 0).all() and x.grad[1, 2] == 0


def test_step_credit_reaches_reinforce_pp_as_token_rewards():
    # Two rows, step rewards on the step-end tokens 1 and 3: REINFORCE++'s returns (gamma = 1)
    # give every token of a step that step's return (plus the outcome at the end).
    mask = torch.ones(2, 4, dtype=torch.bool)
    steps = min_form_credit(t([[0.9, 0.1], [0.9, 0.9]]), torch.ones(2, 2, dtype=torch.bool), temperature=0.1)
    tokens = torch.zeros(2, 4, dtype=F64)
    tokens[:, 1], tokens[:, 3] = steps[:, 0], steps[:, 1]
    x = AdvantageInputs(rewards=t([0.0, 0.0]), group_index=torch.tensor([0, 0]), mask=mask, token_rewards=tokens, gamma=1.0)
    adv = compute_advantages("reinforce_pp", x).advantages
    returns = tokens.flip(1).cumsum(1).flip(1)
    expected = (returns - returns.mean()) / torch.sqrt(returns.var() + 1e-8)
    assert torch.allclose(adv, expected)
    assert adv[1, 0] > adv[0, 0]  # the trajectory with a bad step is worth less from its start
