"""HGPO arithmetic (deltattg.credit.hgpo): hand-worked batches, and agreement with verl-agent's per-row reference on
random batches converted to its one-row-per-step layout."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deltattg.credit.hgpo import hgpo_advantages
from test_credit_gigpo import (
    NICE,
    batch,
    close,
    layouts,
    reference_discounted_returns,
    reference_episode_norm_reward,
    to_rows,
)

EPS = 1e-6

# ---------------------------------------------------------------------------------------------------------------------
# Hand-worked batch 1: mean only, γ = 1, one prompt group, K = 2 (k = 1, 2, 3), α = 1 (weights k + 1 = 2, 3, 4).
#   A: anchors [0, 1, 2], step rewards [0, 0, 1] -> returns [1, 1, 1]
#   B: anchors [0, 1, 3], step rewards [0, 0, 0] -> returns [0, 0, 0]
#   C: anchors [0, 4, 2], step rewards [0, 1, 0] -> returns [1, 1, 0]
#   D: anchors [5, 1, 2], step rewards [0, 0, 0] -> returns [0, 0, 0]
# k = 1: anchor 0 {A0 1, B0 0, C0 1}: mean 2/3 -> A0 1/3, B0 −2/3, C0 1/3
#        anchor 1 {A1 1, B1 0, D1 0}: mean 1/3 -> A1 2/3, B1 −1/3, D1 −1/3
#        anchor 2 {A2 1, C2 0, D2 0}: mean 1/3 -> A2 2/3, C2 −1/3, D2 −1/3
#        anchors 3 {B2}, 4 {C1}, 5 {D0}: singletons, no item
# k = 2 (t ≥ 1): (0,1) {A1 1, B1 0}: A1 +0.5, B1 −0.5;  (1,2) {A2 1, D2 0}: A2 +0.5, D2 −0.5;
#        (0,4) {C1}, (5,1) {D1}, (1,3) {B2}, (4,2) {C2}: singletons
# k = 3 (t = 2): (0,1,2), (0,1,3), (0,4,2), (5,1,2): all singletons
# A = Σ w a / Σ w over the nonzero items:
#   A0 = 2·(1/3)/2   B0 = 2·(−2/3)/2   C0 = 2·(1/3)/2   D0 = 0
#   A1 = (2·2/3 + 3·0.5)/5   B1 = (2·(−1/3) + 3·(−0.5))/5   C1 = 0   D1 = 2·(−1/3)/2
#   A2 = (2·2/3 + 3·0.5)/5   B2 = 0   C2 = 2·(−1/3)/2   D2 = (2·(−1/3) + 3·(−0.5))/5
# ---------------------------------------------------------------------------------------------------------------------
HISTORY = batch(
    [1.0, 0.0, 1.0, 0.0],
    [[0, 0, 1], [0, 0, 0], [0, 1, 0], [0, 0, 0]],
    [[0, 1, 2], [0, 1, 3], [0, 4, 2], [5, 1, 2]],
    [0, 0, 0, 0],
)


def test_hgpo_history_groups_mean_only_by_hand():
    up, down = (2 * 2 / 3 + 3 * 0.5) / 5, (2 * (-1 / 3) + 3 * (-0.5)) / 5
    _, adv = hgpo_advantages(*HISTORY, history=2, alpha=1.0, gamma=1.0, norm="mean")
    close(
        adv,
        [
            [2 * (1 / 3) / 2, up, up],
            [2 * (-2 / 3) / 2, down, 0.0],
            [2 * (1 / 3) / 2, 0.0, 2 * (-1 / 3) / 2],
            [0.0, 2 * (-1 / 3) / 2, down],
        ],
    )


def test_hgpo_history_zero_is_k_one_only():
    # K = 0: only the anchor groups (k = 1, weight 2): A1 = 2/3, B1 = −1/3, A2 = 2/3 …
    _, adv = hgpo_advantages(*HISTORY, history=0, gamma=1.0, norm="mean")
    w = 1.0  # one item: its weight 2 cancels
    close(
        adv,
        [
            [w / 3, w * 2 / 3, w * 2 / 3],
            [-w * 2 / 3, -w / 3, 0.0],
            [w / 3, 0.0, -w / 3],
            [0.0, -w / 3, -w / 3],
        ],
    )


def test_hgpo_alpha_by_hand():
    # α = 2: weights (k+1)² = 4 (k = 1), 9 (k = 2). A1 = (4·2/3 + 9·0.5)/13; A0 = 4·(1/3)/4 = 1/3.
    _, adv = hgpo_advantages(*HISTORY, history=2, alpha=2.0, gamma=1.0, norm="mean")
    close(adv[0], [4 * (1 / 3) / 4, (4 * 2 / 3 + 9 * 0.5) / 13, (4 * 2 / 3 + 9 * 0.5) / 13])
    # α = 0: uniform weights 1: A1 = (2/3 + 0.5)/2
    _, adv = hgpo_advantages(*HISTORY, history=2, alpha=0.0, gamma=1.0, norm="mean")
    close(adv[0], [1 / 3, (2 / 3 + 0.5) / 2, (2 / 3 + 0.5) / 2])


# ---------------------------------------------------------------------------------------------------------------------
# Hand-worked batch 2: mean-std (population σ), γ = 0 (returns = step rewards), repeated anchors inside a trajectory,
# a k = 3 match, K = 2, α = 1.
#   A: anchors [0, 0, 1], rewards [1, 0, 1]
#   B: anchors [0, 0, 1], rewards [0, 0, 0]
#   C: anchors [0, 1, 1], rewards [0, 1, 1]
# k = 1: anchor 0 {A0 1, A1 0, B0 0, B1 0, C0 0}: mean 0.2, pop var (0.64 + 4·0.04)/5 = 0.16, σ = 0.4
#          -> A0 0.8/(0.4+ε); A1, B0, B1, C0 −0.2/(0.4+ε)
#        anchor 1 {A2 1, B2 0, C1 1, C2 1}: mean 0.75, pop var (3·0.0625 + 0.5625)/4 = 0.1875, σ1 = √0.1875
#          -> A2, C1, C2 0.25/(σ1+ε); B2 −0.75/(σ1+ε)
# k = 2: (0,0) {A1 0, B1 0}: all equal -> 0, dropped;  (0,1) {A2 1, B2 0, C1 1}: mean 2/3, pop var 2/9, σ2 = √2/3
#          -> A2, C1 (1/3)/(σ2+ε); B2 (−2/3)/(σ2+ε);  (1,1) {C2}: singleton
# k = 3: (0,0,1) {A2 1, B2 0}: mean 0.5, σ 0.5 -> ±0.5/(0.5+ε);  (0,1,1) {C2}: singleton
# ---------------------------------------------------------------------------------------------------------------------
REPEATS = batch([1.0, 0.0, 1.0], [[1, 0, 1], [0, 0, 0], [0, 1, 1]], [[0, 0, 1], [0, 0, 1], [0, 1, 1]], [0, 0, 0])


def test_hgpo_mean_std_repeats_and_long_history_by_hand():
    s1, s2 = math.sqrt(0.1875), math.sqrt(2) / 3
    a0 = 2 * (0.8 / (0.4 + EPS)) / 2
    b = 2 * (-0.2 / (0.4 + EPS)) / 2
    a2 = (2 * 0.25 / (s1 + EPS) + 3 * (1 / 3) / (s2 + EPS) + 4 * 0.5 / (0.5 + EPS)) / 9
    b2 = (2 * (-0.75) / (s1 + EPS) + 3 * (-2 / 3) / (s2 + EPS) + 4 * (-0.5) / (0.5 + EPS)) / 9
    c1 = (2 * 0.25 / (s1 + EPS) + 3 * (1 / 3) / (s2 + EPS)) / 5
    c2 = 2 * 0.25 / (s1 + EPS) / 2
    _, adv = hgpo_advantages(*REPEATS, history=2, alpha=1.0, gamma=0.0, norm="mean_std")
    close(adv, [[a0, b, a2], [b, b, b2], [b, c1, c2]])


# ---------------------------------------------------------------------------------------------------------------------
# Hand-worked batch 3: the optional base (episode) item, mean-std, γ = 0.5, two prompt groups.
#   group 0: P anchors [0], R 1, r [1]; Q anchors [0], R 0, r [0]
#     episode rows {1, 0}: mean 0.5, sample σ √0.5 -> ±0.5/(√0.5+ε)
#     k = 1, anchor 0 {1, 0}: population σ 0.5 -> ±0.5/(0.5+ε);  no k ≥ 2 groups (one step)
#     base: P = (1·ep + 2·s)/3;  without base: P = 2·s/2
#   group 1: U anchors [7, 8], R 1, r [0, 1]; V anchors [9], R 0, r [0]
#     episode rows U, U (1), V (0): mean 2/3, sample var (2/9 + 4/9)/2 = 1/3 -> U (1/3)/(√(1/3)+ε), V (−2/3)/(…)
#     every hierarchy group is a singleton (anchors 7, 8, 9; window (7, 8)) -> only the base item: ep
# ---------------------------------------------------------------------------------------------------------------------
BASE = batch([1.0, 0.0, 1.0, 0.0], [[1], [0], [0, 1], [0]], [[0], [0], [7, 8], [9]], [0, 0, 1, 1])


def test_hgpo_base_group_by_hand():
    ep0 = 0.5 / (math.sqrt(0.5) + EPS)
    ep_u, ep_v = (1 / 3) / (math.sqrt(1 / 3) + EPS), (-2 / 3) / (math.sqrt(1 / 3) + EPS)
    s = 0.5 / (0.5 + EPS)
    episode, adv = hgpo_advantages(*BASE, gamma=0.5, norm="mean_std", base_group=True)
    close(episode, [ep0, -ep0, ep_u, ep_v])
    p = (ep0 + 2 * s) / 3
    close(adv, [[p, 0.0], [-p, 0.0], [ep_u, ep_u], [ep_v, 0.0]])
    # off (the default): the episode term is still returned, the advantages use the step groups only
    episode_off, adv_off = hgpo_advantages(*BASE, gamma=0.5, norm="mean_std")
    close(episode_off, [ep0, -ep0, ep_u, ep_v])
    close(adv_off, [[2 * s / 2, 0.0], [-2 * s / 2, 0.0], [0.0, 0.0], [0.0, 0.0]])


@pytest.mark.parametrize("alpha, history", [(22.0, 64), (100.0, 10), (100.0, 64), (-40.0, 2), (-100.0, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hgpo_extreme_length_weights_by_hand(alpha, history, dtype):
    # Issue 21: every α in [−100, 100] and K <= 64 the CLI accepts. Batch 1 (mean only, γ = 1): steps with one item
    # keep it whatever its weight (A0 = 1/3, D1 = −1/3, ...); A1, B1, A2, D2 mix a k = 1 and a k = 2 item with
    # weights 2^α and 3^α: (2^α·a1 + 3^α·a2)/(2^α + 3^α), in float64 here. Raw (K+2)^α weights overflowed float32
    # (every step 0 at α = 22, K = 64) and ε swamped tiny ones (α = −40: A1 ≈ 1e−6 instead of ≈ 2/3).
    mix = lambda a1, a2: (2.0**alpha * a1 + 3.0**alpha * a2) / (2.0**alpha + 3.0**alpha)  # noqa: E731
    up, down = mix(2 / 3, 0.5), mix(-1 / 3, -0.5)
    data = [t.to(dtype) if t.is_floating_point() else t for t in HISTORY]
    _, adv = hgpo_advantages(*data, history=history, alpha=alpha, gamma=1.0, norm="mean")
    expected = [[1 / 3, up, up], [-2 / 3, down, 0.0], [1 / 3, 0.0, -1 / 3], [0.0, -1 / 3, down]]
    rtol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=dtype), atol=1e-12, rtol=rtol)
    assert adv.dtype == dtype


def test_hgpo_bad_input_and_dtype():
    episode, adv = hgpo_advantages(*(t.float() if t.is_floating_point() else t for t in BASE))
    assert episode.dtype == adv.dtype == torch.float32
    with pytest.raises(ValueError, match="history"):
        hgpo_advantages(*BASE, history=-1)
    with pytest.raises(ValueError, match="norm"):
        hgpo_advantages(*BASE, norm="median")
    if torch.cuda.is_available():
        _, adv_c = hgpo_advantages(*(t.cuda() for t in HISTORY), gamma=1.0, norm="mean")
        assert adv_c.device.type == "cuda"
        torch.testing.assert_close(adv_c.cpu(), hgpo_advantages(*HISTORY, gamma=1.0, norm="mean")[1])


# ---------------------------------------------------------------------------------------------------------------------
# verl-agent's arithmetic, per row
# ---------------------------------------------------------------------------------------------------------------------
# A line-by-line transcription of the arithmetic of verl-agent's recipe/hgpo/core_hgpo.py (hgpo_advantage_estimate and
# trajectory_advantages), read from the stored copies zzj1111/alfworldauto @ 51c1a039c38f1af54b09c05b81b76ce52d72c383
# and OliverLeeXZ/SERL @ 3c63ef3d9f8a010f8b97421c0a7f6186e28f57e2 (identical arithmetic; langfengQ/verl-agent itself is
# not in the stored index). Kept: per prompt group, per trajectory, clusters keyed by (k, last-k anchors) over
# k = 1 … min(K+1, t+1), singletons skipped, population std, the nonzero filter and w = L^α/(ΣL^α + ε) with L = k + 1,
# the optional base item (k = 0). Dropped: DataProto / token dimension, the float32 casts (float64 here). The base
# item's token mean over a one-column response mask is the episode advantage itself.


def reference_hgpo(scores, step_rewards, anchor_obs, index, traj_index, history_length, epsilon, mode, alpha, base):
    N = anchor_obs.shape[0]
    all_step_adv = torch.zeros(N, dtype=step_rewards.dtype)
    base_adv_scalars = None
    if base:
        base_adv_scalars = reference_episode_norm_reward(scores, index, traj_index, epsilon, mode == "mean_norm")

    def aggregate_items(items):
        if not items:
            return torch.zeros((), dtype=step_rewards.dtype)
        advs = torch.stack([a for _, a in items])
        ks = torch.tensor([k for k, _ in items], dtype=step_rewards.dtype)
        valid = advs != 0
        if not valid.any():
            return torch.zeros((), dtype=step_rewards.dtype)
        w_raw = (ks[valid] + 1) ** alpha
        w = w_raw / (w_raw.sum() + epsilon)
        return (w * advs[valid]).sum()

    for gid in np.unique(index):
        group_indices = np.flatnonzero(index == gid)
        group_rewards = step_rewards[torch.as_tensor(group_indices)]
        uniq_traj, inv = np.unique(traj_index[group_indices], return_inverse=True)
        traj_positions = [np.flatnonzero(inv == t) for t in range(len(uniq_traj))]
        traj_h = [list(anchor_obs[group_indices][p]) for p in traj_positions]
        traj_rewards = [group_rewards[torch.as_tensor(p)] for p in traj_positions]
        traj_gidx = [group_indices[p] for p in traj_positions]
        clusters = defaultdict(list)
        for ti in range(len(uniq_traj)):
            for si in range(len(traj_h[ti])):
                for k in range(1, min(history_length + 1, si + 1) + 1):
                    clusters[(k, tuple(traj_h[ti][si - k + 1 : si + 1]))].append((ti, si))
        per_step_items = defaultdict(list)
        for (k, _), members in clusters.items():
            if len(members) <= 1:
                continue
            r = torch.stack([traj_rewards[ti][si] for ti, si in members])
            mean, std = r.mean(), r.std(unbiased=False)
            a = (r - mean) / (std + epsilon) if mode == "mean_std_norm" else r - mean
            for j, member in enumerate(members):
                per_step_items[member].append((k, a[j]))
        for ti in range(len(uniq_traj)):
            for si in range(len(traj_h[ti])):
                global_idx = int(traj_gidx[ti][si])
                items = per_step_items.get((ti, si), [])
                if base_adv_scalars is not None:
                    items = [(0, base_adv_scalars[global_idx])] + items
                all_step_adv[global_idx] = aggregate_items(items)
    return all_step_adv


# Exactly representable rewards and γ ∈ {0, 0.5, 0.75, 1}: every return, every group sum and every equal-value mean is
# exact in float64, so verl-agent's nonzero filter sees exact zeros where the arithmetic gives zero (with γ = 0.95 its
# mean of equal values can round, (x − μ) / ε then survives the filter: see deltattg.credit.hgpo's docstring).
@settings(max_examples=50, deadline=None)
@given(
    data=layouts(values=NICE),
    gamma=st.sampled_from([0.5, 1.0, 0.0, 0.75]),
    mode=st.sampled_from(["mean_std_norm", "mean_norm"]),
    history=st.integers(0, 3),
    alpha=st.sampled_from([1.0, 0.0, 2.0, 0.5]),
    base=st.booleans(),
    step_major=st.booleans(),
)
def test_hgpo_matches_verl_agent_rows(data, gamma, mode, history, alpha, base, step_major):
    reward, step_rewards, anchor, group, mask = data
    (rows, steps), scores, rewards, anchor_obs, index, traj_index = to_rows(*data, step_major)
    returns = torch.from_numpy(reference_discounted_returns(rewards, traj_index, gamma))
    expected = reference_hgpo(scores, returns, anchor_obs, index, traj_index, history, EPS, mode, alpha, base)
    norm = {"mean_std_norm": "mean_std", "mean_norm": "mean"}[mode]
    _, adv = hgpo_advantages(*data, history=history, alpha=alpha, gamma=gamma, norm=norm, base_group=base)
    # verl-agent divides by Σw + ε, we by Σw (deltattg.credit.hgpo): at α >= 0 every kept weight is >= 1, so ours is
    # larger in magnitude by a relative ε/Σw <= ε.
    torch.testing.assert_close(adv[rows, steps], expected, atol=1e-7, rtol=EPS)
    assert bool((adv[~mask] == 0).all())
