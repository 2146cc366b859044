"""A literal, per-trajectory Python transcription of Algorithm 1 (Appendix D.6), kept for two jobs only:
it is the oracle the vectorised estimators are tested against, and the baseline ``bench/`` times them against.

Plain floats and loops, one line of the algorithm after another; nothing here is used on a training path.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Hashable, Sequence

from deltattg.credit.batch import CreditConfig
from deltattg.data.trajectory import MeterOutput


def group_advantages(rewards: Sequence[float], num_steps: Sequence[int], groups: Sequence[Hashable], eps: float) -> list[float]:
    """Eq. 14, literally: every trajectory repeated T_i times in its group's rows."""
    rows: dict[Hashable, list[float]] = defaultdict(list)
    for reward, steps, group in zip(rewards, num_steps, groups):
        rows[group].extend([reward] * steps)
    out = []
    for reward, group in zip(rewards, groups):
        values = rows[group]
        if max(values, default=reward) == min(values, default=reward):
            out.append(0.0)
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        out.append((reward - mean) / (std + eps))
    return out


def bounded_normalization(q: list[float], n: list[int], cap: float) -> list[float]:
    """B_M (D.4) literally: unit token mean, cap at M, hand the excess to tokens below the cap by capacity, repeat."""
    total = sum(n)
    mass = sum(nt * qt for nt, qt in zip(n, q))
    if total == 0 or mass <= 0:
        return [1.0] * len(q)
    return capped([total * qt / mass for qt in q], n, cap)


def capped(w: list[float], n: Sequence[int], cap: float) -> list[float]:
    """Cut every value above ``cap`` to it and hand the excess to the values below by their room, repeat."""
    scale = max(sum(n), 1)
    while True:
        excess = sum(nt * (wt - cap) for nt, wt in zip(n, w) if wt > cap)
        if excess <= 1e-12 * scale:
            return [min(wt, cap) for wt in w]
        capacity = sum(nt * (cap - wt) for nt, wt in zip(n, w) if wt < cap)
        if capacity <= 0:
            return [min(wt, cap) for wt in w]
        w = [cap if wt >= cap else wt + excess * (cap - wt) / capacity for wt in w]


# ---- the robust record's stages (ours), literally -------------------------------------------------------------------
def robust_cost(r: MeterOutput, known: bool, config: CreditConfig) -> float:
    """c = p̃·min(v̂, C) + (1 − p̃)·C, p̃ the calibrated probability (b̂ without one, or with ``soft`` off), 1 on a
    state ``known`` to be completable with ``hindsight``; v̂ missing counts as C."""
    C = config.failure_cost
    p = 1.0 if r.can_complete else 0.0
    if config.soft and r.probability is not None:
        p = r.probability
    if config.hindsight and known:
        p = 1.0
    v = C if r.tokens_to_go is None else min(r.tokens_to_go, C)
    return p * v + (1.0 - p) * C


def running_median(values: list[float], window: int) -> list[float]:
    """Each value replaced by the median of the ``window`` values centred on it, the ends repeated beyond them."""
    half = window // 2
    last = len(values) - 1
    return [statistics.median(values[min(max(t + j, 0), last)] for j in range(-half, half + 1)) for t in range(len(values))]


def batch_trust(A: Sequence[float], rewards: Sequence[float], groups: Sequence[Hashable],
                meter: Sequence[Sequence[MeterOutput | None]]) -> float:
    """τ = clip(2·AUC − 1, 0, 1): AUC of each A ≠ 0 trajectory's mean p̃ over its valid readings, counted over every
    (better rewarded, worse rewarded) pair of the same group (ties half)."""
    scores = {}
    for i in range(len(A)):
        read = [r.probability if r.probability is not None else float(bool(r.can_complete)) for r in meter[i]
                if r is not None]  # fmt: skip
        if A[i] != 0 and read:
            scores[i] = sum(read) / len(read)
    pairs = [(scores[i], scores[j]) for i in scores for j in scores
             if groups[i] == groups[j] and rewards[i] > rewards[j]]  # fmt: skip
    return trust_of_pairs(pairs)


def step_trust(A: Sequence[float], rewards: Sequence[float], groups: Sequence[Hashable],
               meter: Sequence[Sequence[MeterOutput | None]], failure_cost: float) -> float:
    """``trust=delta``: τ = clip(2·AUC − 1, 0, 1), AUC over every (step of a better rewarded, step of a worse rewarded
    A ≠ 0 trajectory of the same group) pair of the meter's progress c_t − c_{t+1} between two valid consecutive
    readings, c = p̃·min(v̂, C) + (1 − p̃)·C without hindsight (ties half)."""
    def cost(r: MeterOutput) -> float:
        p = r.probability if r.probability is not None else float(bool(r.can_complete))
        v = failure_cost if r.tokens_to_go is None else min(r.tokens_to_go, failure_cost)
        return p * v + (1.0 - p) * failure_cost

    steps: dict[int, list[float]] = {}
    for i in range(len(A)):
        if A[i] != 0:
            readings = meter[i]
            steps[i] = [cost(a) - cost(b) for a, b in zip(readings, readings[1:]) if a is not None and b is not None]
    pairs = [(a, b) for i in steps for j in steps if groups[i] == groups[j] and rewards[i] > rewards[j]
             for a in steps[i] for b in steps[j]]  # fmt: skip
    return trust_of_pairs(pairs)


def trust_of_pairs(pairs: Sequence[tuple[float, float]]) -> float:
    """clip(2·AUC − 1, 0, 1) of (better, worse) score pairs, ties half; 0 without any pair."""
    if not pairs:
        return 0.0
    auc = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)
    return min(max(2.0 * auc - 1.0, 0.0), 1.0)


def algorithm1(
    rewards: Sequence[float],
    successes: Sequence[bool],
    groups: Sequence[Hashable],
    step_tokens: Sequence[Sequence[int]],
    meter: Sequence[Sequence[MeterOutput | None]],
    config: CreditConfig,
    *,
    signal: str = "ttg",
    sign_aware: bool = True,
    uniform_mixing: bool = True,
    robust: bool = False,
    histories: Sequence[Sequence[Hashable | None]] | None = None,
) -> tuple[list[float], list[list[float]], list[list[float]]]:
    """Lines 6–31 of Algorithm 1 for one batch: (A_i, w_{i,t}, Ã_{i,t,k} for every token); ``robust``: with the
    robust record's stages (ours, ``deltattg.credit.robust``) as ``config`` sets them, ``histories`` a key of each
    decision state (None: unknown) for its hindsight."""
    C = config.failure_cost
    rho = config.rho if uniform_mixing else 0.0
    T = [len(n) for n in step_tokens]
    A = group_advantages(rewards, T, groups, config.epsilon)  # line 6
    weights = [[1.0] * T[i] for i in range(len(T))]  # line 7
    valid_group: dict[Hashable, bool] = defaultdict(lambda: True)
    for i in range(len(T)):  # lines 9-12: queried states of A != 0 trajectories must all be valid
        if A[i] != 0:
            for t in range(T[i]):
                if meter[i][t] is None:
                    valid_group[groups[i]] = False
    trust = 1.0
    if robust and config.trust == "auc":
        trust = batch_trust(A, rewards, groups, meter)
    elif robust and config.trust == "delta":
        trust = step_trust(A, rewards, groups, meter, C)
    keys = histories or [[None] * T[i] for i in range(len(T))]
    visited = {k for i in range(len(T)) if successes[i] for k in keys[i] if k is not None}  # states a success visited
    for i in range(len(T)):  # line 13
        if A[i] == 0 or not valid_group[groups[i]]:
            continue  # keep original advantages (line 31)
        readings = meter[i]
        known = [successes[i] or (keys[i][t] is not None and keys[i][t] in visited) for t in range(T[i])]
        completable = [r.can_complete or (robust and config.hindsight and known[t]) for t, r in enumerate(readings)]  # type: ignore[union-attr]
        if signal in ("ttg", "feas") and not (robust and config.soft) and not any(completable):
            continue  # line 15
        potential = []
        for t in range(T[i]):  # line 17 (and the E.4 variants)
            r = readings[t]
            if robust:
                potential.append(-robust_cost(r, known[t], config))  # type: ignore[arg-type]
            elif signal == "ttg":
                potential.append(-(min(r.tokens_to_go, C) if r.can_complete else C))  # v̂ clamped to C (ours)
            elif signal == "feas":
                potential.append(-(0.0 if r.can_complete else C))
            elif signal == "logit":
                potential.append(max(-config.logit_clip, min(config.logit_clip, r.logit)))
            else:
                potential.append(r.score)
        if signal in ("ttg", "feas"):  # line 18
            potential.append(-(0.0 if successes[i] else C))
        elif signal == "logit":
            potential.append(config.logit_clip if successes[i] else -config.logit_clip)
        else:
            potential.append(rewards[i])
        if robust:
            potential = running_median(potential, config.smooth)
        delta = [potential[t + 1] - potential[t] for t in range(T[i])]  # line 19
        sign = (1.0 if A[i] > 0 else -1.0) if sign_aware else 1.0
        m = [max(sign * d, 0.0) for d in delta]  # line 20
        if sum(m) == 0:  # lines 21-22
            q = [1.0 / T[i]] * T[i]
        else:  # line 24
            q = [rho / T[i] + (1 - rho) * m[t] / sum(m) for t in range(T[i])]
        if robust:
            q = capped(q, [1] * T[i], config.share_cap / T[i])
        weights[i] = bounded_normalization(q, list(step_tokens[i]), config.cap)  # lines 26-27
        if robust:
            weights[i] = [1.0 + trust * (w - 1.0) for w in weights[i]]
    token_advantages = [  # line 28
        [A[i] * weights[i][t] for t in range(T[i]) for _ in range(step_tokens[i][t])] for i in range(len(T))
    ]
    return A, weights, token_advantages
