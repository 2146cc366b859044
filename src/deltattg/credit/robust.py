"""Robust DeltaTTG (ours, not the paper's): the stages that keep an *imperfect* meter's credit from hurting.

The paper's credit (Eq. 7–11) trusts every reading: one misread b̂ moves Δ by ≈ C, ``max(Δ, 0)`` keeps the +C half
of a spurious flip and drops the −C half, and the step next to it takes the cap M. Each stage below is one switch of
the estimator record ``robust`` (``CreditConfig`` fields; its defaults are the configuration the household benchmark
chose, listed in docs/concepts/credit.md#robust-deltattg-ours-recommended), and each leaves the paper's invariants
alone: the advantage A_i, its sign and its token mean are unchanged, and no token multiplier exceeds M.

    p̃            the meter's calibrated completion probability (b̂ as 0/1 where a meter gives none)
    hindsight    p̃ = 1 on every state of a successful trajectory — it was completed, so a b̂ = 0 there is a known
                 false negative — and on every state of another trajectory of the batch with the same history
                 (a failure's first moves that a success shared are not to blame) (``hindsight``)
    soft readout c_t = p̃_t·min(v̂_t, C) + (1 − p̃_t)·C, the expected remaining work (``soft``; Eq. 7 where p̃ ∈ {0, 1})
    smoothing    a running median of ``smooth`` states over c_0..c_T before differencing, the anchored ends kept, so a
                 single misread state cancels instead of moving two Δ by ±C (``smooth``)
    share cap    q_t ≤ κ/T_i, the excess handed to the other steps by their room below the cap (``share_cap`` κ;
                 κ = 1 is GRPO's uniform shares)
    trust        w ← 1 + τ·(w − 1) with τ = clip(2·AUC − 1, 0, 1), the AUC with which each trajectory's mean p̃
                 tells the batch's better rewarded trajectories from the worse rewarded ones of the same task: a
                 meter no better than chance on this batch's own outcomes gives exactly GRPO, and its trajectories
                 are reported as not redistributed (``trust=auc``); ``trust=delta`` reads the AUC from the steps
                 instead: the meter's own progress c_t − c_{t+1} between consecutive read states (no terminal
                 anchor), a better rewarded trajectory's steps against a worse rewarded one's of the same task — what
                 credit reads, so a meter that knows the outcome from the state's level but not which step made it
                 is not trusted
"""

from __future__ import annotations

import torch
from torch import Tensor

from deltattg.credit.batch import MeterReadings

def completion_probability(meter: MeterReadings) -> Tensor:
    """p̃_{i,t}: the meter's calibrated completion probability where it gives one, else b̂ as 0/1 (``[n, S]``)."""
    hard = meter.can_complete.to(meter.tokens_to_go.dtype)
    return hard if meter.probability is None else meter.probability.to(hard.dtype)


def known_completable(success: Tensor, step_mask: Tensor, history: Tensor | None = None) -> Tensor:
    """``[n, S]``: the decision states the batch's outcomes prove completable — every state of a successful
    trajectory, and (with ``history`` ids) every state of another trajectory whose history is one of those."""
    known = success[:, None] & step_mask
    if history is None:
        return known
    visited = history[known & (history >= 0)]
    return known | (torch.isin(history, visited) & (history >= 0))


def hindsight_probability(probability: Tensor, known: Tensor) -> Tensor:
    """p̃ = 1 on the states known to be completable (:func:`known_completable`)."""
    return torch.where(known, torch.ones_like(probability), probability)


def expected_costs(probability: Tensor, tokens_to_go: Tensor, failure_cost: float) -> Tensor:
    """c = p̃·min(v̂, C) + (1 − p̃)·C: the expected remaining work (the soft readout; Eq. 7 where p̃ is 0 or 1). In
    the readings' dtype (float32): p̃ differences below its resolution (≈ 6e-8 of C) read as no progress."""
    return probability * torch.clamp(tokens_to_go, max=failure_cost) + (1.0 - probability) * failure_cost


def running_median(trace: Tensor, num_steps: Tensor, window: int) -> Tensor:
    """Each trajectory's c_0..c_{T_i} (``[n, S+1]``, T_i = ``num_steps``) replaced by the median of the ``window``
    states centred on it, the trace's ends repeated beyond them — so c_0 (shared by the group) and the anchored c_T
    stay as they are, and one misread state between two agreeing ones is replaced. Entries past T_i are kept."""
    if window <= 1:
        return trace
    half = window // 2
    columns = torch.arange(trace.shape[1], device=trace.device)
    offsets = torch.arange(-half, half + 1, device=trace.device)
    index = (columns[None, :, None] + offsets).clamp(min=0)  # [1, S+1, window]
    index = torch.minimum(index, num_steps[:, None, None])  # repeat c_{T_i} past the end: [n, S+1, window]
    neighbours = trace[:, None, :].expand(-1, trace.shape[1], -1).gather(2, index)
    smoothed = neighbours.median(dim=2).values
    inside = columns[None, :] <= num_steps[:, None]
    return torch.where(inside, smoothed, trace)


def capped_with_refill(values: Tensor, weights: Tensor, cap: Tensor | float) -> Tensor:
    """``values`` (``[n, S]``) cut to ``cap`` and the cut-off excess Σ weights·(values − cap)⁺ handed to the entries
    below the cap in proportion to their room weights·(cap − values), so Σ weights·values is kept. One pass is exact
    when the room is at least the excess (Σ weights·(cap − values) ≥ 0): nobody is pushed over the cap. The shared
    arithmetic of B_M (D.4: multipliers, token weights, cap M) and of the share cap (shares, 1 per step, κ/T_i)."""
    below = values < cap
    excess = (weights * (values - cap).clamp(min=0)).sum(dim=1, keepdim=True)
    room = (weights * (cap - values) * below).sum(dim=1, keepdim=True)
    lam = torch.where(room > 0, excess / torch.where(room > 0, room, torch.ones_like(room)), torch.zeros_like(room))
    return torch.where(below, values + lam * (cap - values), torch.zeros_like(values) + cap)


def capped_shares(shares: Tensor, step_mask: Tensor, kappa: float) -> Tensor:
    """q_t ≤ κ/T_i (the share cap): exact in one pass, since Σ_t (κ/T_i − q_t) = κ − 1 ≥ 0; 0 at padding."""
    mask = step_mask.to(shares.dtype)
    cap = kappa / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return capped_with_refill(shares, mask, cap) * mask


def within_group_auc(scores: Tensor, reward: Tensor, group: Tensor) -> float:
    """The probability that of two trajectories *of the same group* with different rewards, the better rewarded one
    scores higher (ties count half), over every such pair in the batch (Mann–Whitney within each group, pooled; with
    binary rewards: successes against failures); NaN without any pair."""
    wins, pairs = 0.0, 0
    for g in group.unique().tolist():
        members = group == g
        r = reward[members].double().cpu()
        s = scores[members].double().cpu()
        better = r[:, None] > r[None, :]  # [i, j]: i was rewarded more than j
        if better.any():
            wins += float(((s[:, None] > s[None, :]).double() + 0.5 * (s[:, None] == s[None, :]).double())[better].sum())
            pairs += int(better.sum())
    return wins / pairs if pairs else float("nan")


def batch_trust(probability: Tensor, states: Tensor, reward: Tensor, group: Tensor) -> tuple[float, float]:
    """(AUC, τ): how well the meter tells this batch's better rewarded trajectories from the worse rewarded ones of
    the same task — the AUC of each trajectory's mean p̃ over ``states`` (``[n, S]`` mask: its validly read states;
    trajectories without any are left out) within groups, over the pairs whose rewards differ (partial rewards,
    such as τ²'s, give pairs too) — and τ = clip(2·AUC − 1, 0, 1): 0 (GRPO) for a meter no better than chance on this
    batch, or when no group holds two different rewards among the read trajectories."""
    counted = states.sum(dim=1)
    read = counted > 0
    score = (probability.double() * states).sum(dim=1) / counted.clamp(min=1)
    auc = within_group_auc(score[read], reward[read], group[read])
    return auc, trust_from_auc(auc)


def trust_from_auc(auc: float) -> float:
    """τ = clip(2·AUC − 1, 0, 1); 0 where the AUC is undefined (NaN: no pair)."""
    return 0.0 if auc != auc else min(max(2.0 * auc - 1.0, 0.0), 1.0)


def step_progress(costs: Tensor, read: Tensor) -> tuple[Tensor, Tensor]:
    """The meter's own progress c_t − c_{t+1} over each step between two read decision states (``[n, S−1]``; the
    terminal state, whose cost is the outcome's, is not read), and the mask of those steps."""
    return costs[:, :-1] - costs[:, 1:], read[:, :-1] & read[:, 1:]


def step_trust(probability: Tensor, tokens_to_go: Tensor, read: Tensor, reward: Tensor, group: Tensor,
               failure_cost: float) -> tuple[float, float]:
    """(AUC, τ) of ``trust=delta``: the probability that a step of a better rewarded trajectory shows more of the
    meter's own progress (:func:`step_progress` of the soft readout c = p̃·min(v̂, C) + (1 − p̃)·C, no hindsight)
    than a step of a worse rewarded trajectory of the same group, over every such pair of steps (ties half), and
    τ = clip(2·AUC − 1, 0, 1). A meter whose readings do not change from step to step scores 0.5 (τ = 0)."""
    costs = expected_costs(probability.double(), tokens_to_go.double(), failure_cost)
    progress, steps = step_progress(costs, read)
    trajectory = steps.nonzero(as_tuple=True)[0]
    auc = within_group_auc(progress[steps], reward[trajectory], group[trajectory])
    return auc, trust_from_auc(auc)


def trusted_weights(weights: Tensor, trust: float, step_mask: Tensor) -> Tensor:
    """w ← 1 + τ·(w − 1) on real steps: the redistribution scaled by the trust τ ∈ [0, 1] (the token mean stays 1,
    every multiplier stays in (0, M])."""
    return torch.where(step_mask, 1.0 + trust * (weights - 1.0), weights)
