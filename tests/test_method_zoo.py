"""The method zoo's components, checked against numbers computed by hand (arithmetic in the
comments), with padding, all-equal groups, single-sample groups and truncated completions; and
the identities between methods. Gradients are checked where a method is defined by its gradient."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from reinforge.algorithms import (
    AdvantageInputs,
    aggregate_loss,
    cispo_loss,
    clipped_surrogate_loss,
    compute_advantages,
    covariance_token_selection,
    entropy_from_logits,
    gae_advantages,
    greedy_baseline_advantages,
    group_normalized_advantages,
    gspo_loss,
    informative_groups,
    leave_one_out_advantages,
    masked_whiten,
    passk_advantages,
    reinforce_loss,
    reinforce_pp_advantages,
    token_level_rewards,
    truncated_importance_weights,
    value_loss,
)
from reinforge.batch import RolloutBatch, TrainBatch, concat_rollouts
from reinforge.rewards.shaping import soft_overlong_penalty

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def close(a, b, atol=1e-9):
    b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=a.dtype)
    return torch.allclose(a.to(F64), b.to(F64), atol=atol, rtol=0)


def _mean_std(xs):
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


# --------------------------------------------------------------------------- advantages


def test_batch_std_scaling_lite_ppo():
    # groups [1, 0] and [1, 1]: group means 0.5 and 1 -> centred 0.5, -0.5, 0, 0
    # batch std of raw rewards [1, 0, 1, 1]: mean 0.75, squares .0625+.5625+.0625+.0625 = .75,
    # /3 = .25, std .5 -> A = 1, -1, and exactly 0 for the all-equal group
    r = t([1.0, 0.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 1, 1])
    assert close(group_normalized_advantages(r, g, scale="batch", eps=0.0), [1.0, -1.0, 0.0, 0.0])
    assert close(group_normalized_advantages(r, g, scale="none"), [0.5, -0.5, 0.0, 0.0])


def test_rloo_hand_computed_and_edge_groups():
    # one group [1, 0, 0, 1]: sum 2; baseline_i = (2 - r_i)/3 = 1/3, 2/3, 2/3, 1/3
    # A = 1 - 1/3, 0 - 2/3, ... = 2/3, -2/3, -2/3, 2/3
    r = t([1.0, 0.0, 0.0, 1.0])
    assert close(leave_one_out_advantages(r, torch.zeros(4, dtype=torch.long)), [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # an all-equal group (0.1 x3, whose float sum leaves a residue) and a single-sample group: exactly 0
    r = t([0.1, 0.1, 0.1, 5.0], dtype=torch.float32)
    a = leave_one_out_advantages(r, torch.tensor([0, 0, 0, 1]))
    assert torch.equal(a, torch.zeros(4))


def test_rloo_equals_group_mean_scaled_by_g_over_g_minus_1():
    gen = torch.Generator().manual_seed(0)
    sizes = [2, 3, 5, 8]
    g = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    r = torch.rand(len(g), generator=gen, dtype=F64)
    loo = leave_one_out_advantages(r, g)
    centred = group_normalized_advantages(r, g, scale="none")
    factor = torch.cat([torch.full((n,), n / (n - 1), dtype=F64) for n in sizes])
    assert close(loo, centred * factor, atol=1e-12)


def test_remax_greedy_baseline():
    # prompt 0 greedy reward 1: samples 1, 0 -> 0, -1; prompt 1 greedy reward 0: sample 1 -> 1
    a = greedy_baseline_advantages(t([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), t([1.0, 0.0]))
    assert close(a, [0.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="one greedy reward per prompt"):
        greedy_baseline_advantages(t([1.0]), torch.tensor([3]), t([1.0]))
    # through the dispatcher, with group-std scaling of the raw rewards
    a, _ = compute_advantages("remax", AdvantageInputs(rewards=t([1.0, 0.0]), group_index=torch.tensor([0, 0]),
                              mask=torch.ones(2, 1, dtype=torch.bool), scale="none", baseline_rewards=t([0.5])))
    assert close(a, [0.5, -0.5])


MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)  # a padded row and a 1-token row
KL = t([[0.1, 0.2, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0]])  # 9.0 on padding must never leak


def test_token_level_rewards_outcome_on_last_token_minus_kl():
    # row 0: reward 2 on token 2; row 1: reward 3 on token 0; KL x 0.5 subtracted on real tokens
    out = token_level_rewards(t([2.0, 3.0]), MASK, KL, kl_coef=0.5)
    assert close(out, [[-0.05, -0.1, 2 - 0.15, 0.0], [3 - 0.25, 0.0, 0.0, 0.0]])
    # an empty completion gets no reward token (nothing to credit)
    empty = token_level_rewards(t([1.0]), torch.zeros(1, 3, dtype=torch.bool))
    assert torch.equal(empty, torch.zeros(1, 3, dtype=F64))


def test_reinforce_pp_returns_whitened_over_batch_tokens():
    tok = token_level_rewards(t([2.0, 3.0]), MASK, KL, kl_coef=0.5)
    # returns to go (gamma 1): row 0: -.05-.1+1.85 = 1.7, -.1+1.85 = 1.75, 1.85; row 1: 2.75
    returns = [1.7, 1.75, 1.85, 2.75]
    m, s = _mean_std(returns)  # 2.0125, sqrt(.736875/3) = 0.4956...
    expect = [[(x - m) / s for x in returns[:3]] + [0.0], [(returns[3] - m) / s, 0.0, 0.0, 0.0]]
    assert close(reinforce_pp_advantages(tok, MASK, eps=0.0), expect, atol=1e-9)
    # gamma 0.5 on row 0: 1.85; -.1 + .5*1.85 = .825; -.05 + .5*.825 = .3625
    returns = [0.3625, 0.825, 1.85, 2.75]
    m, s = _mean_std(returns)
    adv = reinforce_pp_advantages(tok, MASK, gamma=0.5, eps=0.0)
    assert close(adv[0, :3], [(x - m) / s for x in returns[:3]])


def test_reinforce_pp_baseline_group_mean_then_whiten():
    tok = token_level_rewards(t([2.0, 3.0]), MASK, KL, kl_coef=0.5)
    # sequence returns 1.7 and 2.75, one group: mean 2.225 -> -.525 (x3 tokens), +.525 (x1 token)
    vals = [-0.525] * 3 + [0.525]
    m, s = _mean_std(vals)
    adv = reinforce_pp_advantages(tok, MASK, group_index=torch.tensor([0, 0]), eps=0.0)
    assert close(adv[0, :3], [(-0.525 - m) / s] * 3) and close(adv[1, :1], [(0.525 - m) / s])
    assert torch.equal(adv[MASK.logical_not()], torch.zeros(4, dtype=F64))


def test_gae_hand_computed():
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    r = t([[0.0, 0.0, 1.0, 7.0]])  # 7 on padding is ignored
    v = t([[0.5, 0.6, 0.7, 9.0]])
    # gamma=lam=1: deltas .1, .1, .3 -> A = .5, .4, .3; returns = A + V = 1, 1, 1 (the outcome)
    adv, ret = gae_advantages(r, v, mask)
    assert close(adv, [[0.5, 0.4, 0.3, 0.0]]) and close(ret, [[1.0, 1.0, 1.0, 0.0]])
    # gamma .9, lam .5: deltas t2 = 1 - .7 = .3; t1 = .9*.7 - .6 = .03; t0 = .9*.6 - .5 = .04
    # A t2 = .3; t1 = .03 + .45*.3 = .165; t0 = .04 + .45*.165 = .11425
    adv, ret = gae_advantages(r, v, mask, gamma=0.9, lam=0.5)
    assert close(adv, [[0.11425, 0.165, 0.3, 0.0]])
    assert close(ret, [[0.61425, 0.765, 1.0, 0.0]])


def test_gae_truncated_completion_bootstraps_nothing_past_the_end():
    # a truncated completion (mask full to T) gets V_T = 0: its last delta is r - V
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv, _ = gae_advantages(t([[0.0, 0.0]]), t([[0.2, 0.4]]), mask)
    assert close(adv, [[-0.2, -0.4]])  # deltas: 0 + .4 - .2 = .2; 0 - .4 = -.4 -> A0 = .2 - .4


def test_passk_hand_computed():
    # n=4, one correct, k=2: R = 1 - C(3,2)/C(4,2) = 1 - 3/6 = .5, std .5
    # A_pos = .5/.5 = 1; A_neg = (1 - .5 - C(2,1)/C(3,1)) / .5 = (.5 - 2/3)/.5 = -1/3
    a = passk_advantages(t([1, 0, 0, 0]), torch.zeros(4, dtype=torch.long), 2, eps=0.0)
    assert close(a, [1.0, -1 / 3, -1 / 3, -1 / 3], atol=1e-6)


def _passk_brute_force(correct: list[int], k: int) -> list[float]:
    n = len(correct)
    subsets = list(itertools.combinations(range(n), k))
    rewards = {s: float(any(correct[i] for i in s)) for s in subsets}
    mean = sum(rewards.values()) / len(subsets)
    std = math.sqrt(mean * (1 - mean))
    if std == 0:
        return [0.0] * n
    return [sum((rewards[s] - mean) / std for s in subsets if i in s) / sum(1 for s in subsets if i in s)
            for i in range(n)]


@pytest.mark.parametrize("correct,k", [([1, 0, 0, 0, 0, 1], 2), ([0, 1, 0, 0, 0, 0, 0, 0], 3),
                                       ([1, 1, 0, 0, 1], 4), ([0, 0, 0], 2), ([1, 1, 0, 0], 3)])
def test_passk_equals_brute_force_over_k_subsets(correct, k):
    a = passk_advantages(t(correct), torch.zeros(len(correct), dtype=torch.long), k, eps=0.0)
    assert close(a, _passk_brute_force(correct, k), atol=1e-6)


def test_passk_k1_is_grpo_with_population_std_and_small_groups_fail_clearly():
    c = t([1, 0, 0, 1, 1, 0])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    grpo = group_normalized_advantages(c, g, scale="none")
    pop_std = torch.tensor([math.sqrt(1 / 3 * 2 / 3)] * 3 + [math.sqrt(2 / 3 * 1 / 3)] * 3, dtype=F64)
    assert close(passk_advantages(c, g, 1, eps=0.0), grpo / pop_std, atol=1e-6)
    with pytest.raises(ValueError, match="rollout.num_samples"):
        passk_advantages(t([1, 0]), torch.zeros(2, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="binary"):
        passk_advantages(t([0.5, 0]), torch.zeros(2, dtype=torch.long), 1)


def test_informative_groups_and_masked_whiten():
    r = t([1.0, 1.0, 0.0, 1.0, 2.0])
    assert informative_groups(r, torch.tensor([0, 0, 1, 1, 2])).tolist() == [False, True, False]
    # whiten [1, 2, 3] (mean 2, std 1) with a padded 99
    w = masked_whiten(t([[1.0, 2.0], [3.0, 99.0]]), torch.tensor([[1, 1], [1, 0]], dtype=torch.bool), eps=0.0)
    assert close(w, [[-1.0, 0.0], [1.0, 0.0]])


def test_kl_in_reward_is_summed_for_sequence_estimators():
    # grpo with KL in the reward: sequence rewards 2 - .5*.6 = 1.7 and 3 - .5*.5 = 2.75 -> centred +-.525
    a, ret = compute_advantages("grpo", AdvantageInputs(rewards=t([2.0, 3.0]), group_index=torch.tensor([0, 0]),
                                                        mask=MASK, scale="none", token_kl=KL, kl_coef=0.5))
    assert ret is None and close(a, [-0.525, 0.525])
    one = AdvantageInputs(rewards=t([1.0]), group_index=torch.tensor([0]), mask=MASK[:1])
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages("nope", one)
    with pytest.raises(ValueError, match="critic values"):
        compute_advantages("gae", one)


# --------------------------------------------------------------------------- policy losses


def test_dual_clip_caps_negative_advantage_loss():
    # ratio 5 (log 5): A = -1: PPO loss max(5, 1.2) = 5; dual clip c=3 -> min(5, 3) = 3
    # A = +1: -min(5, 1.2) = -1.2, dual clip does not touch positive advantages
    lp = t([[math.log(5.0), math.log(5.0)]])
    old = t([[0.0, 0.0]])
    adv = t([[-1.0, 1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    plain, _ = clipped_surrogate_loss(lp, old, adv, mask)
    dual, _ = clipped_surrogate_loss(lp, old, adv, mask, dual_clip=3.0)
    assert close(plain, [[5.0, -1.2]]) and close(dual, [[3.0, -1.2]])
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate_loss(lp, old, adv, mask, dual_clip=0.5)


def test_gspo_sequence_ratio_value_and_gradient():
    # row 0: token log-ratios .2, -.4 -> mean -.1 -> s = exp(-.1) = 0.904837418; A = 1
    # clip range [1-3e-4, 1+4e-4]: min(s*A, .9997*A) = s -> loss per token -s
    # row 1 (padded, 1 real token): log-ratio 5e-4 -> s = 1.000500125 > 1.0004, A = 1 -> clipped: loss -1.0004
    old = t([[-1.0, -1.0], [-2.0, 0.0]])
    lp = (old + t([[0.2, -0.4], [5e-4, 3.0]])).requires_grad_(True)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    per_token, stats = gspo_loss(lp, old, t([1.0, 1.0]), mask)
    s = math.exp(-0.1)
    assert close(per_token.detach(), [[-s, -s], [-1.0004, 0.0]], atol=1e-9)
    assert stats["clip_fraction"].item() == pytest.approx(1 / 3)
    # GSPO's gradient: d/dlp_t of -(s * A) for row 0 is -s * A / len = -s/2; the clipped row gets none
    loss = aggregate_loss(per_token, mask, "seq_mean_token_mean")
    loss.backward()
    assert close(lp.grad, [[-s / 2 / 2, -s / 2 / 2], [0.0, 0.0]], atol=1e-9)  # /2 sequences
    # and it equals differentiating the sequence-level objective itself
    lp2 = lp.detach().clone().requires_grad_(True)
    seq = -torch.exp(((lp2 - old) * mask).sum(1) / mask.sum(1))[0] * 1.0 / 2
    seq.backward()
    assert close(lp.grad[0], lp2.grad[0], atol=1e-12)


def test_cispo_keeps_gradient_of_clipped_tokens():
    # token 0: ratio e^.5 = 1.6487 > 1.28 -> weight 1.28; A = 2; logp = -1 -> loss -1.28*2*(-1) = 2.56
    # token 1: ratio .5, no lower bound (eps_low = 1) -> weight .5; loss -.5*2*(-3) = 3
    # gradients: -w*A = -2.56 and -1.0; padding: 0
    old = t([[-1.5, -3.0 - math.log(0.5), 0.0]])
    lp = t([[-1.0, -3.0, 4.0]]).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    per_token, stats = cispo_loss(lp, old, t([2.0]), mask, clip_eps_low=1.0, clip_eps_high=0.28)
    assert close(per_token.detach(), [[2.56, 3.0, 0.0]])
    per_token.sum().backward()
    assert close(lp.grad, [[-2.56, -1.0, 0.0]])
    assert stats["clip_fraction"].item() == pytest.approx(0.5)  # token 0's weight was clipped


def test_reinforce_is_minus_advantage_times_logprob():
    lp = t([[-1.0, -2.0, 7.0], [-0.5, 0.0, 0.0]]).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    per_token, _ = reinforce_loss(lp, None, t([2.0, -1.0]), mask)
    # -2*-1 = 2, -2*-2 = 4; -(-1)*(-.5) = -.5
    assert close(per_token.detach(), [[2.0, 4.0, 0.0], [-0.5, 0.0, 0.0]])
    per_token.sum().backward()
    assert close(lp.grad, [[-2.0, -2.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize("loss_fn", [clipped_surrogate_loss, cispo_loss])
def test_fresh_samples_gradient_equals_policy_gradient(loss_fn):
    # one epoch on fresh samples: old = current (detached), ratio 1: the gradient of the
    # surrogate (and of CISPO) is the plain policy gradient -A * grad logp
    gen = torch.Generator().manual_seed(1)
    lp = torch.randn(3, 5, generator=gen, dtype=F64).requires_grad_(True)
    adv = torch.randn(3, generator=gen, dtype=F64)
    mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    per_token, _ = loss_fn(lp, lp.detach(), adv, mask)
    aggregate_loss(per_token, mask, "token_mean").backward()
    g1 = lp.grad.clone()
    lp.grad = None
    pg, _ = reinforce_loss(lp, None, adv, mask)
    aggregate_loss(pg, mask, "token_mean").backward()
    assert close(g1, lp.grad, atol=1e-12)


def test_value_loss_clipping_hand_computed():
    # token 0: v 1.5, old .9, R 1: v_clip = 1.1; (1.5-1)^2 = .25 vs (.1)^2 = .01 -> .5*.25 = .125
    # token 1: v .95, old 1.5: v_clip = 1.3; (.05)^2 = .0025 vs (.3)^2 = .09 -> .045 (clipped branch)
    v = t([[1.5, 0.95, 3.0]])
    per_token, stats = value_loss(v, t([[0.9, 1.5, 0.0]]), t([[1.0, 1.0, 0.0]]),
                                  torch.tensor([[1, 1, 0]], dtype=torch.bool), clip_eps=0.2)
    assert close(per_token, [[0.125, 0.045, 0.0]])
    assert stats["vf_clip_fraction"].item() == pytest.approx(0.5)
    plain, _ = value_loss(v, v, t([[1.0, 1.0, 0.0]]), torch.ones(1, 3, dtype=torch.bool), clip_eps=None)
    assert close(plain, [[0.125, 0.00125, 4.5]])  # .5 * (3 - 0)^2 on the third token


def test_entropy_from_logits():
    # uniform over 2: ln 2; p = (.25, .75): -(.25 ln .25 + .75 ln .75) = 0.5623351446
    h = entropy_from_logits(t([[0.0, 0.0], [0.0, math.log(3.0)]]))
    assert close(h, [math.log(2.0), 0.5623351446188083])


def test_truncated_importance_weights_and_mismatch_stats():
    # log diffs .5 and -1: ratios 1.6487 -> capped 1.5, and .3679; padding weight 1
    w, stats = truncated_importance_weights(t([[-1.0, -2.0, 0.0]]), t([[-1.5, -1.0, 5.0]]),
                                            torch.tensor([[1, 1, 0]], dtype=torch.bool), cap=1.5)
    assert close(w, [[1.5, math.exp(-1.0), 1.0]], atol=1e-6)
    assert stats["logprob_diff_mean"] == pytest.approx(0.75)
    assert stats["logprob_diff_max"] == pytest.approx(1.0)
    assert stats["logprob_diff_frac_gt_0.1"] == pytest.approx(1.0)
    assert stats["tis_truncated_frac"] == pytest.approx(0.5)


def test_covariance_selection_hand_computed():
    # logp -1, -2 | -3, -4 (mean -2.5) -> centred 1.5, .5, -.5, -1.5; A = 1 | -1 (mean 0)
    # cov = 1.5, .5, .5, 1.5
    lp = t([[-1.0, -2.0], [-3.0, -4.0]])
    adv = t([1.0, -1.0])
    mask = torch.ones(2, 2, dtype=torch.bool)
    kl = covariance_token_selection(lp, adv, mask, "kl_cov", ratio=0.5)  # top 2 by covariance
    assert kl.tolist() == [[True, False], [False, True]]
    gen = torch.Generator().manual_seed(0)
    clip = covariance_token_selection(lp, adv, mask, "clip_cov", ratio=0.25, bounds=(1.0, 5.0), generator=gen)
    assert clip.sum() == 1 and (clip & kl).sum() == 1  # one of the two tokens with cov in (1, 5)
    none = covariance_token_selection(lp, adv, mask, "clip_cov", ratio=0.25, bounds=(2.0, 5.0))
    assert not none.any()
    padded = covariance_token_selection(lp, adv, torch.tensor([[1, 0], [0, 0]], dtype=torch.bool), "kl_cov", ratio=1.0)
    assert padded.tolist() == [[True, False], [False, False]]


def test_soft_overlong_penalty_hand_computed():
    # L_max 10, buffer 4 -> free up to 6; 8 -> (6-8)/4 = -.5; 10 -> -1; beyond -> -1
    p = soft_overlong_penalty(torch.tensor([5, 6, 8, 10, 11]), 10, 4)
    assert close(p, [0.0, 0.0, -0.5, -1.0, -1.0])
    with pytest.raises(ValueError, match="overlong buffer"):
        soft_overlong_penalty(torch.tensor([1]), 10, 11)


def test_dr_grpo_loss_does_not_depend_on_padding_columns():
    gen = torch.Generator().manual_seed(2)
    lp = torch.randn(3, 4, generator=gen, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    adv = torch.randn(3, generator=gen, dtype=F64)
    constant = 3 * 16.0  # sequences x max_new_tokens, the same whatever the padded width
    losses = []
    for extra in (0, 5, 12):
        lp_p = torch.cat([lp, torch.full((3, extra), 123.0, dtype=F64)], 1)
        m_p = torch.cat([mask, torch.zeros(3, extra, dtype=torch.bool)], 1)
        per_token, _ = clipped_surrogate_loss(lp_p, lp_p - 0.1, adv, m_p)
        losses.append(aggregate_loss(per_token, m_p, "token_sum_norm", num_tokens=constant))
    assert losses[0] == losses[1] == losses[2]


# --------------------------------------------------------------------------- batches


def _rollout(n_groups, g, p_width, c_lens, offset=0):
    n = n_groups * g
    cw = max(c_lens)
    c_mask = torch.tensor([[i < c for i in range(cw)] for c in c_lens])
    return RolloutBatch(
        prompt_ids=torch.arange(n * p_width).view(n, p_width) + offset,
        prompt_mask=torch.ones(n, p_width, dtype=torch.bool),
        completion_ids=torch.where(c_mask, torch.arange(n * cw).view(n, cw) + 1000 + offset, torch.zeros((), dtype=torch.long)),
        completion_mask=c_mask,
        sampler_logprobs=torch.where(c_mask, -torch.ones(n, cw), torch.zeros(n, cw)),
        truncated=torch.tensor([c == cw for c in c_lens]),
        group_index=torch.arange(n_groups).repeat_interleave(g),
        texts=[f"t{offset + i}" for i in range(n)],
    )


def test_concat_and_select_keep_rows_aligned():
    a = _rollout(2, 2, 3, [1, 2, 2, 1])
    b = _rollout(1, 2, 5, [4, 1], offset=500)
    c = concat_rollouts([a, b], pad_id=0)
    assert c.prompt_ids.shape == (6, 5) and c.completion_ids.shape == (6, 4)
    assert c.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert not c.prompt_mask[0, :2].any() and c.prompt_mask[0, 2:].all()  # re-left-padded
    assert torch.equal(c.completion_ids[4], b.completion_ids[0])
    assert c.texts[4] == "t500"
    sel = c.select(torch.tensor([2, 3, 5]))  # group 1 and half of group 2
    assert sel.group_index.tolist() == [0, 0, 1]
    assert sel.completion_ids.shape[1] == 2 and sel.prompt_ids.shape[1] == 5
    assert sel.texts == ["t2", "t3", "t501"]
    tb = TrainBatch(rollout=c, advantages=torch.arange(6.0), loss_mask=c.completion_mask,
                    returns=torch.ones(6, 4))
    sub = tb.select(torch.tensor([4, 5]))
    assert sub.advantages.tolist() == [4.0, 5.0] and sub.returns.shape == (2, 4)
