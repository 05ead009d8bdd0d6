"""Issue 30: the five departures from verl closed or kept on purpose, and the new components (OPO,
GPG, SAPO, GMPO, DPPO, DRO, the k3+ and abs KL estimators), each checked on numbers computed by
hand (arithmetic in the comments) and, where verl has it, against verl's published formula
re-derived here in a few lines of torch (``_verl_*``; written from verl's core_algos and the
papers, not imported)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from reinforge.algorithms import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    aggregate_loss,
    clip_cov_candidates,
    compute_advantages,
    covariance_token_selection,
    dppo_kl_loss,
    dppo_tv_loss,
    dro_loss,
    gmpo_loss,
    gpg_advantages,
    gpg_loss,
    gspo_loss,
    is_advantage_weighted,
    is_group_relative,
    kl_penalty,
    masked_whiten,
    optimal_baseline_advantages,
    policy_loss,
    policy_loss_options,
    sapo_loss,
)
from reinforge.config import AlgorithmConfig, LearnerConfig, build_config
from reinforge.learner import Learner

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


def close(a, b, atol=1e-9):
    b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=a.dtype)
    return torch.allclose(a, b.to(a.dtype), atol=atol, rtol=0)


def _random_case(seed, n=6, length=5, spread=0.5):
    """Log-probs, old log-probs (a moved policy), token-level advantages and a ragged mask."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, length, generator=g, dtype=F64) * 3 - 0.05
    lp = old + spread * torch.randn(n, length, generator=g, dtype=F64)
    lp = lp.clamp(max=-1e-3)
    adv = torch.randn(n, generator=g, dtype=F64)[:, None].expand(n, length).clone()
    mask = torch.arange(length)[None, :] < torch.randint(1, length + 1, (n,), generator=g)[:, None]
    return lp, old, adv, mask


# ================================================================== the five items "to close"

# -- 1. Clip-Cov: zero-advantage tokens stay in the draw (paper, authors' code, verl)


def test_clip_cov_draws_zero_advantage_tokens_as_the_paper_defines():
    # log-probs [-1, -5, -1, -1, -1]: mean -1.8, centred [.8, -3.2, .8, .8, .8]
    # advantages [4, 0, 0, 0, 0]:    mean  0.8, centred [3.2, -.8, -.8, -.8, -.8]
    # cov = [2.56, 2.56, -.64, -.64, -.64]: tokens 0 and 1 lie in (1, 5). One draw
    # (max(1, int(0.2 * 5)) = 1) picks each with probability 1/2: token 1 has A = 0, so its
    # gradient is already 0, but the paper draws from the covariance window alone.
    lp = t([[-1.0, -5.0, -1.0, -1.0, -1.0]])
    adv = t([[4.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    cand = clip_cov_candidates("clipped", lp, lp, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2)
    assert cand.all()  # fresh batch: nothing clipped, and A = 0 is no reason to leave a token out
    gen = torch.Generator().manual_seed(0)
    draws = 1500
    hits = torch.zeros(5)
    for _ in range(draws):
        hits += covariance_token_selection(lp, adv, mask, "clip_cov", ratio=0.2, bounds=(1.0, 5.0),
                                           generator=gen, eligible=cand)[0].double()
    assert hits[2:].sum() == 0 and hits[:2].sum() == draws
    assert abs(hits[0] / draws - 0.5) < 0.05  # binomial sd 0.013


def test_clip_cov_candidates_match_verls_formula_on_a_moved_policy():
    # verl's Clip-Cov leaves out exactly the tokens whose clipped branch is the larger loss
    # (clip_by_origin) and keeps everything else, zero advantages included.
    for seed in range(5):
        lp, old, adv, mask = _random_case(seed)
        adv[0] = 0.0
        ratio = torch.exp(lp - old)
        clip_by_origin = (-adv * ratio.clamp(0.8, 1.28) > -adv * ratio) & mask
        ours = clip_cov_candidates("clipped", lp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
        assert torch.equal(ours, mask & ~clip_by_origin), seed


# -- 2. GSPO: the sequence log-ratio is bounded above at 10, value and gradient (verl's bound)


def _verl_gspo(lp, old, adv, mask, low, high):
    m = mask.to(lp.dtype)
    seq = ((lp - old) * m).sum(-1) / m.sum(-1).clamp(min=1)
    log_s = (lp - lp.detach() + seq.detach()[:, None]).clamp(max=10.0)
    s = torch.exp(log_s)
    a = adv[:, None].expand_as(lp) if adv.dim() == 1 else adv
    return torch.maximum(-a * s, -a * s.clamp(1 - low, 1 + high)) * m


def test_gspo_log_ratio_15_with_negative_advantage_is_capped_at_e10_with_no_gradient():
    # row 0: mean log-ratio 15 > 10: value e^10 * |A| = e^10, gradient 0 (not e^15 and e^15)
    # row 1: mean log-ratio 5: value e^5 (the unclipped branch, A = -1), gradient e^5 per token
    old = t([[-20.0, -20.0], [-8.0, -8.0]])
    lp = (old + t([[15.0, 15.0], [5.0, 5.0]])).requires_grad_(True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    per_token, _ = gspo_loss(lp, old, t([-1.0, -1.0]), mask, clip_eps_low=3e-4, clip_eps_high=4e-4)
    per_token.sum().backward()
    e10, e5 = math.exp(10.0), math.exp(5.0)
    assert close(per_token.detach(), [[e10, e10], [e5, e5]], atol=1e-6)
    assert close(lp.grad, [[0.0, 0.0], [e5, e5]], atol=1e-9)
    # and verl's formula, value and gradient, on random inputs including runaway sequences
    for seed in range(4):
        x, old, adv, mask = _random_case(seed, spread=12.0)
        a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ours, _ = gspo_loss(a, old, adv, mask, clip_eps_low=0.05, clip_eps_high=0.05)
        ref = _verl_gspo(b, old, adv, mask, 0.05, 0.05)
        assert torch.allclose(ours, ref, rtol=1e-12, atol=0)
        ours.sum().backward()
        ref.sum().backward()
        assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=0)


# -- 3. the covariance of Clip-Cov/KL-Cov uses the current log-probs, also after the first update


def test_covariance_uses_the_current_logprobs_when_mini_batches_share_a_batch(tiny_model, tiny_tokenizer):
    from test_recipes import _learner_batch

    batch = _learner_batch(tiny_model, tiny_tokenizer)
    m, adv = batch.effective_loss_mask, batch.advantages
    algo = AlgorithmConfig(cov_penalty="kl_cov", cov_ratio=0.25, mini_batches=2)
    learner = Learner(copy.deepcopy(tiny_model), LearnerConfig(lr=5e-2, grad_clip=1e9), algo)
    rollout_time = learner.compute_logprobs(batch.rollout)
    # mini-batch 1 is fresh (the trainer hands it over without old log-probs) and moves the policy
    learner.step(dataclasses.replace(batch, old_logprobs=None))
    current = learner.compute_logprobs(batch.rollout)
    # mini-batch 2 shares the batch: its old log-probs are the rollout-time ones
    learner.step(dataclasses.replace(batch, old_logprobs=rollout_time))
    expected = covariance_token_selection(current, adv, m, "kl_cov", ratio=0.25)
    stale = covariance_token_selection(rollout_time, adv, m, "kl_cov", ratio=0.25)
    assert not torch.equal(expected, stale)  # the policy moved enough for the choice to matter
    assert torch.equal(learner.last_cov_selected, expected)


# -- 4. masked_whiten(shift_mean=False): whiten, then add the mean back (verl's meaning)


def test_masked_whiten_without_mean_shift_keeps_the_mean():
    # [1, 3, 5]: mean 3, unbiased var 4, std 2 -> [-1, 0, 1] + 3 = [2, 3, 4]; padding stays 0
    x = t([[1.0, 3.0, 5.0, 99.0]])
    mask = torch.tensor([[True, True, True, False]])
    assert close(masked_whiten(x, mask, shift_mean=False), [[2.0, 3.0, 4.0, 0.0]], atol=1e-8)
    assert close(masked_whiten(x, mask), [[-1.0, 0.0, 1.0, 0.0]], atol=1e-8)
    # verl: (x - mean) * rsqrt(var + 1e-8) + mean, var unbiased, over the mask
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, generator=g, dtype=F64) * 3 + 2
    mask = torch.rand(4, 6, generator=g) > 0.3
    xm = x[mask]
    ref = (x - xm.mean()) * torch.rsqrt(xm.var() + 1e-8) + xm.mean()
    assert torch.allclose(masked_whiten(x, mask, shift_mean=False)[mask], ref[mask], atol=1e-12)


# -- 5. singleton groups get 0 in every group-relative estimator (verl's GRPO: the raw score)


@pytest.mark.parametrize("estimator,scale", [("grpo", "group"), ("grpo", "none"), ("rloo", "none"),
                                             ("opo", "none"), ("gpg", "none")])
def test_a_group_of_one_sample_gets_zero(estimator, scale):
    # group 7 holds one sample (reward 1); group 3 is informative
    rewards, groups = t([1.0, 0.0, 1.0]), torch.tensor([7, 3, 3])
    mask = torch.ones(3, 4, dtype=torch.bool)
    adv = compute_advantages(estimator, AdvantageInputs(rewards, groups, mask, scale=scale)).advantages
    assert adv[0] == 0.0 and adv[1] != 0.0


def test_reinforce_pp_baseline_gives_a_lone_sample_no_group_signal():
    # alone in the batch, the singleton's centred return is 0, and whitening 0 gives 0
    tok = t([[0.0, 0.0, 1.0]])
    inputs = AdvantageInputs(t([0.0]), torch.tensor([0]), torch.ones(1, 3, dtype=torch.bool), token_rewards=tok)
    assert compute_advantages("reinforce_pp_baseline", inputs).advantages.abs().max() == 0.0


# ================================================================== new advantage estimators


def test_opo_hand_computed_with_action_token_lengths():
    # group 0: rewards 1, 0, 1 with 2, 4, 6 action tokens (row 1 has a hole, which does not count)
    # b = (2*1 + 4*0 + 6*1) / 12 = 2/3 -> A = 1/3, -2/3, 1/3; group 1: equal rewards -> 0
    mask = torch.zeros(5, 7, dtype=torch.bool)
    mask[0, :2] = True
    mask[1, [0, 1, 3, 4]] = True
    mask[2, :6] = True
    mask[3, :3] = True
    mask[4, :5] = True
    x = AdvantageInputs(t([1.0, 0.0, 1.0, 0.5, 0.5]), torch.tensor([0, 0, 0, 1, 1]), mask, scale="none")
    assert close(compute_advantages("opo", x).advantages, [1 / 3, -2 / 3, 1 / 3, 0.0, 0.0], atol=1e-12)


def test_opo_matches_verls_formula():
    g = torch.Generator().manual_seed(3)
    rewards = torch.rand(12, generator=g, dtype=F64)
    groups = torch.arange(12) // 3
    lengths = torch.randint(1, 50, (12,), generator=g).to(F64)
    ref = torch.empty(12, dtype=F64)
    for k in range(4):  # verl: b = sum(len * score) / sum(len) per group, A = score - b
        rows = groups == k
        ref[rows] = rewards[rows] - (lengths[rows] * rewards[rows]).sum() / lengths[rows].sum()
    assert torch.allclose(optimal_baseline_advantages(rewards, groups, lengths), ref, atol=1e-12)


def test_gpg_hand_computed_and_where_verl_departs_from_the_paper():
    # group 0: rewards 1, 0 (informative); group 1: 1, 1 (no signal). N = 4, N_valid = 2:
    # alpha = 4 / 2 = 2 (the paper's B / (B - M)); A = 2 * (1 - .5), 2 * (0 - .5) = 1, -1; 0, 0
    rewards, groups = t([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    assert close(gpg_advantages(rewards, groups), [1.0, -1.0, 0.0, 0.0])
    # verl: alpha = N / count_nonzero(scores) = 4 / 3 -> 2/3, -2/3: a different quantity
    verl_alpha = 4 / int(torch.count_nonzero(rewards))
    assert verl_alpha * 0.5 == pytest.approx(2 / 3)
    # F_norm = std (scale="group"): std of (1, 0) is 0.7071 -> A = 2 * .5 / .7071 = 1.4142
    assert close(gpg_advantages(rewards, groups, scale="group"), [math.sqrt(2), -math.sqrt(2), 0, 0], atol=1e-5)
    # where the two alphas coincide (every group informative, no reward 0) the values are verl's
    g = torch.Generator().manual_seed(4)
    rewards = torch.rand(12, generator=g, dtype=F64) + 0.1
    groups = torch.arange(12) // 4
    mean = torch.stack([rewards[groups == k].mean() for k in range(3)])[groups]
    verl = (12 / int(torch.count_nonzero(rewards))) * (rewards - mean) / 1.0
    assert torch.allclose(gpg_advantages(rewards, groups), verl, atol=1e-12)


# ================================================================== new policy losses


def test_gpg_loss_is_minus_advantage_times_logprob():
    lp = t([[-1.0, -2.0, 7.0]]).requires_grad_(True)  # 7.0 is padding
    mask = torch.tensor([[True, True, False]])
    per_token, _ = gpg_loss(lp, lp.detach() - 3.0, t([0.5]), mask)  # old log-probs are ignored
    per_token.sum().backward()
    assert close(per_token.detach(), [[0.5, 1.0, 0.0]]) and close(lp.grad, [[-0.5, -0.5, 0.0]])


def _verl_sapo(lp, old, adv, tau_pos, tau_neg):
    ratio = torch.exp((lp - old).clamp(-20, 20))
    taus = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    return -torch.sigmoid(taus * (ratio - 1)) * (4 / taus) * adv


def test_sapo_hand_computed_and_against_verl():
    # token 0: ratio 1.5, A = 1, tau 1: gate = 4 sigmoid(.5) = 4 * .6224593 = 2.4898373; loss -2.4898373
    #   gradient -A * 4 s (1 - s) * ratio = -4 * .6224593 * .3775407 * 1.5 = -1.4100223
    # token 1: ratio .5, A = -2, tau 1.05: gate = sigmoid(-.525) * 4 / 1.05 = .3716838 * 3.8095238
    #   = 1.4159383; loss = 2 * 1.4159383 = 2.8318767
    # token 2: ratio 1: gate 4 * .5 / tau, gradient exactly -A (the policy gradient), A = 3
    old = t([[0.0, 0.0, 0.0]]) - 1.0
    lp = (old + t([[math.log(1.5), math.log(0.5), 0.0]])).requires_grad_(True)
    adv = t([[1.0, -2.0, 3.0]])
    per_token, stats = sapo_loss(lp, old, adv, torch.ones(1, 3, dtype=torch.bool), sapo_tau_pos=1.0,
                                 sapo_tau_neg=1.05)
    per_token.sum().backward()
    assert close(per_token.detach()[0, :2], [-2.4898373, 2.8318767], atol=1e-6)
    assert close(per_token.detach()[0, 2:], [-6.0])
    assert close(lp.grad[0, [0, 2]], [-1.4100223, -3.0], atol=1e-6)
    assert stats["clip_fraction"] == 0.0
    for seed in range(3):
        x, old, adv, mask = _random_case(seed, spread=1.0)
        a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ours, _ = sapo_loss(a, old, adv, mask, sapo_tau_pos=1.0, sapo_tau_neg=1.05)
        ref = _verl_sapo(b, old, adv, 1.0, 1.05) * mask
        (ours.sum() + 0).backward()
        ref.sum().backward()
        assert torch.allclose(ours, ref, atol=1e-12) and torch.allclose(a.grad, b.grad, atol=1e-12)


def _verl_geo_mean(lp, old, adv, mask, low, high):
    m = mask.to(lp.dtype)
    nkl = lp - old
    sgn = torch.sign(adv)
    nkl_min = sgn * torch.min(sgn * nkl, sgn * nkl.clamp(-low, high))
    n = m.sum(-1)
    ratio = torch.exp((nkl_min * m).sum(-1) / (n + 1e-8))
    a = (adv * m).sum(-1) / (n + 1e-8)
    return torch.mean(-a * ratio)


def test_gmpo_hand_computed_and_against_verl():
    # row 0, A = +1, log-ratios .6, -.2, eps .4: pessimistic min(l, clip(l)) = .4, -.2; mean .1
    #   rho = e^.1 = 1.1051709; loss_0 = -1.1051709; token 0 is clipped (no gradient)
    # row 1, A = -1, log-ratios .6, -.6: max(l, clip(l)) = .6, -.4; mean .1; loss_1 = +1.1051709
    #   token 1 is clipped
    # seq_mean_token_mean: (-1.1051709 + 1.1051709) / 2 = 0; d/dlogp: row 0 token 1 -rho/2/2,
    #   row 1 token 0 +rho/2/2 (1/|o| inside rho, 1/2 from the mean over sequences)
    old = t([[-1.0, -1.0], [-1.0, -1.0]])
    lp = (old + t([[0.6, -0.2], [0.6, -0.6]])).requires_grad_(True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    per_token, stats = gmpo_loss(lp, old, t([1.0, -1.0]), mask, clip_eps_low=0.4, clip_eps_high=0.4)
    rho = math.exp(0.1)
    assert close(per_token.detach(), [[-rho, -rho], [rho, rho]], atol=1e-12)
    loss = aggregate_loss(per_token, mask, "seq_mean_token_mean", num_sequences=2.0)
    loss.backward()
    assert close(lp.grad, [[0.0, -rho / 4], [rho / 4, 0.0]], atol=1e-12)
    assert stats["clip_fraction"] == 0.5
    for seed in range(4):
        x, old, adv, mask = _random_case(seed, spread=0.6)
        a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ours, _ = gmpo_loss(a, old, adv, mask, clip_eps_low=0.3, clip_eps_high=0.4)
        ours = aggregate_loss(ours, mask, "seq_mean_token_mean", num_sequences=float(len(x)))
        ref = _verl_geo_mean(b, old, adv, mask, 0.3, 0.4)
        ours.backward()
        ref.backward()
        assert torch.allclose(ours, ref, atol=1e-7) and torch.allclose(a.grad, b.grad, atol=1e-7)


def _verl_dppo(lp, old, adv, kind, low, high, cap):
    ratio = torch.exp((lp - old).clamp(-20, 20))
    w = ratio.clamp(max=cap).detach()
    p, q = torch.exp(lp.detach()), torch.exp(old)
    if kind == "tv":
        pos, neg = (p - q) <= high, (p - q) >= -low
    else:
        kl = q * (old - lp.detach()) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
        pos, neg = (kl <= high) | (p <= q), (kl <= low) | (p >= q)
    valid = torch.where(adv > 0, pos, neg).to(lp.dtype)
    return -adv * w * lp * valid


def test_dppo_tv_hand_computed():
    # p_old = .5 everywhere.  A = +1: p .7 (up .2 > .15: masked), p .6 (up .1: kept, weight 1.2)
    # A = -1: p .3 (down .2 > .15: masked), p .7 (moved up, against the advantage: kept, weight 1.4)
    old = torch.full((1, 4), math.log(0.5), dtype=F64)
    lp = torch.log(t([[0.7, 0.6, 0.3, 0.7]])).requires_grad_(True)
    adv = t([[1.0, 1.0, -1.0, -1.0]])
    per_token, stats = dppo_tv_loss(lp, old, adv, torch.ones(1, 4, dtype=torch.bool), clip_eps_low=0.15,
                                    clip_eps_high=0.15, dppo_ratio_cap=20.0)
    per_token.sum().backward()
    assert close(per_token.detach(), [[0.0, -1.2 * math.log(0.6), 0.0, 1.4 * math.log(0.7)]], atol=1e-12)
    assert close(lp.grad, [[0.0, -1.2, 0.0, 1.4]], atol=1e-12)
    assert stats["clip_fraction"] == 0.5
    # the truncation: p .6 against p_old .01 is a ratio 60 > cap 20 (TV .59 with A < 0: inside)
    per_token, _ = dppo_tv_loss(torch.log(t([[0.6]])), torch.log(t([[0.01]])), t([[-1.0]]),
                                torch.ones(1, 1, dtype=torch.bool), dppo_ratio_cap=20.0)
    assert close(per_token, [[20.0 * math.log(0.6)]], atol=1e-12)


def test_dppo_kl_hand_computed():
    # p_old = .5, A = +1.  p = .7: KL(Bern(.5) || Bern(.7)) = .5 ln(.5/.7) + .5 ln(.5/.3)
    #   = .5 (-.3364722 + .5108256) = .0871767 > .05 and p went up: masked.
    # p = .55: .5 ln(.5/.55) + .5 ln(.5/.45) = .5 (-.0953102 + .1053605) = .0050252: kept, weight 1.1
    # p = .2 (moved down, against A > 0): kept whatever its KL, weight .4
    old = torch.full((1, 3), math.log(0.5), dtype=F64)
    lp = torch.log(t([[0.7, 0.55, 0.2]]))
    per_token, stats = dppo_kl_loss(lp, old, t([1.0]), torch.ones(1, 3, dtype=torch.bool), clip_eps_low=0.05,
                                    clip_eps_high=0.05)
    assert close(per_token, [[0.0, -1.1 * math.log(0.55), -0.4 * math.log(0.2)]], atol=1e-9)
    assert stats["clip_fraction"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_dppo_matches_verls_formula(kind):
    fn = dppo_tv_loss if kind == "tv" else dppo_kl_loss
    for seed in range(4):
        x, old, adv, mask = _random_case(seed, spread=0.8)
        a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ours, _ = fn(a, old, adv, mask, clip_eps_low=0.1, clip_eps_high=0.05, dppo_ratio_cap=3.0)
        ref = _verl_dppo(b, old, adv, kind, 0.1, 0.05, 3.0) * mask
        ours.sum().backward()
        ref.sum().backward()
        assert torch.allclose(ours, ref, atol=1e-12) and torch.allclose(a.grad, b.grad, atol=1e-12)
        assert 0 < (ours == 0)[mask].sum() < mask.sum()  # some tokens masked, some not


def test_dro_hand_computed_and_against_the_published_formula():
    # logp -1, logp_old -1.5, A = 2, beta .1: d = .5; loss = -(2 * -1 - .05 * .25) = 2.0125
    # gradient -(A - beta d) = -(2 - .05) = -1.95.  A = 0 still pays the penalty: d = -.5 -> .0125,
    # gradient beta d = -.05
    old = t([[-1.5, -0.5]])
    lp = t([[-1.0, -1.0]]).requires_grad_(True)
    per_token, _ = dro_loss(lp, old, t([[2.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool), dro_beta=0.1)
    per_token.sum().backward()
    assert close(per_token.detach(), [[2.0125, 0.0125]], atol=1e-12)
    assert close(lp.grad, [[-1.95, -0.05]], atol=1e-12)
    x, old, adv, mask = _random_case(7)
    a = x.clone().requires_grad_(True)
    ours, _ = dro_loss(a, old, adv, mask, dro_beta=0.3)
    ref = -(x * adv - 0.5 * 0.3 * (x - old) ** 2) * mask
    assert torch.allclose(ours.detach(), ref, atol=1e-12)
    assert not is_advantage_weighted("dro")  # the penalty reads rows with advantage 0


# ================================================================== new KL estimators


def test_k3_plus_and_abs_hand_computed_and_against_verl():
    # d = logp - logp_ref = .5 and -4.
    # k3 = e^-d + d - 1: e^-.5 - .5 = .1065307; e^4 - 5 = 49.598 -> clamped to 10
    # k3+: the same values, gradient of k2 = d: .5 and -4 (not k3's 1 - e^-d, nor 0 beyond the clamp)
    # abs: .5 and 4, gradient sign(d)
    ref = t([[-1.5, -1.0]])
    lp = t([[-1.0, -5.0]]).requires_grad_(True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    k = kl_penalty(lp, ref, mask, "k3+")
    k.sum().backward()
    assert close(k.detach(), [[math.exp(-0.5) - 0.5, 10.0]], atol=1e-12)
    assert close(lp.grad, [[0.5, -4.0]])
    lp.grad = None
    k = kl_penalty(lp, ref, mask, "abs")
    k.sum().backward()
    assert close(k.detach(), [[0.5, 4.0]]) and close(lp.grad, [[1.0, -1.0]])
    # verl: forward = low_var_kl (k3 clamped to [-10, 10]); backward = .5 (logp - ref)^2
    x, old, _, mask = _random_case(2, spread=3.0)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    kl = (old - b).clamp(-20, 20)
    fwd = (torch.exp(kl) - kl - 1).clamp(-10, 10)
    bwd = 0.5 * (b - old) ** 2
    verl = (bwd - bwd.detach() + fwd.detach()) * mask
    ours = kl_penalty(a, old, mask, "k3+")
    ours.sum().backward()
    verl.sum().backward()
    assert torch.allclose(ours, verl, atol=1e-12) and torch.allclose(a.grad, b.grad, atol=1e-12)


# ================================================================== registration and plumbing


def test_new_components_are_registered_with_their_papers():
    import inspect

    for name, arxiv in [("opo", "2505.23585"), ("gpg", "2504.02546")]:
        assert name in ADVANTAGE_ESTIMATORS and is_group_relative(name)
        fn = ADVANTAGE_ESTIMATORS[name]
        assert arxiv in inspect.getdoc(fn), name
    for name, arxiv in [("gpg", "2504.02546"), ("sapo", "2511.20347"), ("gmpo", "2507.20673"),
                        ("dppo_tv", "2602.04879"), ("dppo_kl", "2602.04879"), ("dro", "2405.19107")]:
        assert name in POLICY_LOSSES and arxiv in inspect.getdoc(POLICY_LOSSES[name]), name
    algo = build_config({}, ["algorithm.policy_loss=sapo", "algorithm.sapo_tau_neg=2.0",
                             "algorithm.kl_estimator=k3+"]).algorithm
    assert policy_loss_options("sapo", algo) == dict(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None,
                                                     sapo_tau_pos=1.0, sapo_tau_neg=2.0)
    assert "sapo_tau_neg" not in policy_loss_options("clipped", algo)


def test_learner_calls_the_new_losses_with_their_options(tiny_model, tiny_tokenizer):
    from test_recipes import _learner_batch

    batch = _learner_batch(tiny_model, tiny_tokenizer)
    m = batch.effective_loss_mask
    current = Learner(tiny_model, LearnerConfig(), AlgorithmConfig()).compute_logprobs(batch.rollout)
    for algo in [dict(policy_loss="sapo", sapo_tau_pos=2.0, sapo_tau_neg=3.0), dict(policy_loss="dro", dro_beta=5.0),
                 dict(policy_loss="dppo_kl", clip_eps_low=0.01, clip_eps_high=0.02, dppo_ratio_cap=1.5)]:
        cfg = AlgorithmConfig(**algo)
        stats = Learner(copy.deepcopy(tiny_model), LearnerConfig(grad_clip=1e9), cfg).step(batch)
        per_token, _ = policy_loss(cfg.policy_loss, current, batch.old_logprobs, batch.advantages, m,
                                   **policy_loss_options(cfg.policy_loss, cfg))
        expected = float(aggregate_loss(per_token * batch.is_weights, m, "token_mean"))
        assert stats["pg_loss"] == pytest.approx(expected, abs=1e-5), algo
        # the options change the loss, so the check above tells them apart from the defaults
        default, _ = policy_loss(cfg.policy_loss, current, batch.old_logprobs, batch.advantages, m)
        assert float(aggregate_loss(default * batch.is_weights, m, "token_mean")) != pytest.approx(expected, abs=1e-4)
