"""Credit computed by hand, with the arithmetic in the comments."""

from __future__ import annotations

import pytest
import torch

from deltattg.credit import CreditConfig, Fallback, get_estimator
from deltattg.credit.deltattg import bounded_token_normalization
from deltattg.credit.layouts import step_batch
from deltattg.data.trajectory import MeterOutput

OK = lambda v: MeterOutput(can_complete=True, tokens_to_go=v)  # noqa: E731
FAIL = MeterOutput(can_complete=False)


def test_step_expanded_group_advantage_by_hand():
    # Group of two: a (R=1, T=1) and b (R=0, T=3) -> K = 4 step-expanded rows [1, 0, 0, 0].
    # μ = 1/4 = 0.25; Σ T(R-μ)² = 1·0.75² + 3·0.25² = 0.5625 + 0.1875 = 0.75; σ = sqrt(0.75 / (4-1)) = 0.5.
    # A_a = 0.75 / (0.5 + 1e-6) ≈ 1.499997; A_b = -0.25 / (0.5 + 1e-6) ≈ -0.499999.
    batch = step_batch([1.0, 0.0], [True, False], ["g", "g"], [[5], [5, 5, 5]])
    credit = get_estimator("grpo")(batch, CreditConfig())
    assert credit.advantage.tolist() == pytest.approx([0.75 / 0.500001, -0.25 / 0.500001], rel=1e-6)
    # GRPO gives every step weight 1: Ã = A on every token.
    assert credit.step_weights.tolist() == [[1, 0, 0], [1, 1, 1]]


def test_successful_trajectory_gets_progress_shares():
    # Success, A > 0, tokens n = [10, 20, 30], predicted TTG c = [100, 60, 20], terminal c_T = 0.
    # Δ = [100-60, 60-20, 20-0] = [40, 40, 20]; m = Δ (A > 0); Σm = 100.
    # q = ρ/T + (1-ρ)·m/Σm = 1/15 + 0.8·[0.4, 0.4, 0.2] = [29/75, 29/75, 17/75].
    # B_M: N = 60, Σ n·q = (290 + 580 + 510)/75 = 1380/75, w = N·q / Σ n·q = [29/23, 29/23, 17/23] (all < M = 5).
    batch = step_batch(
        [1.0, 0.0], [True, False], ["g", "g"], [[10, 20, 30], [5]], [[OK(100), OK(60), OK(20)], [FAIL]]
    )
    credit = get_estimator("deltattg")(batch, CreditConfig(failure_cost=1000))
    assert credit.step_weights[0].tolist() == pytest.approx([29 / 23, 29 / 23, 17 / 23], rel=1e-5)
    assert Fallback(int(credit.fallback[0])) is Fallback.REDISTRIBUTED
    # The other trajectory predicts failure everywhere: it keeps its original advantage (Algorithm 1, line 15).
    assert Fallback(int(credit.fallback[1])) is Fallback.ALL_UNSUCCESSFUL
    assert credit.step_weights[1, 0].item() == 1.0


def test_failed_trajectory_blames_the_regressing_step_and_the_cap_binds():
    # Failure, A < 0, tokens n = [2, 8], readings [ttg 10, fail], C = 100, terminal c_T = C = 100.
    # Δ = [10-100, 100-100] = [-90, 0]; sign-aware mass m = max(-Δ, 0) = [90, 0].
    # q = 0.2/2 + 0.8·[1, 0] = [0.9, 0.1]; N = 10; Σ n·q = 1.8 + 0.8 = 2.6; w⁰ = 10·q/2.6 = [45/13, 5/13].
    # Cap M = 2: excess E = 2·(45/13 - 2) = 38/13; capacity = 8·(2 - 5/13) = 168/13; λ = E/capacity = 19/84;
    # w₁ = 5/13 + (19/84)·(21/13) = 20/52 + 19/52 = 39/52 = 0.75. Check: 2·2 + 8·0.75 = 10 = N (unit token mean).
    batch = step_batch([0.0, 1.0], [False, True], ["g", "g"], [[2, 8], [4]], [[OK(10), FAIL], [OK(3)]])
    credit = get_estimator("deltattg")(batch, CreditConfig(failure_cost=100, cap=2.0))
    assert credit.advantage[0] < 0
    assert credit.step_weights[0].tolist() == pytest.approx([2.0, 0.75], rel=1e-5)
    # Without sign-aware reversal (E.4 "pos"), the failed trajectory has no positive progress: m = [0, 0] -> 1/T.
    pos = get_estimator("pos")(batch, CreditConfig(failure_cost=100, cap=2.0))
    assert Fallback(int(pos.fallback[0])) is Fallback.ZERO_MASS
    assert pos.step_weights[0].tolist() == pytest.approx([1.0, 1.0])


def test_logit_variant_by_hand():
    # Success, A > 0, logits z = [0, 4, 12] clipped to L = 10 -> S = [0, 4, 10]; terminal S_T = +L = 10.
    # Δ = [4, 6, 0]; q = 1/15 + 0.8·[0.4, 0.6, 0] = [29/75, 41/75, 5/75]; n = [1, 1, 1] -> w = 3q = [1.16, 1.64, 0.2].
    readings = [[MeterOutput(logit=0.0), MeterOutput(logit=4.0), MeterOutput(logit=12.0)], [MeterOutput(logit=-3.0)]]
    batch = step_batch([1.0, 0.0], [True, False], ["g", "g"], [[1, 1, 1], [1]], readings)
    credit = get_estimator("logit")(batch, CreditConfig())
    assert credit.step_weights[0].tolist() == pytest.approx([1.16, 1.64, 0.2], rel=1e-5)


def test_invalid_queried_reading_voids_the_whole_group_but_unqueried_ones_do_not():
    readings = [[OK(30), None], [OK(5)], [None], [None]]
    # Group g: a queried (A ≠ 0) state is invalid -> both g trajectories keep A_i on every token.
    # Group h: rewards equal -> A = 0, nobody is queried, so its null readings are no reason to fall back.
    batch = step_batch([1.0, 0.0, 1.0, 1.0], [True, False, True, True], ["g", "g", "h", "h"], [[3, 3], [3], [3], [3]], readings)
    credit = get_estimator("deltattg")(batch, CreditConfig(failure_cost=100))
    codes = [Fallback(int(c)) for c in credit.fallback]
    assert codes == [Fallback.INVALID_GROUP, Fallback.INVALID_GROUP, Fallback.ZERO_ADVANTAGE, Fallback.ZERO_ADVANTAGE]
    assert credit.step_weights.tolist() == [[1, 1], [1, 0], [1, 0], [1, 0]]
    assert credit.step_advantages[2:].abs().sum() == 0


def test_bounded_normalization_is_identity_when_no_cap_binds():
    shares = torch.tensor([[0.5, 0.3, 0.2]])
    tokens = torch.tensor([[4, 4, 4]])
    # w⁰ = 12·q / (4·1.0) = 3q = [1.5, 0.9, 0.6], all below M = 5: B_M returns w⁰ unchanged.
    assert bounded_token_normalization(shares, tokens, 5.0).tolist()[0] == pytest.approx([1.5, 0.9, 0.6])


def test_a_predicted_success_never_costs_more_than_failure():
    # Success, A > 0, readings [ttg 500, fail, ttg 10] at C = 100, n = [1, 1, 1], terminal c_T = 0.
    # Clamped (ours): c = [min(500, 100), 100, 10, 0] = [100, 100, 10, 0] -> Δ = [0, 90, 10]; step 0 -> failure is
    # no progress. q = 0.2/3 + 0.8·[0, 0.9, 0.1] = [1/15, 0.72 + 1/15, 0.08 + 1/15]; n = 1 -> w = 3q = [0.2, 2.36, 0.44].
    # Unclamped, Δ_0 = 500 − 100 = 400 would have rewarded walking into predicted failure with the largest share.
    batch = step_batch([1.0, 0.0], [True, False], ["g", "g"], [[1, 1, 1], [1]], [[OK(500), FAIL, OK(10)], [FAIL]])
    credit = get_estimator("deltattg")(batch, CreditConfig(failure_cost=100))
    assert credit.step_weights[0].tolist() == pytest.approx([0.2, 2.36, 0.44], rel=1e-5)
