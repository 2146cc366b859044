"""DeltaTTG credit assignment (§3.2 Eq. 7–11, Appendix D.4, Algorithm 1) and its E.4 ablations.

Every variant follows the same path; only the progress signal Δ and two switches change:

    Φ (potential per state, terminal anchored)  ->  Δ_t = Φ_{t+1} − Φ_t          (Eq. 8 with Φ = −c)
    -> mass m_t (sign-aware, Eq. 9)  ->  shares q_t (uniform mixing ρ, Eq. 10)
    -> token weights w = B_M(q; n) (D.4)  ->  Ã_{i,t,k} = A_i · w_{i,t} (Eq. 11)

and Algorithm 1's rules decide who is redistributed at all: A_i = 0 keeps 0 and is not queried; an invalid queried
reading anywhere in a group keeps the whole group's original advantages; a trajectory whose every state is
predicted unsuccessful keeps its original advantage (variants with a completion prediction b̂ only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from deltattg.credit import robust
from deltattg.credit.batch import (
    MAX_CREDIT_SETTING,
    TRUST_MODES,
    Credit,
    CreditConfig,
    Fallback,
    MeterReadings,
    StepBatch,
)
from deltattg.credit.gigpo import STEP_WEIGHT, gigpo_step_advantage
from deltattg.credit.grpo import group_sum, outcome_advantage
from deltattg.credit.registry import Estimator, Option, Reads, register, register_estimator

Signal = Literal["ttg", "feas", "logit", "value"]


def append_terminal(values: Tensor, terminal: Tensor, num_steps: Tensor) -> Tensor:
    """``[n, S] -> [n, S+1]``: the nonterminal values of each trajectory followed by its terminal value at T_i (also
    when S = 0: a batch of trajectories without actions has only terminal states)."""
    out = torch.cat([values, values.new_zeros(values.shape[0], 1)], dim=1)
    return out.scatter(1, num_steps[:, None], terminal[:, None].to(out.dtype))


def state_costs(meter: MeterReadings, failure_cost: float) -> Tensor:
    """c_{i,t} = min(v̂_{i,t}, C) if b̂_{i,t} = 1 else C (Eq. 7, nonterminal states).

    The clamp is ours (the paper leaves it open): a state predicted to succeed never costs more than failure, so a
    step into predicted failure never shows progress (unclamped, ``[v̂=500, fail, v̂=10]`` at C = 100 would reward it).
    """
    failure = torch.full_like(meter.tokens_to_go, failure_cost)
    return torch.where(meter.can_complete, torch.minimum(meter.tokens_to_go, failure), failure)


def terminal_cost(success: Tensor, failure_cost: float, dtype: torch.dtype) -> Tensor:
    """c_{i,T_i} = 0 on success, C on failure or truncation (Eq. 7, terminal state)."""
    return torch.where(success, 0.0, failure_cost).to(dtype)


def feasibility_costs(meter: MeterReadings, failure_cost: float) -> Tensor:
    """C^feas_{i,t} = 0 if b̂_{i,t} = 1 else C (Eq. 20)."""
    zeros = torch.zeros_like(meter.tokens_to_go)
    return torch.where(meter.can_complete, zeros, zeros + failure_cost)


def clipped_logit_scores(logit: Tensor, clip: float) -> Tensor:
    """S_{i,t} = clip(ℓ⁺ − ℓ⁻, −L, L) (Eq. 19)."""
    return logit.clamp(-clip, clip)


def progress_potential(batch: StepBatch, config: CreditConfig, signal: Signal) -> Tensor:
    """Φ_{i,t} for t = 0..T_i (``[n, S+1]``), higher = closer to completion; Δ_{i,t} = Φ_{i,t+1} − Φ_{i,t}.

    ttg: Φ = −c (Eq. 7–8); feas: Φ = −C^feas (Eq. 20); logit: Φ = S with terminal ±L (Eq. 19);
    value: Φ = S_φ(h) with the terminal anchored to the observed final score (E.4, +value).
    """
    meter = batch.meter
    assert meter is not None
    dtype = meter.tokens_to_go.dtype
    if signal in ("ttg", "feas"):
        if config.failure_cost is None:
            raise ValueError(f"the {signal} signal needs a failure cost C (--failure-cost)")
        costs = state_costs(meter, config.failure_cost) if signal == "ttg" else feasibility_costs(meter, config.failure_cost)
        terminal = terminal_cost(batch.success, config.failure_cost, dtype)
        return -append_terminal(costs, terminal, batch.num_steps)
    if signal == "logit":
        if meter.logit is None:
            raise ValueError("the logit signal needs logit readings")
        terminal = torch.where(batch.success, config.logit_clip, -config.logit_clip).to(dtype)
        return append_terminal(clipped_logit_scores(meter.logit, config.logit_clip), terminal, batch.num_steps)
    if signal == "value":
        if meter.score is None:
            raise ValueError("the value signal needs score readings")
        return append_terminal(meter.score, batch.reward.to(dtype), batch.num_steps)
    raise ValueError(f"unknown progress signal {signal!r}")


def robust_potential(batch: StepBatch, config: CreditConfig) -> Tensor:
    """Φ = −c for the robust record (ours, :mod:`deltattg.credit.robust`): p̃ (hindsight: 1 on the states of
    successful trajectories and on states with their histories), the soft readout (or b̂ with ``soft`` off), the terminal anchored (Eq. 7), then the running
    median of ``smooth`` states over c_0..c_T."""
    meter = batch.meter
    assert meter is not None
    if config.failure_cost is None:
        raise ValueError("the robust estimator needs a failure cost C (--failure-cost)")
    probability = robust.completion_probability(meter) if config.soft else meter.can_complete.to(meter.tokens_to_go.dtype)
    if config.hindsight:
        known = robust.known_completable(batch.success, batch.step_mask, batch.history)
        probability = robust.hindsight_probability(probability, known)
    costs = robust.expected_costs(probability, meter.tokens_to_go, config.failure_cost)
    trace = append_terminal(costs, terminal_cost(batch.success, config.failure_cost, costs.dtype), batch.num_steps)
    return -robust.running_median(trace, batch.num_steps, config.smooth)


def progress_deltas(potential: Tensor, step_mask: Tensor) -> Tensor:
    """Δ_{i,t} = Φ_{i,t+1} − Φ_{i,t} = c_{i,t} − c_{i,t+1} (Eq. 8); 0 at padding."""
    return torch.where(step_mask, potential[:, 1:] - potential[:, :-1], torch.zeros_like(potential[:, 1:]))


def allocation_mass(delta: Tensor, advantage: Tensor, step_mask: Tensor, *, sign_aware: bool = True) -> Tensor:
    """m_{i,t} = max(sign(A_i)·Δ_{i,t}, 0), and 1 when A_i = 0 (Eq. 9); ``sign_aware=False``: max(Δ, 0) (Eq. 21)."""
    direction = torch.sign(advantage)[:, None] if sign_aware else torch.ones_like(advantage)[:, None]
    mass = torch.where(advantage[:, None] == 0, torch.ones_like(delta), (direction * delta).clamp(min=0))
    return mass * step_mask


def mixed_shares(mass: Tensor, step_mask: Tensor, rho: float) -> tuple[Tensor, Tensor]:
    """q_{i,t} = ρ/T_i + (1−ρ)·m_{i,t}/Σ_s m_{i,s} (Eq. 10), or 1/T_i where Σ_s m_{i,s} = 0.

    Returns the shares (0 at padding) and the per-trajectory zero-mass flag.
    """
    mask = step_mask.to(mass.dtype)
    uniform = mask / mask.sum(dim=1, keepdim=True).clamp(min=1)
    total = mass.sum(dim=1, keepdim=True)
    zero_mass = total.squeeze(1) <= 0
    progress_share = mass / torch.where(total > 0, total, torch.ones_like(total))
    shares = torch.where(zero_mass[:, None], uniform, rho * uniform + (1.0 - rho) * progress_share)
    return shares, zero_mass


def bounded_token_normalization(shares: Tensor, step_tokens: Tensor, cap: float) -> Tensor:
    """B_M (Appendix D.4): step multipliers with unit token mean, each at most M.

    w⁰_t = N·q_t / Σ_s n_s q_s with N = Σ_s n_s; multipliers above M are cut to M and the excess E is given to the
    steps below the cap in proportion to their remaining capacity M − w⁰. One pass is exact: the capacity is at
    least E whenever M ≥ 1, so nobody is pushed over the cap (λ = E / capacity ≤ 1). A trajectory without tokens,
    or whose shares sit only on token-less steps, gets multipliers of 1. Computed in float64: a float32 share on a
    token-less step over a vanishing Σ n·q (a subnormal progress difference) would overflow w⁰ to inf.
    """
    dtype = shares.dtype
    shares = shares.double()
    tokens = step_tokens.to(shares.dtype)
    total_tokens = tokens.sum(dim=1, keepdim=True)
    mass = (tokens * shares).sum(dim=1, keepdim=True)
    degenerate = (mass <= 0) | (total_tokens <= 0)
    w0 = total_tokens * shares / torch.where(degenerate, torch.ones_like(mass), mass)
    weights = robust.capped_with_refill(w0, tokens, cap)
    return torch.where(degenerate, torch.ones_like(weights), weights).to(dtype)


@dataclass(frozen=True)
class Variant:
    """A member of the DeltaTTG family: its progress signal and which components are on (E.4)."""

    signal: Signal = "ttg"
    sign_aware: bool = True
    uniform_mixing: bool = True
    robust: bool = False  # the robust stages (ours): soft readout, hindsight, smoothing, share cap, trust

    @property
    def has_completion_prediction(self) -> bool:
        return self.signal in ("ttg", "feas")


def queried_states(batch: StepBatch, advantage: Tensor) -> tuple[Tensor, Tensor]:
    """Algorithm 1, lines 9, 12, 31: the decision states the meter is read on (``[n, S]``: those of the A ≠ 0
    trajectories) and, per trajectory, whether its group holds an invalid queried reading (the whole group then keeps
    its outcome advantages)."""
    assert batch.meter is not None
    queried = (advantage != 0)[:, None] & batch.step_mask
    invalid = (queried & ~batch.meter.valid).any(dim=1)
    return queried, (group_sum(invalid.to(advantage.dtype), batch.group, batch.num_groups) > 0)[batch.group]


def redistribute(batch: StepBatch, config: CreditConfig, variant: Variant) -> Credit:
    """Algorithm 1, lines 6–31, vectorised over the whole batch."""
    if batch.meter is None:
        raise ValueError("DeltaTTG needs meter readings for the decision states")
    advantage = outcome_advantage(batch, config)
    step_mask = batch.step_mask
    meter = batch.meter

    queried, invalid_group = queried_states(batch, advantage)

    # Lines 14-15: every state predicted unsuccessful -> keep the original advantage. (The robust record's soft
    # readout still ranks such states by p̃, and hindsight makes a successful trajectory's states completable.)
    predicted = meter.can_complete
    if variant.robust and config.hindsight:
        predicted = predicted | robust.known_completable(batch.success, step_mask, batch.history)
    if variant.has_completion_prediction and not (variant.robust and config.soft):
        all_unsuccessful = ~((predicted & meter.valid & step_mask).any(dim=1))
    else:
        all_unsuccessful = torch.zeros_like(invalid_group)

    # Lines 17-27 for everyone at once; the rules above decide who keeps them.
    safe = replace(batch, meter=_without_invalid_readings(meter, step_mask))
    potential = robust_potential(safe, config) if variant.robust else progress_potential(safe, config, variant.signal)
    delta = progress_deltas(potential, step_mask)
    mass = allocation_mass(delta, advantage, step_mask, sign_aware=variant.sign_aware)
    shares, zero_mass = mixed_shares(mass, step_mask, config.rho if variant.uniform_mixing else 0.0)
    if variant.robust:
        shares = robust.capped_shares(shares, step_mask, config.share_cap)
    weights = bounded_token_normalization(shares, batch.step_tokens, config.cap)
    metrics: dict[str, float] = {}
    if variant.robust and config.trust != "none":  # how well the meter tells successes from failures on this batch
        read = queried & meter.valid
        if config.trust == "auc":  # each trajectory's mean p̃
            auc, trust = robust.batch_trust(robust.completion_probability(meter), read, batch.reward, batch.group)
        else:  # each step's own progress
            auc, trust = robust.step_trust(robust.completion_probability(meter), meter.tokens_to_go, read,
                                           batch.reward, batch.group, config.failure_cost)
        weights = robust.trusted_weights(weights, trust, step_mask)
        metrics = {"trust/auc": auc, "trust/tau": trust}

    keep = (advantage == 0) | invalid_group | all_unsuccessful
    weights = torch.where(keep[:, None], torch.ones_like(weights), weights) * step_mask
    fallback = torch.full_like(advantage, Fallback.REDISTRIBUTED, dtype=torch.int8)
    fallback[zero_mass] = Fallback.ZERO_MASS
    if metrics.get("trust/tau") == 0.0:  # not trusted on this batch: GRPO's credit, not a redistribution
        fallback[:] = Fallback.UNTRUSTED
    fallback[all_unsuccessful] = Fallback.ALL_UNSUCCESSFUL
    fallback[invalid_group] = Fallback.INVALID_GROUP
    fallback[advantage == 0] = Fallback.ZERO_ADVANTAGE
    credit = Credit.weighted(advantage, weights, fallback)
    credit.metrics = metrics
    return credit


def _without_invalid_readings(meter: MeterReadings, step_mask: Tensor) -> MeterReadings:
    """Readings with invalid/padded entries set to harmless values, so the batched arithmetic stays finite.

    Their trajectories are restored to their original advantages afterwards (invalid group), so the values are unused.
    """
    ok = meter.valid & step_mask

    def clean(x: Tensor | None) -> Tensor | None:
        return None if x is None else torch.where(ok, x, torch.zeros_like(x))

    return MeterReadings(
        valid=ok,
        can_complete=meter.can_complete & ok,
        tokens_to_go=clean(meter.tokens_to_go),  # type: ignore[arg-type]
        logit=clean(meter.logit),
        score=clean(meter.score),
        probability=clean(meter.probability),
    )


RECOMMENDED = "deltattg_robust"

VARIANTS: dict[str, Variant] = {
    "deltattg": Variant(),
    RECOMMENDED: Variant(robust=True),
    "pos": Variant(sign_aware=False),
    "rho0": Variant(uniform_mixing=False),
    "feas": Variant(signal="feas"),
    "logit": Variant(signal="logit"),
    "value": Variant(signal="value"),
}

_DOCS = {
    "deltattg": "DeltaTTG: Token-to-Go progress redistributes A_i over steps (Eq. 7-11, Algorithm 1).",
    RECOMMENDED: "Robust DeltaTTG (ours; recommended over deltattg with a learned meter; no better than GRPO in our "
                 "benchmark): calibrated soft readout, hindsight on successes, running-median smoothing, share cap, "
                 "on-batch trust.",
    "pos": "DeltaTTG without sign-aware reversal: m = max(Δ, 0) for every A_i (E.4, Eq. 21).",
    "rho0": "DeltaTTG without uniform mixing: ρ = 0 (E.4, Eq. 22).",
    "feas": "DeltaTTG with binary feasibility only: costs 0 / C (E.4, Eq. 20).",
    "logit": "DeltaTTG with the clipped completion logit as progress, terminal ±L (E.4, Eq. 19).",
    "value": "DeltaTTG with an outcome-score meter: Δ = S(h_{t+1}) − S(h_t) (E.4, +value).",
}
READING = {"ttg": "can_complete", "feas": "can_complete", "logit": "logit", "value": "score"}
OPTIONS = {
    "rho": Option("rho", "uniform mixing ρ (Eq. 10)", low=0, high=1),
    "cap": Option("cap", "token multiplier cap M >= 1 (D.4)", low=1, high=MAX_CREDIT_SETTING),
    "failure_cost": Option("failure_cost", "cost C of a state predicted unsuccessful and of a failed end (Eq. 7); no "
                           "default: the paper uses 16384 (ALFWorld, AWM) and 6144 (PaperSearchQA)", low=0,
                           low_open=True, high=MAX_CREDIT_SETTING, metavar="C"),
    "logit_clip": Option("logit_clip", "logit clip L (Eq. 19)", low=0, low_open=True, high=MAX_CREDIT_SETTING,
                         metavar="L"),
}
ROBUST_OPTIONS = (
    Option("soft", "soft readout c = p̃·min(v̂, C) + (1 − p̃)·C with the meter's calibrated probability p̃ (records: "
           "meter[].probability; b̂ where absent; ours)"),
    Option("hindsight", "p̃ = 1 on the states of successful trajectories (ours)"),
    Option("smooth", "running median of K states (odd) over the cost trace c_0..c_T (1: none; ours)", low=1, high=99,
           metavar="K"),
    Option("share_cap", "share cap κ: no step's share q_t exceeds κ/T_i (1: GRPO's uniform shares; ours)", low=1,
           high=MAX_CREDIT_SETTING, metavar="KAPPA"),
    Option("trust", "auc: scale the redistribution by clip(2·AUC − 1, 0, 1) of each trajectory's mean p̃ against "
           "the outcomes of the batch's groups; delta: of each step's own progress c_t − c_{t+1} instead; none "
           "(ours)", choices=TRUST_MODES),
)


def family_record(name: str, variant: Variant) -> Estimator:
    """The registry record of a DeltaTTG-family member: it reads the meter field its signal needs."""

    def estimator(batch: StepBatch, config: CreditConfig) -> Credit:
        return redistribute(batch, config, variant)

    estimator.__name__ = name
    estimator.__doc__ = _DOCS[name]
    cost = variant.signal in ("ttg", "feas")
    options = [OPTIONS["rho"]] * variant.uniform_mixing + [OPTIONS["cap"]]
    options += [OPTIONS["failure_cost"]] * cost + [OPTIONS["logit_clip"]] * (variant.signal == "logit")
    options += list(ROBUST_OPTIONS) * variant.robust
    reads = {Reads.METER, Reads.HISTORIES} if variant.robust else {Reads.METER}
    return Estimator(name, estimator, _DOCS[name], frozenset(reads), READING[variant.signal], cost,
                     tuple(options))  # fmt: skip


for _name, _variant in VARIANTS.items():
    register(family_record(_name, _variant))


# ---- the conservative mix (ours, issue 47) --------------------------------------------------------------------------
def mixed_step_advantages(advantage: Tensor, delta: Tensor, group: Tensor, step_mask: Tensor, step_weight: float,
                          epsilon: float) -> Tensor:
    """Ã_{i,t} = A_i + ω·Â^S_{i,t} (ours; GiGPO's episode + ω·step form with the meter's step change as the step
    signal, OPRL's potential-based shaping normalised): Â^S is Δ_{i,t} normalised over every step of the trajectory's
    group (mean and sample std; a group of one step gives 0); 0 at padding."""
    step = gigpo_step_advantage(delta, torch.zeros_like(step_mask, dtype=torch.long), group, step_mask,
                                epsilon=epsilon)  # fmt: skip
    return torch.where(step_mask, advantage[:, None] + step_weight * step, torch.zeros_like(step))


@register_estimator("deltattg_mix", reads=frozenset({Reads.METER, Reads.HISTORIES}), meter_field="can_complete",
                    needs_failure_cost=True, options=(OPTIONS["failure_cost"], STEP_WEIGHT, *ROBUST_OPTIONS[:3]))
def deltattg_mix(batch: StepBatch, config: CreditConfig) -> Credit:
    """The conservative mix (ours): the outcome advantage plus ω × the robust meter's group-normalised step change.

    Δ_{i,t} is robust DeltaTTG's (soft readout, hindsight, smoothing, the terminal anchored: Eq. 7–8), and only the
    A_i ≠ 0 trajectories are read, as in Algorithm 1; a group with an invalid queried reading keeps its outcome
    advantages. Unlike DeltaTTG it changes a step's advantage additively: the sign and the token mean of A_i are not
    kept — ω bounds how far the meter can move it (GiGPO's A^E + ω·A^S; PURE and OPRL add step terms this way)."""
    if batch.meter is None:
        raise ValueError("deltattg_mix needs meter readings for the decision states")
    advantage = outcome_advantage(batch, config)
    step_mask = batch.step_mask
    _, invalid_group = queried_states(batch, advantage)
    read = (advantage != 0) & ~invalid_group
    safe = replace(batch, meter=_without_invalid_readings(batch.meter, step_mask))
    delta = progress_deltas(robust_potential(safe, config), step_mask)
    mixed = mixed_step_advantages(advantage[read], delta[read], batch.group[read], step_mask[read],
                                  config.step_weight, config.epsilon)  # fmt: skip
    steps = torch.where(step_mask, advantage[:, None], torch.zeros_like(delta))
    steps[read] = mixed.to(steps.dtype)
    credit = Credit.additive(advantage, steps, Fallback.METER_STEPS)
    credit.fallback[invalid_group & (advantage != 0)] = Fallback.INVALID_GROUP
    return credit
