"""reinforge.algorithms, checked against numbers computed by hand (arithmetic in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algorithms import (
    AdvantageInputs,
    aggregate_loss,
    apply_cov_penalty,
    clipped_surrogate_loss,
    compute_advantages,
    covariance_token_selection,
    group_normalized_advantages,
    gspo_loss,
    kl_cov_loss,
    kl_penalty,
    masked_whiten,
    tokens_with_gradient,
)

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def close(a, b, atol=1e-9):
    b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=a.dtype)
    return torch.allclose(a, b.to(a.dtype), atol=atol, rtol=0)


# --------------------------------------------------------------------------- advantages


def test_grpo_one_group_hand_computed():
    # rewards [1,0,0,1]: mean 0.5; unbiased var = 4 * 0.25 / 3 = 1/3; std = sqrt(1/3) = 0.5773502692
    # A = +-0.5 / 0.5773502692 = +-0.8660254038 (= sqrt(3)/2)
    r = t([1.0, 0.0, 0.0, 1.0])
    g = torch.zeros(4, dtype=torch.long)
    a = group_normalized_advantages(r, g, eps=0.0)
    assert close(a, [0.8660254037844386, -0.8660254037844386, -0.8660254037844386, 0.8660254037844386])
    # default eps=1e-6: 0.5 / (0.5773502692 + 1e-6) = 0.8660239038
    a = group_normalized_advantages(r.float(), g)
    assert a.dtype == torch.float32
    assert close(a, [0.8660239038, -0.8660239038, -0.8660239038, 0.8660239038], atol=1e-6)


def test_two_groups_different_sizes_non_contiguous_ids():
    # group 5 at rows 0,2,4: rewards 1,2,3 -> mean 2, var (1+0+1)/2 = 1, std 1 -> A = -1, 0, 1
    # group 2 at rows 1,3:   rewards 0,4   -> mean 2, var (4+4)/1 = 8, std 2.8284271247
    #                                       -> A = -2/2.8284271247, +2/2.8284271247 = -+0.7071067812
    r = t([1.0, 0.0, 2.0, 4.0, 3.0])
    g = torch.tensor([5, 2, 5, 2, 5])
    a = group_normalized_advantages(r, g, eps=0.0)
    assert close(a, [-1.0, -0.7071067811865476, 0.0, 0.7071067811865476, 1.0])


def test_scale_false_dr_grpo():
    # same groups, centred only: group 5: 1-2, 2-2, 3-2; group 2: 0-2, 4-2
    r = t([1.0, 0.0, 2.0, 4.0, 3.0])
    g = torch.tensor([5, 2, 5, 2, 5])
    a = group_normalized_advantages(r, g, scale=False)
    assert close(a, [-1.0, -2.0, 0.0, 2.0, 1.0])


def test_all_equal_rewards_and_single_sample_groups_get_exactly_zero():
    # group 0: 0.1 three times (0.1+0.1+0.1)/3 != 0.1 in floating point, still exactly 0;
    # group 7: one sample -> 0 (its unbiased std would be 0/0); group 3: 1, 0 -> +-1/sqrt(2) -> ...
    r = t([0.1, 0.1, 0.1, 0.9, 1.0, 0.0], dtype=torch.float32)
    g = torch.tensor([0, 0, 0, 7, 3, 3])
    for scale in (True, False):
        a = group_normalized_advantages(r, g, scale=scale, eps=0.0)
        assert torch.isfinite(a).all()
        assert torch.equal(a[:4], torch.zeros(4))
    # group 3: mean 0.5, var (0.25+0.25)/1 = 0.5, std 0.7071067812 -> A = +-0.5/0.7071067812 = +-0.7071067812
    a = group_normalized_advantages(r, g, eps=0.0)
    assert close(a[4:], [0.7071067811865476, -0.7071067811865476], atol=1e-6)
    # eps = 0 and a single group of one: still 0, not NaN
    assert torch.equal(group_normalized_advantages(t([3.0]), torch.tensor([0]), eps=0.0), t([0.0]))


def test_advantages_empty_and_int_rewards():
    assert group_normalized_advantages(t([]), torch.zeros(0, dtype=torch.long)).shape == (0,)
    # int rewards [2, 0]: mean 1, std sqrt(2) -> +-1/sqrt(2); returned as float32
    a = group_normalized_advantages(torch.tensor([2, 0]), torch.tensor([1, 1]), eps=0.0)
    assert a.dtype == torch.float32 and close(a, [0.7071067811865476, -0.7071067811865476], atol=1e-6)


# --------------------------------------------------------------------------- clipped surrogate

# Ratios 1.0, 1.1, 1.5, 0.5, 0.9 (old logprobs 0, logprobs log r), eps 0.2 -> clip range [0.8, 1.2].
RATIOS = [1.0, 1.1, 1.5, 0.5, 0.9]


def _ratio_batch(ratios, advantages):
    logp = torch.log(t([ratios] * len(advantages))).requires_grad_(True)
    old = torch.zeros_like(logp)
    return logp, old, t(advantages), torch.ones_like(logp, dtype=torch.bool)


def test_surrogate_inside_above_below_clip_range():
    logp, old, adv, mask = _ratio_batch(RATIOS, [2.0, -0.5])
    loss, stats = clipped_surrogate_loss(logp, old, adv, mask)
    # A = +2:  r=1.0: -min(2, 2) = -2;  r=1.1: -min(2.2, 2.2) = -2.2
    #          r=1.5: -min(3.0, 1.2*2=2.4) = -2.4 (CLIPPED);  r=0.5: -min(1.0, 0.8*2=1.6) = -1.0
    #          r=0.9: -1.8
    # A = -0.5: r=1.0: 0.5;  r=1.1: 0.55;  r=1.5: -min(-0.75, 1.2*-0.5=-0.6) = 0.75
    #           r=0.5: -min(-0.25, 0.8*-0.5=-0.4) = 0.4 (CLIPPED);  r=0.9: 0.45
    assert close(loss, [[-2.0, -2.2, -2.4, -1.0, -1.8], [0.5, 0.55, 0.75, 0.4, 0.45]])
    # 2 clipped tokens of 10
    assert stats["clip_fraction"].item() == pytest.approx(0.2, abs=1e-12)
    # ratio mean: 2 * (1 + 1.1 + 1.5 + 0.5 + 0.9) / 10 = 1.0; max 1.5
    assert stats["ratio_mean"].item() == pytest.approx(1.0, abs=1e-12)
    assert stats["ratio_max"].item() == pytest.approx(1.5, abs=1e-12)
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())


def test_surrogate_gradient_zero_where_clipped():
    logp, old, adv, mask = _ratio_batch(RATIOS, [2.0, -0.5])
    loss, _ = clipped_surrogate_loss(logp, old, adv, mask)
    loss.sum().backward()
    # unclipped token: d/dlogp (-r * A) = -r * A (dr/dlogp = r); clipped tokens: 0
    # A=+2:   -2, -2.2, 0 (clipped), -1.0, -1.8
    # A=-0.5: 0.5, 0.55, 0.75, 0 (clipped), 0.45
    assert close(logp.grad, [[-2.0, -2.2, 0.0, -1.0, -1.8], [0.5, 0.55, 0.75, 0.0, 0.45]])


def test_surrogate_asymmetric_clip():
    # eps_low 0.3, eps_high 0.28 -> range [0.7, 1.28]
    logp, old, adv, mask = _ratio_batch([1.25, 1.3, 0.75, 0.6], [1.0, -1.0])
    loss, stats = clipped_surrogate_loss(logp, old, adv, mask, clip_eps_low=0.3, clip_eps_high=0.28)
    # A=+1: 1.25 inside -> -1.25; 1.3 -> -min(1.3, 1.28) = -1.28 (clipped); 0.75 -> -0.75; 0.6 -> -0.6
    # A=-1: 1.25 -> 1.25; 1.3 -> -min(-1.3, -1.28) = 1.3; 0.75 inside -> 0.75;
    #       0.6 -> -min(-0.6, -0.7) = 0.7 (clipped)
    assert close(loss, [[-1.25, -1.28, -0.75, -0.6], [1.25, 1.3, 0.75, 0.7]])
    assert stats["clip_fraction"].item() == pytest.approx(2 / 8, abs=1e-12)
    # symmetric 0.2 would clip r=1.25 for A=+1: -1.2 ; and r=0.75 for A=-1: 0.8
    loss_sym, _ = clipped_surrogate_loss(logp, old, adv, mask)
    assert close(loss_sym[0, 0], -1.2) and close(loss_sym[1, 2], 0.8)


def test_surrogate_gradient_at_ratio_one_is_policy_gradient():
    # logprobs == old (detached): ratio 1, d loss_t / d logp_t = -A_i (REINFORCE with advantage)
    logp = t([[-1.2, -0.3, -2.0], [-0.7, -0.1, -5.0]]).requires_grad_(True)
    old = logp.detach().clone()
    mask = torch.tensor([[True, True, True], [True, True, False]])
    loss, stats = clipped_surrogate_loss(logp, old, t([1.5, -0.5]), mask)
    loss.sum().backward()
    assert torch.equal(logp.grad, t([[-1.5, -1.5, -1.5], [0.5, 0.5, 0.0]]))
    assert stats["clip_fraction"].item() == 0.0 and stats["ratio_mean"].item() == 1.0


def test_surrogate_padding_garbage_changes_nothing():
    mask = torch.tensor([[True, True, False, False], [True, False, False, False], [True] * 4])
    clean_lp = t([[-1.0, -0.5, 0.0, 0.0], [-2.0, 0.0, 0.0, 0.0], [-0.2, -0.3, -0.4, -0.5]])
    clean_old = t([[-1.1, -0.2, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0], [-0.2, -0.5, -0.1, -0.9]])
    adv = t([[1.0] * 4, [-2.0] * 4, [0.5] * 4])
    garbage_lp, garbage_old, garbage_adv = clean_lp.clone(), clean_old.clone(), adv.clone()
    pad = ~mask
    garbage_lp[pad] = t([-math.inf, 1e30, -math.inf, math.nan, -1e30])
    garbage_old[pad] = t([math.nan, -1e30, math.inf, 0.0, -math.inf])
    garbage_adv[pad] = t([math.inf, math.nan, -1e30, 1e30, -math.inf])

    results = []
    for lp, old, a in ((clean_lp, clean_old, adv), (garbage_lp, garbage_old, garbage_adv)):
        lp = lp.clone().requires_grad_(True)
        loss, stats = clipped_surrogate_loss(lp, old, a, mask)
        aggregate_loss(loss, mask, "token_mean").backward()
        results.append((loss.detach(), stats, lp.grad))
    (l0, s0, g0), (l1, s1, g1) = results
    assert torch.isfinite(l1).all() and torch.isfinite(g1).all()
    assert torch.equal(l0, l1) and torch.equal(g0, g1)
    assert torch.equal(l1[pad], torch.zeros(int(pad.sum()), dtype=F64))
    assert torch.equal(g1[pad], torch.zeros(int(pad.sum()), dtype=F64))
    assert all(torch.equal(s0[k], s1[k]) for k in s0)


def test_surrogate_truncated_and_empty_completions():
    # row 0 truncated (all 3 tokens real), row 1 empty (no real token), A broadcast from [N]
    logp = t([[math.log(1.5), 0.0, math.log(0.5)], [-math.inf, -math.inf, -math.inf]])
    logp.requires_grad_(True)
    old = torch.zeros(2, 3, dtype=F64)
    mask = torch.tensor([[True, True, True], [False, False, False]])
    loss, stats = clipped_surrogate_loss(logp, old, t([1.0, 3.0]), mask)
    # row 0, A=1: r=1.5 -> -1.2 (clipped); r=1 -> -1; r=0.5 -> -0.5
    assert close(loss, [[-1.2, -1.0, -0.5], [0.0, 0.0, 0.0]])
    assert stats["clip_fraction"].item() == pytest.approx(1 / 3)
    assert stats["ratio_mean"].item() == pytest.approx((1.5 + 1.0 + 0.5) / 3)
    assert stats["ratio_max"].item() == pytest.approx(1.5)
    aggregate_loss(loss, mask, "seq_mean_token_mean").backward()
    assert torch.isfinite(logp.grad).all() and torch.equal(logp.grad[1], torch.zeros(3, dtype=F64))

    # an all-masked batch: loss 0, stats 0, no NaN
    loss, stats = clipped_surrogate_loss(logp.detach(), old, t([1.0, 3.0]), torch.zeros(2, 3, dtype=torch.bool))
    assert torch.equal(loss, torch.zeros(2, 3, dtype=F64))
    assert all(v.item() == 0.0 for v in stats.values())


def test_surrogate_extreme_log_ratio_is_clamped():
    # log-ratio 1000 is clamped to 20: ratio exp(20), finite; A=+1 -> clipped to -1.2
    loss, stats = clipped_surrogate_loss(t([[1000.0]]), t([[0.0]]), t([1.0]), torch.tensor([[True]]))
    assert close(loss, [[-1.2]]) and stats["ratio_max"].item() == pytest.approx(math.exp(20.0))


# --------------------------------------------------------------------------- KL


def test_kl_estimators_hand_computed():
    # d = logp - ref = [-1 - (-1.5), -2 - (-1)] = [0.5, -1.0]; third token is padding (garbage)
    logp = t([[-1.0, -2.0, -math.inf]])
    ref = t([[-1.5, -1.0, math.nan]])
    mask = torch.tensor([[True, True, False]])
    assert close(kl_penalty(logp, ref, mask, "k1"), [[0.5, -1.0, 0.0]])
    # k2 = d^2/2: 0.25/2 = 0.125, 1/2 = 0.5
    assert close(kl_penalty(logp, ref, mask, "k2"), [[0.125, 0.5, 0.0]])
    # k3 = exp(-d) + d - 1: exp(-0.5) + 0.5 - 1 = 0.6065306597 - 0.5 = 0.1065306597
    #                       exp(1) - 1 - 1 = 0.7182818285
    assert close(kl_penalty(logp, ref, mask), [[0.10653065971263342, 0.7182818284590451, 0.0]])


def test_kl_zero_when_equal_and_k3_nonnegative():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 6, generator=g, dtype=F64) * 5
    mask = torch.rand(4, 6, generator=g) > 0.3
    for est in ("k1", "k2", "k3"):
        assert torch.equal(kl_penalty(logp, logp.clone(), mask, est), torch.zeros(4, 6, dtype=F64))
    ref = -torch.rand(4, 6, generator=g, dtype=F64) * 5
    ref[0, 0], logp[0, 1] = -1000.0, -1000.0  # extreme log-ratios both ways: clamped, finite
    mask[0, :2] = True
    k3 = kl_penalty(logp, ref, mask, "k3")
    assert torch.isfinite(k3).all() and (k3 >= 0).all()
    # log(ref/pi) = 999, clamped to 20 -> exp(20) - 20 - 1 = 4.85e8 before the bound on k3 itself;
    # k3 is bounded at 10 (issue 12): both extreme tokens give 10 (the other: exp(-20) + 20 - 1 = 19)
    assert k3[0, 1].item() == 10.0 and k3[0, 0].item() == 10.0


def test_kl_unknown_estimator():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        kl_penalty(x, x, torch.ones(1, 1, dtype=torch.bool), "k4")


# --------------------------------------------------------------------------- aggregation

# lengths 3, 1, 2; padded positions hold garbage that must not count
PER_TOKEN = [[1.0, 2.0, 3.0, math.nan], [4.0, math.inf, 100.0, 0.0], [5.0, 6.0, -math.inf, 7.0]]
MASK = [[True, True, True, False], [True, False, False, False], [True, True, False, False]]


def test_aggregation_modes_hand_computed():
    x, m = t(PER_TOKEN), torch.tensor(MASK)
    # token sum 1+2+3+4+5+6 = 21 over 6 tokens
    assert close(aggregate_loss(x, m, "token_mean"), 3.5)
    # (6/3 + 4/1 + 11/2) / 3 = (2 + 4 + 5.5) / 3 = 3.8333333333
    assert close(aggregate_loss(x, m, "seq_mean_token_mean"), 11.5 / 3)
    # (6 + 4 + 11) / 3 = 7
    assert close(aggregate_loss(x, m, "seq_mean_token_sum"), 7.0)
    # 21 / constant: default N*T = 12 -> 1.75; given 3 sequences * 8 max tokens = 24 -> 0.875
    assert close(aggregate_loss(x, m, "token_sum_norm"), 1.75)
    assert close(aggregate_loss(x, m, "token_sum_norm", num_tokens=24), 0.875)
    # explicit whole-batch normalisers: 21 / 10 = 2.1; 11.5 / 5 = 2.3
    assert close(aggregate_loss(x, m, "token_mean", num_tokens=10), 2.1)
    assert close(aggregate_loss(x, m, "seq_mean_token_mean", num_sequences=5), 2.3)


def test_aggregation_empty_sequences_and_empty_batch():
    x = torch.cat([t(PER_TOKEN), t([[math.nan] * 4])])
    m = torch.cat([torch.tensor(MASK), torch.zeros(1, 4, dtype=torch.bool)])
    # the empty 4th row counts as a sequence contributing 0: 11.5 / 4 = 2.875
    assert close(aggregate_loss(x, m, "seq_mean_token_mean"), 2.875)
    assert close(aggregate_loss(x, m, "seq_mean_token_sum"), 21 / 4)
    assert close(aggregate_loss(x, m, "token_mean"), 3.5)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm"):
        xs = torch.full((2, 3), math.nan, dtype=F64, requires_grad=True)
        out = aggregate_loss(xs, empty, mode)
        out.backward()
        assert out.item() == 0.0 and torch.equal(xs.grad, torch.zeros(2, 3, dtype=F64))
    # a micro-batch of only empty rows inside a batch whose token count is 0 as well
    assert aggregate_loss(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool), "token_mean", num_tokens=0).item() == 0.0


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm"])
def test_aggregation_micro_batch_split_identity(mode):
    g = torch.Generator().manual_seed(1)
    n, width = 7, 9
    x = torch.randn(n, width, generator=g, dtype=F64)
    lengths = torch.tensor([9, 0, 3, 1, 5, 9, 2])
    m = torch.arange(width)[None, :] < lengths[:, None]
    num_tokens = float(m.sum()) if mode != "token_sum_norm" else float(n * 16)
    whole = aggregate_loss(x, m, mode, num_tokens=num_tokens, num_sequences=n)
    if mode != "token_sum_norm":  # the defaults are the whole batch's when given the whole batch
        assert close(whole, aggregate_loss(x, m, mode))
    for bounds in ([0, 7], [0, 1, 7], [0, 2, 3, 7], [0, 1, 2, 3, 4, 5, 6, 7]):
        parts = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            mb_m = m[lo:hi]
            w = int(mb_m.sum(1).max().clamp_min(1))  # micro-batches trimmed to their own longest row
            parts.append(aggregate_loss(x[lo:hi, :w], mb_m[:, :w], mode, num_tokens=num_tokens, num_sequences=n))
        assert close(sum(parts), whole, atol=1e-12)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_aggregation_independent_of_padding_columns(mode):
    x, m = t(PER_TOKEN), torch.tensor(MASK)
    wider_x = torch.cat([x, t([[1e6, math.nan, -math.inf]] * 3)], dim=1)
    wider_m = torch.cat([m, torch.zeros(3, 3, dtype=torch.bool)], dim=1)
    assert torch.equal(aggregate_loss(x, m, mode), aggregate_loss(wider_x, wider_m, mode))


def test_aggregation_unknown_mode():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="token_mean.*seq_mean_token_mean.*seq_mean_token_sum.*token_sum_norm"):
        aggregate_loss(x, torch.ones(1, 1, dtype=torch.bool), "sum")


def test_algorithms_import_only_torch():
    import ast
    import pathlib

    import reinforge.algorithms as pkg

    allowed = {"torch", "typing", "dataclasses", "math", "__future__", "reinforge"}
    for path in pathlib.Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
                if name.startswith("reinforge"):
                    assert name.startswith("reinforge.algorithms"), f"{path.name} imports {name}"


# --------------------------------------------------------------------------- the independent check's cases
# Each case where an independent implementation disagreed with reinforge (issue 12), at its minimal size.


def test_gae_whitening_of_equal_advantages_is_zero_not_amplified_rounding():
    # 4 completions x 3 tokens, every reward 0.1, all critic values 0, gamma = lam = 1: every
    # token's advantage is the same 0.1 (GAE: delta = 0.1 on the last token, 0 before, summed),
    # so whitened they are all ~0. Whitening the float32 cast with eps added to the std divided a
    # ~1e-8 leftover by a ~1e-8 std and gave -0.58.
    x = AdvantageInputs(rewards=torch.full((4,), 0.1), group_index=torch.arange(4),
                        mask=torch.ones(4, 3, dtype=torch.bool), values=torch.zeros(4, 3), whiten=True)
    adv, returns = compute_advantages("gae", x)
    assert adv.dtype == torch.float32 and adv.abs().max().item() < 1e-6
    assert close(returns, torch.full((4, 3), 0.1), atol=1e-7)  # R = A + V = 0.1, unwhitened


def test_masked_whiten_puts_eps_under_the_square_root():
    # [1, 2, 3]: mean 2, unbiased var 1; eps = 1 under the root: (x - 2) / sqrt(1 + 1) = -+0.7071067812
    w = masked_whiten(t([[1.0, 2.0, 3.0]]), torch.ones(1, 3, dtype=torch.bool), eps=1.0)
    assert close(w, [[-0.7071067811865476, 0.0, 0.7071067811865476]])
    # float32 in, float32 out, but computed in float64: equal values whiten to exactly 0
    same = masked_whiten(torch.full((2, 3), 0.1), torch.ones(2, 3, dtype=torch.bool))
    assert same.dtype == torch.float32 and same.abs().max().item() < 1e-6


def test_kl_cov_replaces_the_ratio_clip():
    # one token, old log-prob -1, new -0.5: ratio e^0.5 = 1.6487212707; A = 1; coef 1; selected
    # KL-Cov (Cui et al. 2025 and the authors' code): -A * ratio + coef * |logp - logp_old|
    #   loss = -1.6487212707 + 0.5 = -1.1487212707
    #   d/dlogp = -A * ratio + coef * sign(0.5) = -1.6487212707 + 1 = -0.6487212707
    # (stacked on the clipped surrogate it was -1.2 + 0.5 = -0.7 with gradient 0 + 1 = +1)
    lp = t([[-0.5]]).requires_grad_(True)
    old, adv, mask = t([[-1.0]]), t([1.0]), torch.ones(1, 1, dtype=torch.bool)
    per_token, stats = clipped_surrogate_loss(lp, old, adv, mask)
    per_token, stats = apply_cov_penalty("kl_cov", per_token, stats, logprobs=lp, old_logprobs=old,
                                         advantages=adv, mask=mask, selected=mask, kl_coef=1.0)
    loss = aggregate_loss(per_token, mask, "token_mean")
    loss.backward()
    assert close(loss, -1.1487212707001282) and close(lp.grad, [[-0.6487212707001282]])
    assert stats["clip_fraction"].item() == 0.0  # nothing is clipped under KL-Cov
    # a token KL-Cov did not select: the unclipped -A * ratio = -1.6487212707, gradient the same
    per_token, _ = kl_cov_loss(lp.detach(), old, adv, mask, torch.zeros_like(mask))
    assert close(per_token, [[-1.6487212707001282]])
    # a fresh update (old = sg(logp)): ratio 1, the penalty and its gradient are 0 -> -A * grad logp
    fresh = t([[-0.5]]).requires_grad_(True)
    per_token, _ = kl_cov_loss(fresh, fresh.detach(), adv, mask, mask)
    per_token.sum().backward()
    assert close(per_token.detach(), [[-1.0]]) and close(fresh.grad, [[-1.0]])


def test_k3_is_bounded_at_10_with_zero_gradient_beyond():
    # logp -5, ref -1: d = -4, k3 = e^4 - 4 - 1 = 49.598150033 with gradient 1 - e^4 = -53.598
    # unbounded; bounded: 10 and no gradient. logp -1, ref -2: d = 1, k3 = e^-1 + 1 - 1 = 0.3678794412,
    # gradient 1 - e^-1 = 0.6321205588 (below the bound: unchanged)
    lp = t([[-5.0, -1.0]]).requires_grad_(True)
    k3 = kl_penalty(lp, t([[-1.0, -2.0]]), torch.ones(1, 2, dtype=torch.bool), "k3")
    k3.sum().backward()
    assert close(k3.detach(), [[10.0, 0.36787944117144233]])
    assert close(lp.grad, [[0.0, 0.6321205588285577]])


def test_gspo_ratio_is_bounded_in_value_and_gradient():
    # row 0: token log-ratios 30 and 20, mean 25: beyond the bound 10 -> s = e^10, and no gradient
    # row 1: log-ratios 2 and 2, mean 2: s = e^2 = 7.3890560989
    # A = -1: -min(s * A, clip(s) * A) = s (the unclipped branch), d/dlogp_t = s per token
    # (clamping only the detached part gave row 0 the gradient e^10 per token)
    old = t([[-40.0, -30.0], [-5.0, -5.0]])
    lp = (old + t([[30.0, 20.0], [2.0, 2.0]])).requires_grad_(True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    per_token, _ = gspo_loss(lp, old, t([-1.0, -1.0]), mask)
    per_token.sum().backward()
    e2 = math.exp(2.0)
    assert close(per_token.detach(), [[math.exp(10.0)] * 2, [e2, e2]], atol=1e-6)
    assert close(lp.grad, [[0.0, 0.0], [e2, e2]])


def test_clip_cov_draws_only_among_tokens_with_a_gradient():
    # covariance log-probs -1, -2 | -3, -4 and A = 1 | -1 give cov = 1.5, .5 | .5, 1.5 (see
    # test_covariance_selection_hand_computed): tokens (0, 0) and (1, 1) lie in (1, 5).
    # Current log-probs: token (0, 0) has ratio 1.5 > 1.2 with A = 1, so the clip already cuts
    # its gradient; token (1, 1) has ratio 1. Clip-Cov's single draw (ratio 0.25 of 4 tokens) must
    # be (1, 1), whatever the seed.
    cov_lp = t([[-1.0, -2.0], [-3.0, -4.0]])
    current = cov_lp + t([[math.log(1.5), 0.0], [0.0, 0.0]])
    adv, mask = t([1.0, -1.0]), torch.ones(2, 2, dtype=torch.bool)
    eligible = tokens_with_gradient("clipped", current, cov_lp, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2)
    assert eligible.tolist() == [[False, True], [True, True]]
    for seed in range(8):
        gen = torch.Generator().manual_seed(seed)
        sel = covariance_token_selection(cov_lp, adv, mask, "clip_cov", ratio=0.25, bounds=(1.0, 5.0),
                                         generator=gen, eligible=eligible)
        assert sel.tolist() == [[False, False], [False, True]], seed


def test_tokens_with_gradient_for_every_way_a_gradient_vanishes():
    # ratios 1.5 / 1.0 / 5.0 / 1.0 with A = +1, +1, -1, 0 (token-level), dual clip 3:
    # 1.5 with A > 0 is clipped; 1.0 trains; 5.0 with A < 0 is capped by the dual clip (-c * A is
    # a constant); A = 0 has no gradient at all. Padding is never a candidate.
    old = torch.zeros(1, 5, dtype=F64)
    lp = t([[math.log(1.5), 0.0, math.log(5.0), 0.0, 0.0]])
    adv = t([[1.0, 1.0, -1.0, 0.0, 1.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    opts = dict(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=3.0)
    assert tokens_with_gradient("clipped", lp, old, adv, mask, **opts).tolist() == [[False, True, False, False, False]]
    # CISPO keeps every token's gradient (only A = 0 has none); so does REINFORCE
    assert tokens_with_gradient("cispo", lp, old, adv, mask).tolist() == [[True, True, True, False, False]]
    assert tokens_with_gradient("reinforce", lp, old, adv, mask).tolist() == [[True, True, True, False, False]]
