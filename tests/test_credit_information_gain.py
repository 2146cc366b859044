"""IGPO and A²TGPO arithmetic (deltattg.credit.information_gain): hand-worked batches and hypothesis properties."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deltattg.credit.information_gain import (
    a2tgpo_advantages,
    answer_probabilities,
    group_zscore,
    igpo_advantages,
    information_gain,
    mean_token_logprob,
    turn_group_normalised_ig,
)

D = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=D)


def prefix_mask(lengths, width):
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------- information gain


def test_answer_probability_is_exp_of_the_mean_token_logprob():
    # Answer tokens log-probs [-1, -3] (third position is not an answer token): mean -2 -> p = e^-2.
    logprobs = t([[-1.0, -3.0, -50.0]])
    mean = mean_token_logprob(logprobs, torch.tensor([[1, 1, 0]]))
    assert mean.tolist() == pytest.approx([-2.0])
    assert answer_probabilities(mean).tolist() == pytest.approx([math.exp(-2.0)])


def test_information_gain_by_hand():
    # Trajectory 0 has 3 turns: p = 0.1 -> 0.3 -> 0.6 -> 0.9, IG = [0.2, 0.3, 0.3].
    # Trajectory 1 has 1 turn: p = 0.2 -> 0.1, IG = [-0.1]; its p after column 1 is padding and must be ignored.
    p = t([[0.1, 0.3, 0.6, 0.9], [0.2, 0.1, 0.7, 0.0]])
    mask = prefix_mask([3, 1], 3)
    assert information_gain(p, mask).tolist()[0] == pytest.approx([0.2, 0.3, 0.3])
    assert information_gain(p, mask).tolist()[1] == pytest.approx([-0.1, 0.0, 0.0])
    # Log variant: log(0.3/0.1) = log 3, log 2, log 1.5; log(0.1/0.2) = log 0.5.
    logs = information_gain(p, mask, log=True)
    assert logs.tolist()[0] == pytest.approx([math.log(3), math.log(2), math.log(1.5)])
    assert logs.tolist()[1] == pytest.approx([math.log(0.5), 0.0, 0.0])


def test_log_information_gain_stays_finite_when_p_underflows():
    p = t([[0.0, 0.5]])
    assert torch.isfinite(information_gain(p, prefix_mask([1], 1), log=True)).all()


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError):
        information_gain(t([[0.1, 0.2]]), prefix_mask([2], 2))  # p must be [n, S+1]
    with pytest.raises(ValueError):
        igpo_advantages(t([[0.1, 0.2]]), t([1.0]), torch.tensor([0]), torch.tensor([[False, True]]))  # not a prefix


# ---------------------------------------------------------------- IGPO


def igpo_batch():
    # Group 0: A has 3 turns, IG = [0.0, 1.0], outcome 1 -> turn rewards [0, 1, 1];
    #          B has 1 turn (the answer), outcome 0 -> turn rewards [0].
    #          Pooled {0, 1, 1, 0}: mean 0.5, population std 0.5 -> z-scores A [-1, 1, 1], B [-1].
    #          (IGPO's code would drop A's IG of exactly 0 from the statistics; here every real turn counts.)
    # Group 1: C has 2 turns, IG 0.4 and outcome 0.4: constant -> 0 everywhere.
    # Group 2: D alone, 1 turn: a single reward, σ = 1, centred on itself -> 0.
    ig = t([[0.0, 1.0, 9.0], [9.0, 0.0, 0.0], [0.4, 9.0, 0.0], [9.0, 0.0, 0.0]])  # 9 = the unused answer-turn IG
    reward = t([1.0, 0.0, 0.4, 1.0])
    group = torch.tensor([0, 0, 1, 2])
    return ig, reward, group, prefix_mask([3, 1, 2, 1], 3)


def test_igpo_by_hand():
    ig, reward, group, mask = igpo_batch()
    # γ = 1: A_t = Σ_{k≥t} z_k -> A: [-1+1+1, 1+1, 1] = [1, 2, 1]; B: [-1]. ε = 0 keeps the numbers round
    # (σ = sqrt(0.25 + 1e-8) differs from 0.5 by 1e-8).
    adv = igpo_advantages(ig, reward, group, mask, epsilon=0.0)
    assert adv.tolist() == [pytest.approx(r, abs=1e-6) for r in ([1, 2, 1], [-1, 0, 0], [0, 0, 0], [0, 0, 0])]
    # γ = 0.5: A: t=2: 1; t=1: 1 + 0.5·1 = 1.5; t=0: -1 + 0.5·1.5 = -0.25.
    adv = igpo_advantages(ig, reward, group, mask, gamma=0.5, epsilon=0.0)
    assert adv[0].tolist() == pytest.approx([-0.25, 1.5, 1.0], abs=1e-6)
    # ε = 1e-6 (default) divides by σ + ε = 0.500001.
    adv = igpo_advantages(ig, reward, group, mask)
    assert adv[0, 2].item() == pytest.approx(0.5 / (math.sqrt(0.25 + 1e-8) + 1e-6), rel=1e-9)


def test_igpo_accepts_arbitrary_group_ids():
    ig, reward, group, mask = igpo_batch()
    relabelled = torch.tensor([70, 70, -3, 12])
    assert torch.equal(igpo_advantages(ig, reward, group, mask), igpo_advantages(ig, reward, relabelled, mask))


# ---------------------------------------------------------------- A²TGPO


def a2tgpo_batch():
    # Group 0: A: 3 turns, IG [0.3, 0.2], outcome 1; B: 3 turns, IG [0.1, 0.4], outcome 0; C: 2 turns, IG [0.2],
    # outcome 1. Group 1: D alone, 2 turns, IG [0.5], outcome 1. Answer-turn IG (9) is never read.
    ig = t([[0.3, 0.2, 9.0], [0.1, 0.4, 9.0], [0.2, 9.0, 0.0], [0.5, 9.0, 0.0]])
    reward = t([1.0, 0.0, 1.0, 1.0])
    group = torch.tensor([0, 0, 0, 1])
    return ig, reward, group, prefix_mask([3, 3, 2, 2], 3)


def test_turn_group_normalisation_by_hand():
    ig, _, group, mask = a2tgpo_batch()
    # (g0, turn 0): {0.3, 0.1, 0.2}: mean 0.2, population std sqrt(0.02/3) = 0.081650 -> A +1.224745 (= √1.5),
    #   B -1.224745, C 0.  (g0, turn 1): {0.2, 0.4}: mean 0.3, std 0.1 -> A -1, B +1.
    # (g1, turn 0): {0.5}, a singleton -> 0. Answer turns and padding: 0.
    z = turn_group_normalised_ig(ig, group, mask, epsilon=0.0)
    root = math.sqrt(1.5)
    expected = [[root, -1, 0], [-root, 1, 0], [0, 0, 0], [0, 0, 0]]
    assert z.tolist() == [pytest.approx(r, abs=1e-5) for r in expected]


def test_a2tgpo_by_hand():
    ig, reward, group, mask = a2tgpo_batch()
    root = math.sqrt(1.5)
    # D_k = Σ_{j=k}^{n-1} ĨG_j / √(n - k) (1-based k; n = 3 for A and B, 2 for C and D; D_n = 0):
    #   A: turn 1: (1.224745 - 1)/√2 = 0.158919; turn 2: -1/√1 = -1; answer turn: 0.
    #   B: -0.158919, +1, 0.   C: 0/√1 = 0, 0.   D: 0, 0.
    d_a = (root - 1) / math.sqrt(2)
    # Â_out: group 0 rewards [1, 0, 1]: mean 2/3, sample std sqrt((1/9 + 4/9 + 1/9)/2) = 0.577350
    #   -> A, C: (1/3)/0.577350 = 0.577350; B: -1.154701. Group 1, a singleton: 0.
    out_a, out_b = (1 / 3) / math.sqrt(1 / 3), (-2 / 3) / math.sqrt(1 / 3)
    # A_k = 0.3·D_k + Â_out: A = [0.047676 + 0.577350, -0.3 + 0.577350, 0.577350] = [0.625026, 0.277350, 0.577350]
    #                        B = [-1.202377, -0.854701, -1.154701]; C = [0.577350, 0.577350]; D = [0, 0].
    adv, clip = a2tgpo_advantages(ig, reward, group, mask, epsilon=0.0)
    expected = [
        [0.3 * d_a + out_a, -0.3 + out_a, out_a],
        [-0.3 * d_a + out_b, 0.3 + out_b, out_b],
        [out_a, out_a, 0.0],
        [0.0, 0.0, 0.0],
    ]
    assert adv.tolist() == [pytest.approx(r, abs=1e-5) for r in expected]
    assert adv[0].tolist() == pytest.approx([0.625026, 0.277350, 0.577350], abs=1e-5)
    # c_k = 1 + 0.3(2σ(ĨG_k) - 1): σ(1.224745) = 0.772893 -> 1.163736; σ(-1) = 0.268941 -> 0.861365;
    #   B mirrors A: 0.836264, 1.138635. ĨG = 0 (C, D) -> 1; answer turns and padding -> 1.
    c = [1 + 0.3 * (2 * sigmoid(x) - 1) for x in (root, -1.0)]
    expected_clip = [[c[0], c[1], 1], [2 - c[0], 2 - c[1], 1], [1, 1, 1], [1, 1, 1]]
    assert clip.tolist() == [pytest.approx(r, abs=1e-5) for r in expected_clip]
    assert clip[0, :2].tolist() == pytest.approx([1.163736, 0.861365], abs=1e-5)
    # γ = 0.5: A's first turn D = (1.224745 + 0.5·(-1))/√2 = 0.512472.
    adv, _ = a2tgpo_advantages(ig, reward, group, mask, gamma=0.5, epsilon=0.0)
    assert adv[0, 0].item() == pytest.approx(0.3 * 0.512472 + out_a, abs=1e-5)


def test_a2tgpo_takes_a_given_outcome_advantage():
    ig, reward, group, mask = a2tgpo_batch()
    outcome = t([2.0, -1.0, 0.5, 0.0])
    adv, _ = a2tgpo_advantages(ig, reward, group, mask, outcome=outcome, alpha=0.0)
    assert adv.tolist() == [[2, 2, 2], [-1, -1, -1], [0.5, 0.5, 0], [0, 0, 0]]


def test_group_zscore_is_grpo_with_one_step_per_trajectory():
    # [1, 0, 1] in one group -> sample std 0.57735: [0.57735, -1.1547, 0.57735]; [3] alone and [2, 2] -> 0.
    adv = group_zscore(t([1.0, 0.0, 1.0, 3.0, 2.0, 2.0]), torch.tensor([0, 0, 0, 1, 2, 2]), epsilon=0.0)
    assert adv.tolist() == pytest.approx([0.57735, -1.154701, 0.57735, 0.0, 0.0, 0.0], abs=1e-5)


# ---------------------------------------------------------------- properties


@st.composite
def ig_batches(draw, max_groups: int = 3, max_size: int = 4, max_turns: int = 5):
    lengths, groups, rows, rewards = [], [], [], []
    for g in range(draw(st.integers(1, max_groups))):
        for _ in range(draw(st.integers(1, max_size))):
            lengths.append(draw(st.integers(1, max_turns)))
            groups.append(g)
            rewards.append(draw(st.sampled_from([0.0, 1.0, draw(st.floats(0, 1))])))
    width = max(lengths)
    p = [[draw(st.floats(1e-3, 1.0)) for _ in range(width + 1)] for _ in lengths]
    return t(p), prefix_mask(lengths, width), torch.tensor(groups), t(rewards)


@settings(max_examples=50, deadline=None)
@given(ig_batches(), st.booleans())
def test_information_gain_telescopes(data, log):
    p, mask, _, _ = data
    gain = information_gain(p, mask, log=log)
    last = mask.sum(1)
    ends = p.gather(1, last[:, None]).squeeze(1)
    expected = (ends.log() - p[:, 0].log()) if log else ends - p[:, 0]
    assert gain.sum(1).tolist() == pytest.approx(expected.tolist(), abs=1e-9)
    assert (gain[~mask] == 0).all()


@settings(max_examples=50, deadline=None)
@given(ig_batches(), st.sampled_from([1.0, 0.9, 0.5]))
def test_igpo_properties(data, gamma):
    p, mask, group, reward = data
    ig = information_gain(p, mask)
    adv = igpo_advantages(ig, reward, group, mask, gamma=gamma)
    assert torch.isfinite(adv).all() and (adv[~mask] == 0).all()
    # The answer turn's advantage is its own normalised outcome; with γ = 1 the first turn's advantage is the sum of
    # the trajectory's normalised rewards, and those sum to 0 over a prompt group.
    if gamma == 1.0:
        for g in group.unique():
            assert adv[group == g, 0].sum().item() == pytest.approx(0.0, abs=1e-6)
    # Rows are exchangeable.
    perm = torch.randperm(len(reward))
    assert torch.allclose(igpo_advantages(ig[perm], reward[perm], group[perm], mask[perm], gamma=gamma), adv[perm])


@settings(max_examples=50, deadline=None)
@given(ig_batches(), st.sampled_from([1.0, 0.9]), st.sampled_from([0.3, 0.5]))
def test_a2tgpo_properties(data, gamma, beta):
    p, mask, group, reward = data
    ig = information_gain(p, mask)
    adv, clip = a2tgpo_advantages(ig, reward, group, mask, gamma=gamma, beta=beta)
    z = turn_group_normalised_ig(ig, group, mask)
    outcome = group_zscore(reward, group)
    last = mask.sum(1) - 1
    rows = torch.arange(len(reward))
    informative = mask.clone()
    informative[rows, last] = False
    # Clip factors: in [1 - β, 1 + β], above 1 exactly where the turn beat its turn group, 1 elsewhere.
    assert ((clip >= 1 - beta) & (clip <= 1 + beta)).all()
    assert torch.equal(clip[informative] > 1, z[informative] > 0)
    assert (clip[~informative] == 1).all()
    # The answer turn gets Â_out only; padding 0; the turn before the answer gets α·ĨG on top of Â_out.
    assert torch.allclose(adv[rows, last], outcome)
    assert (adv[~mask] == 0).all()
    before = last >= 1
    k = (last - 1).clamp(min=0)
    assert torch.allclose(adv[rows, k][before] - outcome[before], 0.3 * z[rows, k][before])
    # Sign convention: A_k - Â_out has the sign of D_k (γ^{j-k} ĨG_j summed, over √(terms)).
    tail = torch.zeros_like(z)
    acc = torch.zeros(len(reward), dtype=D)
    for col in range(z.shape[1] - 1, -1, -1):
        acc = z[:, col] + gamma * acc
        tail[:, col] = acc
    extra = adv - outcome[:, None]
    strong = informative & (tail.abs() > 1e-9)
    assert torch.equal(torch.sign(extra[strong]), torch.sign(tail[strong]))
    # Turn-group normalisation: ĨG sums to 0 in every (group, turn index) cell, so adding any offset to the IG of
    # one (group, turn index) cell changes nothing.
    shifted = ig.clone()
    cell = (group == group[0])[:, None] & (torch.arange(ig.shape[1]) == 0)[None, :]
    shifted[cell] += 0.25
    adv2, clip2 = a2tgpo_advantages(shifted, reward, group, mask, gamma=gamma, beta=beta)
    assert torch.allclose(adv2, adv, atol=1e-4) and torch.allclose(clip2, clip, atol=1e-4)


# ---------------------------------------------------------------- the registered estimators, end to end on records
IG_RECORDS = [  # answer_logprobs = log p after 0..T actions
    {"id": "a", "group": "g", "reward": 1.0, "success": True, "step_tokens": [2, 3, 1],
     "answer_logprobs": [math.log(p) for p in (0.1, 0.3, 0.6, 0.9)]},  # IG = [0.2, 0.3, (0.3: answer turn)]
    {"id": "b", "group": "g", "reward": 0.0, "success": False, "step_tokens": [4, 2],
     "answer_logprobs": [math.log(p) for p in (0.2, 0.1, 0.5)]},  # IG = [-0.1, (0.4: answer turn)]
    {"id": "c", "group": "h", "reward": 1.0, "success": True, "step_tokens": [5],
     "answer_logprobs": [math.log(0.5), math.log(0.7)]},  # alone in its group, one (answer) turn
]  # fmt: skip
EPS = 1e-6


def credit_records(tmp_path, method, records=IG_RECORDS, *extra):
    from deltattg.cli import main

    src, out = tmp_path / "in.jsonl", tmp_path / f"{method}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["credit", str(src), "--method", method, "--out", str(out), *extra]) == 0
    return {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}


def test_igpo_credit_command_by_hand(tmp_path):
    out = credit_records(tmp_path, "igpo")
    # Turn rewards: a [0.2, 0.3, R = 1], b [-0.1, R = 0]; pooled over group g: mean 1.4 / 5 = 0.28, deviations
    # a [-0.08, 0.02, 0.72], b [-0.38, -0.28]; population variance (0.0064 + 0.0004 + 0.5184 + 0.1444 + 0.0784) / 5
    # = 0.1496, σ = sqrt(0.1496 + 1e-8) ≈ 0.386782. γ = 1 tail sums: a [0.66, 0.74, 0.72] / σ ≈ [1.70639, 1.91322,
    # 1.86151]; b [-0.66, -0.28] / σ ≈ [-1.70639, -0.72392].
    s = math.sqrt(0.1496 + 1e-8) + EPS
    assert out["a"]["step_advantages"] == pytest.approx([0.66 / s, 0.74 / s, 0.72 / s], rel=1e-5)
    assert out["b"]["step_advantages"] == pytest.approx([-0.66 / s, -0.28 / s], rel=1e-5)
    assert out["a"]["step_advantages"] == pytest.approx([1.70639, 1.91322, 1.86151], abs=1e-5)
    # A_i is the GRPO outcome z-score: rewards [1, 0], sample std sqrt(0.5): ±0.5 / 0.707108 ≈ ±0.707106.
    assert out["a"]["advantage"] == pytest.approx(0.5 / (math.sqrt(0.5) + EPS), rel=1e-6) == -out["b"]["advantage"]
    # c: its only turn is the answer turn; one reward in its group: σ = 1, centred on itself -> 0.
    assert out["c"]["step_advantages"] == [0.0] and out["c"]["advantage"] == 0.0
    assert [out[k]["credit"] for k in "abc"] == ["information_gain", "information_gain", "zero_advantage"]
    assert "step_weights" not in out["a"] and "clip_scale" not in out["a"]  # additive; the fixed clip range
    assert out["a"]["answer_logprobs"] == IG_RECORDS[0]["answer_logprobs"]  # the input record is kept as it was


def test_a2tgpo_credit_command_by_hand(tmp_path):
    out = credit_records(tmp_path, "a2tgpo")
    # ĨG per (group, turn index) over the non-answer turns: turn 0 of g holds a's 0.2 and b's -0.1: mean 0.05,
    # σ = sqrt(0.0225 + 1e-8) ≈ 0.15, ĨG = ±0.15 / (σ + ε) ≈ ±0.99999; turn 1 holds a's 0.3 alone: ĨG = 0.
    z = 0.15 / (math.sqrt(0.0225 + 1e-8) + EPS)
    outcome = 0.5 / (math.sqrt(0.5) + EPS)  # Â_out ≈ 0.707106, as above
    # a (n = 3): D_1 = (ĨG_1 + ĨG_2) / √2 = z / √2, D_2 = 0 / √1; A = [0.3·z/√2 + Â, Â, Â] ≈ [0.919236, 0.707106,
    # 0.707106]. b (n = 2): D_1 = -z / √1; A = [-0.3·z - Â, -Â] ≈ [-1.007104, -0.707106].
    assert out["a"]["step_advantages"] == pytest.approx([0.3 * z / math.sqrt(2) + outcome, outcome, outcome], rel=1e-5)
    assert out["b"]["step_advantages"] == pytest.approx([-0.3 * z - outcome, -outcome], rel=1e-5)
    assert out["a"]["step_advantages"][0] == pytest.approx(0.919236, abs=1e-5)
    # c_k = 1 + 0.3 (2σ(ĨG) − 1): a's turn 0 1 + 0.3·tanh(z/2) ≈ 1.138634, b's ≈ 0.861366; ĨG = 0 -> 1; answer turns 1.
    c = 0.3 * (2 * sigmoid(z) - 1)
    assert out["a"]["clip_scale"] == pytest.approx([1 + c, 1.0, 1.0], rel=1e-6)
    assert out["b"]["clip_scale"] == pytest.approx([1 - c, 1.0], rel=1e-6)
    assert out["a"]["clip_scale"][0] == pytest.approx(1.138634, abs=1e-5)
    assert out["c"]["step_advantages"] == [0.0] and out["c"]["clip_scale"] == [1.0]
    assert [out[k]["credit"] for k in "abc"] == ["information_gain", "information_gain", "zero_advantage"]


@pytest.mark.parametrize("method", ["igpo", "a2tgpo"])
def test_a_trajectory_without_steps_is_not_called_zero_advantage_when_its_advantage_is_not(tmp_path, method):
    """A 0-action failure beside a success in its group: A_i = −0.707, no steps to give it to; its label says what the
    estimator is, not ``zero_advantage``."""
    records = [{"id": "won", "group": "g", "reward": 1.0, "success": True, "step_tokens": [3],
                "answer_logprobs": [-2.0, -0.1], "steps": [{"observation": "o", "reward": 1.0, "verified": True}]},
               {"id": "none", "group": "g", "reward": 0.0, "success": False, "step_tokens": [],
                "answer_logprobs": [-2.0], "steps": []}]  # fmt: skip
    out = credit_records(tmp_path, method, records)
    assert out["none"]["advantage"] == pytest.approx(-0.5 / (math.sqrt(0.5) + EPS), rel=1e-6)
    assert out["none"]["credit"] != "zero_advantage" and out["none"]["step_advantages"] == []


def test_information_gain_options_reach_the_estimators(tmp_path):
    # --ig-log: IG = differences of the mean log-probs: a [log 3, log 2], b [log 0.5]. A²TGPO, turn 0 of g: log 3 vs
    # log 0.5 -> ĨG = ±1 (two values), so nothing but the scale changes with --ig-alpha 1 --ig-beta 0.5.
    out = credit_records(tmp_path, "a2tgpo", IG_RECORDS, "--ig-log", "--ig-alpha", "1", "--ig-beta", "0.5")
    gap = (math.log(3) - math.log(0.5)) / 2
    z = gap / (math.sqrt(gap**2 + 1e-8) + EPS)
    outcome = 0.5 / (math.sqrt(0.5) + EPS)
    assert out["b"]["step_advantages"] == pytest.approx([-z - outcome, -outcome], rel=1e-5)
    assert out["a"]["clip_scale"][0] == pytest.approx(1 + 0.5 * (2 * sigmoid(z) - 1), rel=1e-6)
    # --ig-gamma 0: IGPO's advantage is the turn's own normalised reward: a [-0.08, 0.02, 0.72] / σ.
    out = credit_records(tmp_path, "igpo", IG_RECORDS, "--ig-gamma", "0")
    s = math.sqrt(0.1496 + 1e-8) + EPS
    assert out["a"]["step_advantages"] == pytest.approx([-0.08 / s, 0.02 / s, 0.72 / s], rel=1e-4)


def test_the_estimators_are_registered_with_what_they_read():
    from deltattg.credit import CreditConfig, Reads, get_estimator

    for name, options in (("igpo", ["ig_gamma", "ig_log"]), ("a2tgpo", ["ig_gamma", "ig_alpha", "ig_beta", "ig_log"])):
        estimator = get_estimator(name)
        assert estimator.reads == frozenset({Reads.ANSWER_PROBS}) and not estimator.needs_meter
        assert [o.name for o in estimator.options] == options
        assert all(getattr(CreditConfig(), o.name) == o.default for o in estimator.options)
        assert "per-turn answer probabilities" in estimator.inputs()
    defaults = CreditConfig()
    assert (defaults.ig_gamma, defaults.ig_alpha, defaults.ig_beta, defaults.ig_log) == (1.0, 0.3, 0.3, False)
    assert (defaults.gamma, defaults.alpha) == (0.95, 1.0)  # GiGPO's γ and HGPO's α keep their own defaults
    for bad in ({"ig_gamma": 1.5}, {"ig_alpha": -1.0}, {"ig_beta": 1.2}, {"ig_beta": float("nan")}, {"ig_log": 1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CreditConfig(**bad)


def test_the_estimators_refuse_a_batch_without_answer_logprobs():
    from deltattg.credit import CreditConfig, get_estimator
    from deltattg.credit.layouts import step_batch

    batch = step_batch([1.0, 0.0], [True, False], ["g", "g"], [[2, 3], [4]])
    for name in ("igpo", "a2tgpo"):
        with pytest.raises(ValueError, match="answer_logprobs"):
            get_estimator(name)(batch, CreditConfig())
    with pytest.raises(ValueError, match="trajectory 1: 3 entries for 1 steps"):
        step_batch([1.0, 0.0], [True, False], ["g", "g"], [[2, 3], [4]], answer_logprobs=[[-1, -1, -1], [-1, -1, -1]])
    padded = step_batch([1.0, 0.0], [True, False], ["g", "g"], [[2, 3], [4]], answer_logprobs=[[-1, -2, -3], [-4, -5]])
    assert padded.answer_logprobs.tolist() == [[-1, -2, -3], [-4, -5, 0]]  # [n, S + 1], 0 past T_i + 1


BAD_IG_RECORDS = {
    "missing": (lambda r: {k: v for k, v in r.items() if k != "answer_logprobs"}, "answer_logprobs: missing, and "
                "--method {method} reads the reference answer's mean token log-prob after 0..T steps (4 numbers"),
    "too short": (lambda r: dict(r, answer_logprobs=[-1.0, -2.0, -3.0]),
                  "answer_logprobs: has 3 entries but the trajectory has 3 steps: it needs 4"),
    "not a list": (lambda r: dict(r, answer_logprobs=-1.0), "answer_logprobs: must be a list of 4 log-probabilities"),
    "positive": (lambda r: dict(r, answer_logprobs=[-1.0, 0.5, -1.0, 0.0]),
                 "answer_logprobs[1]: must be <= 0 (a log-probability), got 0.5"),
    "not a number": (lambda r: dict(r, answer_logprobs=[-1.0, -1.0, "x", 0.0]), "answer_logprobs[2]: must be a number"),
}  # fmt: skip


@pytest.mark.parametrize("method", ["igpo", "a2tgpo"])
@pytest.mark.parametrize("case", sorted(BAD_IG_RECORDS))
def test_bad_answer_logprobs_name_file_line_and_field(tmp_path, capsys, method, case):
    from deltattg.cli import main

    change, message = BAD_IG_RECORDS[case]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    records = [IG_RECORDS[1], change(IG_RECORDS[0]), IG_RECORDS[2]]  # the bad record (3 steps) sits on line 2
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["credit", str(src), "--method", method, "--out", str(out)]) == 2
    assert f"{src}:2: {message.format(method=method)}" in capsys.readouterr().err
    assert not out.exists()
