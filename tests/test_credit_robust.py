"""The robust record's stages (``deltattg.credit.robust``, ours) by hand, and against the paper's credit on the case
that breaks it: one misread b̂ inside a successful trajectory."""

from __future__ import annotations

import math

import pytest
import torch

from deltattg.credit import CreditConfig, get_estimator
from deltattg.credit.deltattg import RECOMMENDED
from deltattg.credit.layouts import step_batch
from deltattg.credit.robust import (
    batch_trust,
    capped_shares,
    expected_costs,
    hindsight_probability,
    known_completable,
    running_median,
    step_trust,
    trusted_weights,
    within_group_auc,
)
from deltattg.data.trajectory import MeterOutput

C = 100.0
OFF = {"soft": False, "hindsight": False, "smooth": 1, "share_cap": 1e12, "trust": "none"}  # every stage off


def test_expected_costs_and_hindsight_by_hand():
    p = torch.tensor([[1.0, 0.5, 0.0, 0.25]])
    v = torch.tensor([[10.0, 10.0, math.inf, 500.0]])  # no estimate (∞) and an estimate above C both count as C
    # 1·10; 0.5·10 + 0.5·100; 0·C + 1·100; 0.25·100 + 0.75·100.
    assert expected_costs(p, v, C).tolist() == [[10.0, 55.0, 100.0, 100.0]]
    assert hindsight_probability(p, torch.tensor([[True] * 4])).tolist() == [[1.0] * 4]
    assert hindsight_probability(p, torch.tensor([[False, True, False, True]])).tolist() == [[1.0, 1.0, 0.0, 1.0]]


def test_known_completable_states_are_a_successes_and_the_states_it_shares():
    # Trajectory 0 succeeds through states 7, 8; trajectory 1 fails from state 7 (shared: its first move) to 9;
    # trajectory 2's history is unknown (−1): never shared.
    success = torch.tensor([True, False, False])
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    history = torch.tensor([[7, 8], [7, 9], [-1, -1]])
    assert known_completable(success, mask, history).tolist() == [[True, True], [True, False], [False, False]]
    assert known_completable(success, mask).tolist() == [[True, True], [False, False], [False, False]]


def test_running_median_replaces_one_misread_state_and_keeps_the_ends():
    # c_0..c_4 with a misread c_2 = 100: medians of (50,50,40), (50,40,100), (40,100,20), (100,20,0), (20,0,0).
    trace = torch.tensor([[50.0, 40.0, 100.0, 20.0, 0.0, 7.0]])  # the last entry is padding past T = 4
    smoothed = running_median(trace, torch.tensor([4]), 3)
    assert smoothed.tolist() == [[50.0, 50.0, 40.0, 20.0, 0.0, 7.0]]
    assert running_median(trace, torch.tensor([4]), 1).equal(trace)


def test_share_cap_by_hand():
    # κ = 2, T = 4: cap 0.5; excess 0.2 goes to the three others by their room 0.4 each (λ = 0.2 / 1.2 = 1/6).
    q = torch.tensor([[0.7, 0.1, 0.1, 0.1, 0.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    capped = capped_shares(q, mask, 2.0)
    assert capped.tolist()[0] == pytest.approx([0.5, 0.1 + 0.4 / 6, 0.1 + 0.4 / 6, 0.1 + 0.4 / 6, 0.0])
    assert capped_shares(q, mask, 1.0).tolist()[0] == pytest.approx([0.25, 0.25, 0.25, 0.25, 0.0])  # κ = 1: uniform


def test_auc_and_trust_by_hand():
    # Group 0: success mean p̃ (0.9 + 0.8)/2 = 0.85 beats its failure's (0.3 + 0.8)/2 = 0.55; group 1: success 0.5
    # loses to its failure's 0.7. Only same-group pairs count (0.85 vs 0.7 and 0.5 vs 0.55 do not): AUC = 1/2.
    p = torch.tensor([[0.9, 0.8], [0.3, 0.8], [0.5, 0.0], [0.7, 0.0]])
    states = torch.tensor([[True, True], [True, True], [True, False], [True, False]])
    success, group = torch.tensor([True, False, True, False]), torch.tensor([0, 0, 1, 1])
    assert within_group_auc(torch.tensor([0.85, 0.55, 0.5, 0.7]), success, group) == pytest.approx(0.5)
    assert batch_trust(p, states, success, group) == (pytest.approx(0.5), 0.0)
    assert batch_trust(p[:2], states[:2], success[:2], group[:2]) == (pytest.approx(1.0), pytest.approx(1.0))
    # A tie is half a win: a meter reading the same p̃ everywhere is at chance and gives GRPO.
    assert batch_trust(torch.full((4, 2), 0.7), states, success, group) == (0.5, 0.0)
    assert math.isnan(within_group_auc(torch.tensor([0.1, 0.2]), torch.tensor([True, True]), torch.tensor([0, 0])))
    w = torch.tensor([[3.0, 0.5, 0.0]])
    assert trusted_weights(w, 0.75, torch.tensor([[True, True, False]])).tolist() == [[2.5, 0.625, 0.0]]


def test_the_step_trust_reads_each_steps_progress_not_the_outcome_level():
    """A meter that reads every success's states as completable and every failure's as hopeless, but whose readings
    never change along a trajectory, tells outcomes apart perfectly (trust=auc: τ = 1) and steps not at all
    (trust=delta: every step's progress is 0, AUC 0.5, τ = 0). A meter whose success steps each cut 10 tokens and
    whose failure steps stall gets τ = 1 from its steps; reversed, τ = 0."""
    success, group = torch.tensor([True, False]), torch.tensor([0, 0])
    read = torch.ones(2, 3, dtype=torch.bool)
    level = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    v = torch.full((2, 3), 30.0)
    assert batch_trust(level, read, success, group) == (1.0, 1.0)
    assert step_trust(level, v, read, success, group, C) == (0.5, 0.0)
    p = torch.ones(2, 3)
    progressing = torch.tensor([[30.0, 20.0, 10.0], [30.0, 30.0, 30.0]])
    assert step_trust(p, progressing, read, success, group, C) == (1.0, 1.0)
    assert step_trust(p, progressing.flip(0), read, success, group, C) == (0.0, 0.0)
    # Only steps between two read states count: masking the failure's middle state leaves it no step, so no pair.
    auc, tau = step_trust(p, progressing, torch.tensor([[True, True, True], [True, False, True]]), success, group, C)
    assert math.isnan(auc) and tau == 0.0


def test_partial_rewards_give_pairs_for_the_trust():
    """τ² scores fractional rewards: a group of failures with rewards 0.5, 0.2, 0.0 holds three pairs (success flags
    would give none, so τ = 0 whatever the meter). Scores 0.9 / 0.4 / 0.6 order two of the three pairs right:
    AUC = 2/3, τ = 1/3."""
    reward, group = torch.tensor([0.5, 0.2, 0.0]), torch.tensor([0, 0, 0])
    assert within_group_auc(torch.tensor([0.9, 0.4, 0.6]), reward, group) == pytest.approx(2 / 3)
    p, states = torch.tensor([[0.9], [0.4], [0.6]]), torch.ones(3, 1, dtype=torch.bool)
    assert batch_trust(p, states, reward, group) == (pytest.approx(2 / 3), pytest.approx(1 / 3))


def misread_group(probability: float | None = None) -> tuple:
    """One success whose third state is misread as b̂ = 0 (v̂ still given) and one failure, 4 one-token steps each."""
    success = [MeterOutput(True, 40.0), MeterOutput(True, 30.0), MeterOutput(False, 20.0, probability=probability),
               MeterOutput(True, 10.0)]  # fmt: skip
    failure = [MeterOutput(True, 40.0), MeterOutput(True, 45.0), MeterOutput(True, 50.0), MeterOutput(True, 55.0)]
    return step_batch([1.0, 0.0], [True, False], ["g", "g"], [[1] * 4, [1] * 4], [success, failure])


def robust_weights(batch, **settings) -> list[float]:
    config = CreditConfig(failure_cost=C, **(OFF | settings))
    return get_estimator(RECOMMENDED)(batch, config).step_weights[0].tolist()


def test_one_misread_state_the_paper_concentrates_and_each_stage_spreads():
    batch = misread_group()
    # Paper: costs 40, 30, C, 10, terminal 0 -> Δ = 10, −70, 90, 10; m = 10, 0, 90, 10 (Σ 110);
    # q = 0.2/4 + 0.8·m/110; one-token steps: w = 4q.
    m = [10.0, 0.0, 90.0, 10.0]
    paper = [4 * (0.05 + 0.8 * x / 110) for x in m]
    assert get_estimator("deltattg")(batch, CreditConfig(failure_cost=C)).step_weights[0].tolist() == pytest.approx(paper)
    assert paper[2] == pytest.approx(2.8182, abs=1e-4)  # the step leaving the misread state takes most of it
    # Every stage off: exactly the paper's numbers.
    assert robust_weights(batch) == pytest.approx(paper)
    # Hindsight: the success's states are completable, costs 40, 30, 20, 10, 0 -> Δ = 10 each -> w = 1.
    assert robust_weights(batch, hindsight=True) == pytest.approx([1.0] * 4)
    # Smoothing (median of 3) over 40, 30, C, 10, 0 -> 40, 40, 30, 10, 0 -> Δ = 0, 10, 20, 10 (Σ 40).
    assert robust_weights(batch, smooth=3) == pytest.approx([4 * (0.05 + 0.8 * x / 40) for x in (0, 10, 20, 10)])
    # Share cap κ = 1.5: q_2 = 0.7045 is cut to 0.375 and its excess 0.3295 goes to the others by their room.
    q = [0.05 + 0.8 * x / 110 for x in m]
    excess, room = q[2] - 0.375, sum(0.375 - x for k, x in enumerate(q) if k != 2)
    capped = [0.375 if k == 2 else x + excess / room * (0.375 - x) for k, x in enumerate(q)]
    assert robust_weights(batch, share_cap=1.5) == pytest.approx([4 * x for x in capped])
    # A soft readout with a calibrated p̃ = 0.8 at the misread state: its cost 0.8·20 + 0.2·C = 36, not C.
    # Costs 40, 30, 36, 10, 0 -> Δ = 10, −6, 26, 10; m = 10, 0, 26, 10 (Σ 46).
    soft = misread_group(probability=0.8)
    assert robust_weights(soft, soft=True) == pytest.approx([4 * (0.05 + 0.8 * x / 46) for x in (10, 0, 26, 10)])


def test_the_recommended_defaults_keep_the_invariants_and_report_their_trust():
    batch = misread_group(probability=0.4)
    credit = get_estimator(RECOMMENDED)(batch, CreditConfig(failure_cost=C))
    w = credit.step_weights
    assert torch.allclose(w.mean(dim=1), torch.ones(2), atol=1e-6) and (w <= 5.0 + 1e-6).all()
    assert (credit.step_advantages[0] > 0).all() and (credit.step_advantages[1] < 0).all()
    # The success's mean p̃ (1 + 1 + 0.4 + 1)/4 = 0.85 is below its failure's 1: AUC 0 -> trust 0 -> GRPO.
    assert credit.metrics == {"trust/auc": 0.0, "trust/tau": 0.0}
    assert w.tolist() == [[1.0] * 4, [1.0] * 4]
    # GRPO's credit is not reported as a redistribution: every trajectory says the meter was not trusted.
    counts = credit.fallback_counts()
    assert counts["credit/redistributed"] == 0 and counts["credit/untrusted"] == 2


def test_the_conservative_mix_adds_omega_times_the_group_normalised_step_change():
    """deltattg_mix by hand: a success whose meter reads 30, 20, 10 tokens to go (Δ = 10, 10, 10 with the terminal 0)
    and a failure stuck at 30 (Δ = 0, 0, −70 with the terminal C = 100). Ã = A ± ω·(Δ − mean)/(sample std + ε) over
    the group's six steps; ω = 0 is GRPO; a group whose outcomes agree (A = 0) and a group with an invalid reading
    keep their outcome advantages."""
    from statistics import mean, stdev

    from deltattg.credit import Fallback

    stuck, progressing = [MeterOutput(True, 30.0)] * 3, [MeterOutput(True, v) for v in (30.0, 20.0, 10.0)]
    rewards, successes = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0], [True, False, False, False, True, False]
    meter = [progressing, stuck, stuck, stuck, progressing, [MeterOutput(True, 30.0), None, MeterOutput(True, 30.0)]]
    batch = step_batch(rewards, successes, ["a", "a", "b", "b", "c", "c"], [[2, 2, 2]] * 6, meter)
    settings = {"soft": False, "hindsight": False, "smooth": 1}
    credit = get_estimator("deltattg_mix")(batch, CreditConfig(failure_cost=C, step_weight=0.5, **settings))
    deltas = [10.0, 10.0, 10.0, 0.0, 0.0, -70.0]
    z = [(d - mean(deltas)) / (stdev(deltas) + 1e-6) for d in deltas]
    a = credit.advantage[0].item()
    assert a == pytest.approx(0.5 / stdev([1.0] * 3 + [0.0] * 3), rel=1e-4)  # Eq. 14: each trajectory T_i rows
    assert credit.advantage[1].item() == pytest.approx(-a)
    assert credit.step_advantages[0].tolist() == pytest.approx([a + 0.5 * x for x in z[:3]], rel=1e-5)
    assert credit.step_advantages[1].tolist() == pytest.approx([-a + 0.5 * x for x in z[3:]], rel=1e-5)
    assert credit.step_advantages[2:4].abs().sum() == 0  # A = 0: not read, nothing added
    assert credit.step_advantages[4].tolist() == pytest.approx([a] * 3, rel=1e-4)  # an invalid reading in its group
    assert credit.fallback.tolist() == [Fallback.METER_STEPS] * 2 + [Fallback.ZERO_ADVANTAGE] * 2 + [
        Fallback.INVALID_GROUP] * 2
    grpo = get_estimator("deltattg_mix")(batch, CreditConfig(failure_cost=C, step_weight=0.0, **settings))
    assert torch.allclose(grpo.step_advantages, grpo.advantage[:, None].expand(-1, 3))
