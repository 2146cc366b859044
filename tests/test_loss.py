"""The actor loss of D.5 (Eq. 15–18), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from deltattg.loss import LossConfig, clipped_surrogate, covariance_terms, kl_penalty, policy_loss


def tokens(ratios, advantages, pad=0):
    old = torch.zeros(1, len(ratios) + pad)
    new = torch.tensor([[math.log(r) for r in ratios] + [7.0] * pad], requires_grad=True)
    adv = torch.tensor([list(advantages) + [100.0] * pad])
    mask = torch.tensor([[1] * len(ratios) + [0] * pad])
    return new, old, adv, mask


def test_clip_dual_clip_and_token_mean_by_hand():
    # ratio, advantage -> surrogate s = min(rA, clip(r, 0.8, 1.28)A), then max(s, 3A) where A < 0:
    #   1.5, +1 -> min(1.5, 1.28) = 1.28       (clipped)
    #   0.5, +1 -> min(0.5, 0.8)  = 0.5
    #   0.5, -1 -> min(-0.5, -0.8) = -0.8      (clipped)
    #   5.0, -1 -> min(-5, -1.28) = -5 -> max(-5, -3) = -3   (dual clip)
    #   1.0, +2 -> 2
    # Token mean over the 5 unmasked tokens: (1.28 + 0.5 - 0.8 - 3 + 2) / 5 = -0.004 -> loss = 0.004.
    # The two masked tokens (ratio e^7, advantage 100) must not count.
    new, old, adv, mask = tokens([1.5, 0.5, 0.5, 5.0, 1.0], [1, 1, -1, -1, 2], pad=2)
    loss, metrics = policy_loss(new, old, adv, mask)
    assert loss.item() == pytest.approx(0.004, abs=1e-6)
    assert metrics["clipfrac"] == pytest.approx(2 / 5)
    assert metrics["dual_clipfrac"] == pytest.approx(1 / 5)


def test_gradient_flows_only_through_unclipped_tokens():
    new, old, adv, mask = tokens([1.5, 0.5, 0.5, 5.0, 1.0], [1, 1, -1, -1, 2])
    loss, _ = policy_loss(new, old, adv, mask)
    loss.backward()
    grad = new.grad[0]
    # d(-r·A/5)/d log r = -r·A/5 on unclipped tokens, 0 where a clip holds the surrogate.
    assert grad.tolist() == pytest.approx([0.0, -0.5 / 5, 0.0, 0.0, -2.0 / 5], abs=1e-6)


def test_without_dual_clip_the_large_ratio_counts_fully():
    new, old, adv, mask = tokens([5.0], [-1])
    loss, _ = policy_loss(new, old, adv, mask, LossConfig(dual_clip=None))
    assert loss.item() == pytest.approx(5.0)


def test_kl_estimators_and_coefficients():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    # k1 = logp - ref = [0.5, -1.0]; k3 = e^{-k1} + k1 - 1 = [e^-0.5 - 0.5, e^1 - 2].
    assert kl_penalty(logp, ref, "k1").tolist()[0] == pytest.approx([0.5, -1.0])
    assert kl_penalty(logp, ref, "k3").tolist()[0] == pytest.approx([math.exp(-0.5) - 0.5, math.e - 2])
    mask = torch.ones(1, 2)
    adv = torch.zeros(1, 2)
    base, _ = policy_loss(logp, logp, adv, mask)
    with_kl, metrics = policy_loss(logp, logp, adv, mask, LossConfig(kl_coef=0.1), ref_logprobs=ref)
    expected_kl = (math.exp(-0.5) - 0.5 + math.e - 2) / 2
    assert metrics["kl"] == pytest.approx(expected_kl)
    assert (with_kl - base).item() == pytest.approx(0.1 * expected_kl)
    entropy = torch.tensor([[2.0, 4.0]])
    with_entropy, metrics = policy_loss(logp, logp, adv, mask, LossConfig(entropy_coef=0.01), entropy=entropy)
    assert metrics["entropy"] == pytest.approx(3.0)
    assert (with_entropy - base).item() == pytest.approx(-0.03)


def test_bad_config_is_refused():
    with pytest.raises(ValueError):
        LossConfig(dual_clip=0.5)
    with pytest.raises(ValueError):
        LossConfig(kl_estimator="k2")  # type: ignore[arg-type]


def test_per_token_clip_ranges_by_hand():
    # Per-token widths η_low = [0.2, 0.2, 0.4], η_high = [0.28, 0.6, 0.28] on ratios [1.5, 1.5, 0.5], Ã = [1, 1, -1]:
    #   1.5, +1, [0.8, 1.28] -> min(1.5, 1.28) = 1.28
    #   1.5, +1, [0.8, 1.6]  -> min(1.5, 1.5)  = 1.5  (inside its wider range)
    #   0.5, -1, [0.6, 1.28] -> min(-0.5, -0.6) = -0.6
    ratio = torch.tensor([[1.5, 1.5, 0.5]])
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    low = torch.tensor([[0.2, 0.2, 0.4]])
    high = torch.tensor([[0.28, 0.6, 0.28]])
    assert clipped_surrogate(ratio, adv, low, high).tolist()[0] == pytest.approx([1.28, 1.5, -0.6])
    # A tensor that broadcasts (one width per row) and a float mixed with a tensor both work.
    assert clipped_surrogate(ratio, adv, torch.tensor([[0.2]]), 0.28).tolist()[0] == pytest.approx([1.28, 1.28, -0.8])
    # Constant tensors reproduce the float path exactly.
    assert torch.equal(clipped_surrogate(ratio, adv, torch.full_like(ratio, 0.2), torch.full_like(ratio, 0.28)),
                       clipped_surrogate(ratio, adv, 0.2, 0.28))  # fmt: skip


def test_policy_loss_clip_scale_by_hand():
    # A²TGPO's turn clip factors c = [1, 1.5, 0.5] scale the default widths (0.2, 0.28):
    #   ranges [0.8, 1.28], [0.7, 1.42], [0.9, 1.14] on ratios [1.5, 1.5, 0.5], Ã = [1, 1, -1]
    #   -> 1.28, 1.42, min(-0.5, -0.9) = -0.9 (the dual clip max(-0.9, -3) leaves it); mean 1.8/3 = 0.6 -> loss -0.6.
    new, old, adv, mask = tokens([1.5, 1.5, 0.5], [1, 1, -1])
    loss, metrics = policy_loss(new, old, adv, mask, clip_scale=torch.tensor([[1.0, 1.5, 0.5]]))
    assert loss.item() == pytest.approx(-0.6, abs=1e-6)
    assert metrics["clipfrac"] == pytest.approx(1.0)
    # c = 1 everywhere is the fixed range.
    base, _ = policy_loss(new, old, adv, mask)
    same, _ = policy_loss(new, old, adv, mask, clip_scale=torch.ones(1, 3))
    assert same.item() == pytest.approx(base.item())


# ---- verl's entropy guards (clip_cov / kl_cov) -------------------------------------------------------------------
# Ratios 1.5, 0.5, 1.0, 2.0 with advantages +1, +1, -1, -1 (old log-probs 0): mean Ã = 0, mean log π = ln(1.5)/4,
# so the covariance terms Ã·(log π - mean) are 0.304, -0.794, 0.101, -0.592.
GUARD_RATIOS, GUARD_ADVANTAGES = [1.5, 0.5, 1.0, 2.0], [1, 1, -1, -1]


def test_covariance_terms_by_hand():
    new, _, adv, mask = tokens(GUARD_RATIOS, GUARD_ADVANTAGES, pad=1)
    shift = math.log(1.5) / 4
    expected = [math.log(1.5) - shift, math.log(0.5) - shift, shift, -(math.log(2.0) - shift)]
    assert covariance_terms(new, adv, mask.bool())[0, :4].tolist() == pytest.approx(expected, abs=1e-6)


def test_kl_cov_holds_the_largest_covariance_token_without_a_clip():
    # kl_cov_ratio 0.25 of 4 tokens -> the one of largest term (token 0, 0.304) gets r·Ã - |log r| = 1.5 - ln 1.5;
    # no clip anywhere (verl): token 3 keeps r·Ã = -2. Token mean (1.5 - ln 1.5 + 0.5 - 1 - 2) / 4.
    new, old, adv, mask = tokens(GUARD_RATIOS, GUARD_ADVANTAGES, pad=2)
    loss, metrics = policy_loss(new, old, adv, mask, LossConfig(loss_mode="kl_cov", kl_cov_ratio=0.25))
    assert loss.item() == pytest.approx((1 + math.log(1.5)) / 4, abs=1e-6)
    assert metrics["cov_guard_frac"] == pytest.approx(0.25)
    loss.backward()
    # d/d log π of -(r·Ã - |log r|)/4: token 0 -(1.5 - 1)/4; token 1 -(0.5)/4; tokens 2, 3 -r·Ã/4; padding 0.
    assert new.grad[0].tolist() == pytest.approx([-0.125, -0.125, 0.25, 0.5, 0, 0], abs=1e-6)


def test_clip_cov_drops_the_gradient_of_an_unclipped_token_inside_the_bounds():
    # Candidates: covariance term in (0.05, 5) and the clip not active. Token 0 (0.304) is clipped (r 1.5 > 1.28,
    # Ã > 0), so only token 2 (0.101) is left; max(1, ⌊0.0002·4⌋) = 1 token: token 2's objective becomes 0.
    # Objective (no dual clip): 1.28, 0.5, 0, -2 -> loss -(1.28 + 0.5 - 2) / 4 = 0.055.
    new, old, adv, mask = tokens(GUARD_RATIOS, GUARD_ADVANTAGES)
    loss, metrics = policy_loss(new, old, adv, mask, LossConfig(loss_mode="clip_cov", clip_cov_lb=0.05))
    assert loss.item() == pytest.approx(0.055, abs=1e-6)
    assert metrics["cov_guard_frac"] == pytest.approx(0.25)
    loss.backward()
    assert new.grad[0].tolist() == pytest.approx([0.0, -0.125, 0.0, 0.5], abs=1e-6)
    # Without a candidate in the bounds nothing is dropped: the vanilla surrogate without dual clip.
    new, old, adv, mask = tokens(GUARD_RATIOS, GUARD_ADVANTAGES)
    loss, metrics = policy_loss(new, old, adv, mask, LossConfig(loss_mode="clip_cov", clip_cov_lb=0.5))
    assert loss.item() == pytest.approx(-(1.28 + 0.5 - 1 - 2) / 4, abs=1e-6) and metrics["cov_guard_frac"] == 0


def test_clip_cov_draws_its_share_among_the_candidates_only():
    torch.manual_seed(0)
    ratios = torch.rand(2000).mul(0.4).add(0.8).tolist()  # inside the clip range: every token unclipped
    advantages = torch.randn(2000).mul(4).tolist()
    new, old, adv, mask = tokens(ratios, advantages)
    config = LossConfig(loss_mode="clip_cov", clip_cov_ratio=0.01, dual_clip=None)
    loss, metrics = policy_loss(new, old, adv, mask, config)
    assert metrics["cov_guard_frac"] == pytest.approx(20 / 2000)
    loss.backward()
    dropped = new.grad[0] == 0
    cov = covariance_terms(new, adv, mask.bool())[0]
    assert int(dropped.sum()) == 20 and bool(((cov[dropped] > 1) & (cov[dropped] < 5)).all())


def test_bad_guard_settings_are_refused():
    for bad in ({"loss_mode": "cov"}, {"clip_cov_ratio": 0.0}, {"kl_cov_ratio": 1.5},
                {"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}, {"ppo_kl_coef": -1.0}):  # fmt: skip
        with pytest.raises(ValueError):
            LossConfig(**bad)
