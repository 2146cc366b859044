"""Properties of every DeltaTTG-family estimator over random batches (hypothesis), and agreement with the literal
per-trajectory transcription of Algorithm 1."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deltattg.credit import CreditConfig, Fallback, get_estimator
from deltattg.credit.deltattg import VARIANTS, bounded_token_normalization
from deltattg.credit.layouts import step_batch
from deltattg.credit.reference import algorithm1
from deltattg.credit.robust import known_completable
from deltattg.data.trajectory import MeterOutput

FAMILY = sorted(VARIANTS)
f32 = st.floats(min_value=-50, max_value=50, allow_nan=False, width=32)


@st.composite
def readings(draw, invalid_rate: float):
    if draw(st.floats(0, 1)) < invalid_rate:
        return None
    can = draw(st.booleans())
    return MeterOutput(
        can_complete=can,
        tokens_to_go=float(draw(st.integers(0, 3000))) if can or draw(st.booleans()) else None,
        logit=draw(f32),
        score=draw(f32),
        # p̃ on a 1/256 grid: the estimator computes costs in float32, the literal transcription in float64, and
        # on this grid p̃·min(v̂, C) + (1 − p̃)·C is exact in both (a p̃ of 1e-12 moves a float64 cost, not a float32 one)
        probability=draw(st.one_of(st.none(), st.integers(0, 256).map(lambda k: k / 256))),
    )


@st.composite
def batches(draw, max_groups: int = 4, max_size: int = 5, max_steps: int = 7):
    invalid_rate = draw(st.sampled_from([0.0, 0.0, 0.05, 0.3]))
    rewards, successes, groups, tokens, meter, histories = [], [], [], [], [], []
    for g in range(draw(st.integers(1, max_groups))):
        for _ in range(draw(st.integers(1, max_size))):
            success = draw(st.booleans())
            steps = draw(st.integers(1, max_steps))
            rewards.append(1.0 if success else 0.0)
            successes.append(success)
            groups.append(f"g{g}")
            tokens.append(draw(st.lists(st.integers(0, 40), min_size=steps, max_size=steps)))
            meter.append([draw(readings(invalid_rate)) for _ in range(steps)])
            histories.append(draw(st.lists(st.one_of(st.none(), st.integers(0, 6)), min_size=steps, max_size=steps)))
    config = CreditConfig(
        rho=draw(st.sampled_from([0.0, 0.2, 0.5, 1.0])),
        cap=draw(st.sampled_from([1.0, 1.5, 2.0, 5.0])),
        failure_cost=float(draw(st.integers(1, 20000))),
        soft=draw(st.booleans()),
        hindsight=draw(st.booleans()),
        smooth=draw(st.sampled_from([1, 3, 5])),
        share_cap=draw(st.sampled_from([1.0, 1.5, 2.0, 1e12])),
        trust=draw(st.sampled_from(["none", "auc", "delta"])),
    )
    return rewards, successes, groups, tokens, meter, histories, config


def run(name, data):
    rewards, successes, groups, tokens, meter, histories, config = data
    batch = step_batch(rewards, successes, groups, tokens, meter, histories=histories)
    return batch, get_estimator(name)(batch, config)


@pytest.mark.parametrize("name", FAMILY)
@settings(max_examples=60, deadline=None)
@given(data=batches())
def test_sign_unit_token_mean_cap_and_finite(name, data):
    batch, credit = run(name, data)
    config = data[-1]
    A, w, mask = credit.advantage, credit.step_weights, batch.step_mask
    assert torch.isfinite(A).all() and torch.isfinite(w).all()
    # Every token advantage has the sign of A_i (or is 0 where ρ = 0 leaves a step without share).
    step_adv = credit.step_advantages
    assert ((step_adv * A[:, None]) >= 0).all()
    if config.rho > 0 and VARIANTS[name].uniform_mixing:
        nonzero = mask & (A[:, None] != 0)
        assert (torch.sign(step_adv[nonzero]) == torch.sign(A[:, None].expand_as(w)[nonzero])).all()
    # Token-weighted mean of w is 1 for every trajectory with tokens; no multiplier exceeds M.
    tokens = batch.step_tokens.float()
    has_tokens = tokens.sum(1) > 0
    mean = (tokens * w).sum(1)[has_tokens] / tokens.sum(1)[has_tokens]
    assert torch.allclose(mean, torch.ones_like(mean), atol=1e-4)
    assert (w[mask] <= config.cap + 1e-4).all()
    assert (w[~mask] == 0).all()


@pytest.mark.parametrize("name", FAMILY)
@settings(max_examples=60, deadline=None)
@given(data=batches())
def test_algorithm1_fallbacks(name, data):
    batch, credit = run(name, data)
    codes = credit.fallback
    keeps = (codes == Fallback.ZERO_ADVANTAGE) | (codes == Fallback.INVALID_GROUP) | (codes == Fallback.ALL_UNSUCCESSFUL)
    # Trajectories that keep their original advantage have w = 1 on every step.
    assert (credit.step_weights[keeps] == batch.step_mask[keeps].float()).all()
    # A = 0 exactly when the group's rewards are all equal; those keep 0.
    assert ((credit.advantage == 0) == (codes == Fallback.ZERO_ADVANTAGE)).all()
    assert (credit.step_advantages[codes == Fallback.ZERO_ADVANTAGE] == 0).all()
    meter = batch.meter
    queried = (credit.advantage != 0)[:, None] & batch.step_mask
    bad = (queried & ~meter.valid).any(1)
    for g in batch.group[bad].unique():
        in_group = (batch.group == g) & (credit.advantage != 0)
        assert (codes[in_group] == Fallback.INVALID_GROUP).all()
    config = data[-1]
    variant = VARIANTS[name]
    if variant.robust and config.soft:  # the soft readout still ranks states every b̂ calls unsuccessful
        assert not (codes == Fallback.ALL_UNSUCCESSFUL).any()
    elif variant.has_completion_prediction:
        completable = meter.can_complete.clone()
        if variant.robust and config.hindsight:
            completable |= known_completable(batch.success, batch.step_mask, batch.history)
        never = ~(completable & meter.valid & batch.step_mask).any(1)
        eligible = never & (codes != Fallback.ZERO_ADVANTAGE) & (codes != Fallback.INVALID_GROUP)
        assert (codes[eligible] == Fallback.ALL_UNSUCCESSFUL).all()


@pytest.mark.parametrize("name", FAMILY)
@settings(max_examples=40, deadline=None)
@given(data=batches())
def test_matches_literal_algorithm1(name, data):
    rewards, successes, groups, tokens, meter, histories, config = data
    _, credit = run(name, data)
    variant = VARIANTS[name]
    A, W, token_adv = algorithm1(
        rewards, successes, groups, tokens, meter, config,
        signal=variant.signal, sign_aware=variant.sign_aware, uniform_mixing=variant.uniform_mixing,
        robust=variant.robust, histories=histories,
    )
    assert credit.advantage.tolist() == pytest.approx(A, rel=1e-5, abs=1e-5)
    for i, weights in enumerate(W):  # a token-less step's multiplier touches no token: only the others must agree
        ours = [w for w, n in zip(credit.step_weights[i].tolist(), tokens[i]) if n > 0]
        assert ours == pytest.approx([w for w, n in zip(weights, tokens[i]) if n > 0], rel=1e-4, abs=1e-4)


@settings(max_examples=100, deadline=None)
@given(
    shares=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=8),
    tokens=st.lists(st.integers(1, 30), min_size=8, max_size=8),
)
def test_bounded_normalization_identity_without_binding_cap(shares, tokens):
    q = torch.tensor([shares], dtype=torch.float64)
    n = torch.tensor([tokens[: len(shares)]])
    w0 = n.sum() * q / (n * q).sum()
    cap = math.ceil(float(w0.max())) + 1.0
    assert torch.allclose(bounded_token_normalization(q, n, cap), w0)


@pytest.mark.parametrize("name", ["deltattg", "deltattg_robust"])
@settings(max_examples=40, deadline=None)
@given(data=batches(max_groups=3, max_size=4))
def test_zero_advantage_trajectories_are_not_queried(name, data):
    rewards, successes, groups, tokens, meter, histories, config = data
    _, credit = run(name, data)
    # Blank out every reading of A = 0 trajectories: nothing changes, because nobody asked for them.
    blanked = [[None] * len(m) if a == 0 else m for m, a in zip(meter, credit.advantage.tolist())]
    _, again = run(name, (rewards, successes, groups, tokens, blanked, histories, config))
    assert torch.equal(credit.step_weights, again.step_weights)
    assert torch.equal(credit.fallback, again.fallback)


def test_a_subnormal_progress_difference_keeps_the_unit_token_mean():
    """Found by hypothesis: a score of −1.18e-38 (float32's smallest normal) before a token-less last step made
    Σ n·q vanish, w⁰ of the token-less step overflow to inf and B_M give the first step 0 (token mean 0.25)."""
    from deltattg.data.trajectory import MeterOutput

    def reading(score: float = 0.0) -> MeterOutput:
        return MeterOutput(can_complete=False, tokens_to_go=None, logit=0.0, score=score)

    data = ([1.0, 0.0], [True, False], ["g", "g"], [[3, 1, 0], [1]],
            [[reading(), reading(-1.1754943508222875e-38), reading()], [reading()]], None,
            CreditConfig(rho=0.0, cap=1.0, failure_cost=1.0))  # fmt: skip
    _, credit = run("value", data)
    assert credit.step_weights[0].tolist() == [1.0, 1.0, 1.0]
