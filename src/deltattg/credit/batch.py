"""The per-trajectory tensor layout every estimator reads, its configuration and its result."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

TRUST_MODES = ("none", "auc", "delta")  # robust DeltaTTG's trust τ (deltattg.credit.robust)


@dataclass
class MeterReadings:
    """Frozen-meter readings of each decision state h_{i,t}, padded ``[n, S]``; meaningful only where ``valid``.

    ``valid`` is False for an invalid (unparseable, failed) reading and at padding. ``tokens_to_go`` is v̂ — also
    where ``can_complete`` (b̂) is False when the meter gives it there (a regression meter's work-if-it-completes), +∞
    where it gives none (every cost clamps v̂ to C). ``logit`` (E.4 +logit) and ``score`` (E.4 +value) are present
    only when read; ``probability`` is the calibrated completion probability p̃ where the meter gives one and b̂ as
    0/1 elsewhere (the robust credit's soft readout), ``None`` when not built.
    """

    valid: Tensor
    can_complete: Tensor
    tokens_to_go: Tensor
    logit: Tensor | None = None
    score: Tensor | None = None
    probability: Tensor | None = None


@dataclass
class StepBatch:
    """``n`` trajectories padded to ``S`` steps.

    ``group`` holds dense group ids (0..G−1); ``step_tokens`` the trainable tokens n_{i,t} of each action (0 at
    padding); ``step_mask`` marks real steps, so T_i = ``step_mask[i].sum()``.
    """

    reward: Tensor
    success: Tensor
    group: Tensor
    step_tokens: Tensor
    step_mask: Tensor
    meter: MeterReadings | None = None
    step_rewards: Tensor | None = None  # r_{i,t} per step (GiGPO / HGPO), 0 at padding
    anchor: Tensor | None = None  # int64 anchor-observation ids: equal id ⇔ identical observation; −1 at padding
    answer_logprobs: Tensor | None = None  # [n, S+1] (IGPO / A²TGPO): column t = the mean token log-prob of the
    # reference answer teacher-forced after t turns (t = 0: the prompt alone); columns past T_i are padding (0)
    verified: Tensor | None = None  # [n, S] int8 (CrEST): 1 = the environment verified step t's outcome (admissible
    # action, tool call without error), 0 = it verified a failure, −1 = nothing verified (None) and at padding
    history: Tensor | None = None  # [n, S] int64 ids of the decision states h_t: equal id ⇔ identical history;
    # −1 where unknown (a record without messages) and at padding (deltattg_robust's hindsight)

    @property
    def num_steps(self) -> Tensor:
        return self.step_mask.sum(dim=1)

    @property
    def num_groups(self) -> int:
        return int(self.group.max().item()) + 1 if self.group.numel() else 0


MAX_CREDIT_SETTING = 1e12  # the largest cap M, failure cost C or logit clip L (float32 keeps every sum finite)


@dataclass(frozen=True)
class CreditConfig:
    """Hyperparameters of every estimator (paper defaults, Table 4); ``failure_cost`` C has no default on purpose."""

    rho: float = 0.2
    cap: float = 5.0
    failure_cost: float | None = None
    epsilon: float = 1e-6
    logit_clip: float = 10.0
    scale_by_std: bool = True
    # ---- observation-grouping baselines (GiGPO, HGPO; verl-agent's defaults) ----
    gamma: float = 0.95  # discount of the per-step returns
    step_weight: float = 1.0  # GiGPO's ω (step_advantage_w): A = episode + ω·step
    norm: str = "mean_std"  # mean_std | mean (verl-agent's mean_std_norm | mean_norm)
    history: int = 2  # HGPO's K: groups over the last k = 1..K+1 anchor observations
    alpha: float = 1.0  # HGPO's length weight exponent: w_k ∝ (k+1)^α
    base_group: bool = False  # HGPO: also the episode term, as a k = 0 item
    # ---- information-gain estimators (IGPO, A²TGPO; deltattg.credit.information_gain) ----
    ig_gamma: float = 1.0  # discount of the accumulated (normalised) information gains; IGPO's and issue 11's γ = 1
    ig_alpha: float = 0.3  # A²TGPO's α: A_k = α·D_k + Â_out
    ig_beta: float = 0.3  # A²TGPO's β: turn clip factor c_k = 1 + β(2σ(ĨG_k) − 1) ∈ (1 − β, 1 + β)
    ig_log: bool = False  # information gain in log-probability (log p_t − log p_{t−1}) instead of probability
    # ---- DelTA (RUCBM/DelTA's run script: lam_min, lam_max, K) ----
    delta_lambda_min: float = 0.8  # λ_min: the token weight ω before self-normalisation lies in [λ_min, λ_max]
    delta_lambda_max: float = 1.2  # λ_max
    delta_refine: int = 1  # K: centroid refinement steps with soft weights σ(m/γ)·|A|
    # ---- CrEST (no public text or code: every choice is ours; deltattg.credit.crest) ----
    crest_beta: float = 0.5  # β_v: Ã_{i,t} = A_i + β_v·ṽ_{i,t}, ṽ the verified outcome z-scored per (prompt, turn)
    crest_epsilon: float = 0.2  # ε_w: the teacher's magnitude factor w is clipped to [1 − ε_w, 1 + ε_w]
    crest_floor: float = 0.5  # w_min: w >= w_min > 0 (so w never flips a sign), after the entropy gate
    # ---- robust DeltaTTG (ours; deltattg.credit.robust): the defaults are the configuration measured ----
    soft: bool = True  # soft readout c = p̃·min(v̂, C) + (1 − p̃)·C with the calibrated probability p̃ (else b̂)
    hindsight: bool = True  # p̃ = 1 on the states of successful trajectories
    smooth: int = 3  # running median of this many states over the cost trace (1: none); odd
    share_cap: float = 2.0  # κ: no step's share q_t exceeds κ/T_i (1: GRPO's uniform shares)
    trust: str = "auc"  # auc: scale the redistribution by clip(2·AUC − 1, 0, 1) of p̃ on the batch; delta: of the
    # steps' own progress; none

    def __post_init__(self) -> None:
        for setting in fields(self):  # every float setting is finite (C may be unset)
            value = getattr(self, setting.name)
            if setting.type.startswith("float") and not (value is None and "None" in setting.type) and (
                    isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
                raise ValueError(f"{setting.name} must be a finite number, got {value!r}")
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"rho must be in [0, 1], got {self.rho}")
        if not 1.0 <= self.cap <= MAX_CREDIT_SETTING:
            raise ValueError(f"the multiplier cap M must be in [1, {MAX_CREDIT_SETTING:g}], got {self.cap}")
        if self.failure_cost is not None and not 0 < self.failure_cost <= MAX_CREDIT_SETTING:
            raise ValueError(f"the failure cost C must be in (0, {MAX_CREDIT_SETTING:g}], got {self.failure_cost}")
        if not 0 < self.epsilon <= 1.0:
            raise ValueError(f"epsilon must be in (0, 1], got {self.epsilon}")
        if not 0 < self.logit_clip <= MAX_CREDIT_SETTING:
            raise ValueError(f"the logit clip L must be in (0, {MAX_CREDIT_SETTING:g}], got {self.logit_clip}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.norm not in ("mean_std", "mean"):
            raise ValueError(f"norm must be mean_std or mean, got {self.norm!r}")
        if isinstance(self.history, bool) or not isinstance(self.history, int) or not 0 <= self.history <= 64:
            raise ValueError(f"history (HGPO's K) must be an integer in [0, 64], got {self.history!r}")
        if not 0.0 <= self.ig_gamma <= 1.0:
            raise ValueError(f"ig_gamma must be in [0, 1], got {self.ig_gamma}")
        if not 0.0 <= self.ig_alpha <= MAX_CREDIT_SETTING:
            raise ValueError(f"ig_alpha (A²TGPO's α) must be in [0, {MAX_CREDIT_SETTING:g}], got {self.ig_alpha}")
        if not 0.0 <= self.ig_beta <= 1.0:  # c_k stays in (1 − β, 1 + β): positive for β ≤ 1
            raise ValueError(f"ig_beta (A²TGPO's β) must be in [0, 1], got {self.ig_beta}")
        if not isinstance(self.ig_log, bool):
            raise ValueError(f"ig_log must be true or false, got {self.ig_log!r}")
        if not 0.0 <= self.delta_lambda_min <= self.delta_lambda_max <= MAX_CREDIT_SETTING:
            raise ValueError(f"DelTA's weights need 0 <= delta_lambda_min <= delta_lambda_max, got "
                             f"{self.delta_lambda_min}, {self.delta_lambda_max}")
        if self.delta_lambda_max == 0.0:
            raise ValueError("delta_lambda_max must be > 0 (every DelTA weight would be 0)")
        refine = self.delta_refine
        if isinstance(refine, bool) or not isinstance(refine, int) or not 0 <= refine <= 16:
            raise ValueError(f"delta_refine (DelTA's K) must be an integer in [0, 16], got {refine!r}")
        if not 0.0 <= self.crest_beta <= MAX_CREDIT_SETTING:
            raise ValueError(f"crest_beta (CrEST's β_v) must be in [0, {MAX_CREDIT_SETTING:g}], got {self.crest_beta}")
        if not 0.0 <= self.crest_epsilon <= 100.0:
            raise ValueError(f"crest_epsilon (CrEST's ε_w) must be in [0, 100], got {self.crest_epsilon}")
        if not 0.0 < self.crest_floor <= 1.0:  # > 0: w never zeroes or flips a sign; <= 1: w = 1 stays reachable
            raise ValueError(f"crest_floor (CrEST's w_min) must be in (0, 1], got {self.crest_floor}")
        for flag in ("soft", "hindsight"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        smooth = self.smooth
        if isinstance(smooth, bool) or not isinstance(smooth, int) or not 1 <= smooth <= 99 or smooth % 2 == 0:
            raise ValueError(f"smooth (the running median's window) must be an odd integer in [1, 99], got {smooth!r}")
        if not 1.0 <= self.share_cap <= MAX_CREDIT_SETTING:
            raise ValueError(f"the share cap κ must be in [1, {MAX_CREDIT_SETTING:g}], got {self.share_cap}")
        if self.trust not in TRUST_MODES:
            raise ValueError(f"trust must be one of {', '.join(TRUST_MODES)}, got {self.trust!r}")


class Fallback(enum.IntEnum):
    """Why a trajectory's advantage was (or was not) redistributed over its steps (Algorithm 1)."""

    REDISTRIBUTED = 0
    ZERO_ADVANTAGE = 1  # A_i = 0: keeps 0, not queried (line 9)
    INVALID_GROUP = 2  # an invalid queried reading in its group (lines 12, 31)
    ALL_UNSUCCESSFUL = 3  # every state predicted unsuccessful (lines 14-15)
    ZERO_MASS = 4  # Σ m = 0: equal shares 1/T (lines 21-22)
    OUTCOME_ONLY = 5  # the estimator does not redistribute (GRPO)
    STEP_GROUPS = 6  # an episode term plus per-step terms from anchor-observation groups (GiGPO, HGPO)
    INFORMATION_GAIN = 7  # per-turn information gains of the reference answer plus the outcome (IGPO, A²TGPO)
    VERIFIED_TURNS = 8  # the outcome plus per-turn verified outcomes normalised per (prompt, turn) (CrEST)
    UNTRUSTED = 9  # the meter told this batch's outcomes apart no better than chance (trust τ = 0): GRPO's credit
    METER_STEPS = 10  # the outcome plus ω × the meter's group-normalised step change (deltattg_mix)


@dataclass
class Credit:
    """An estimator's answer: the trajectory's outcome advantage A_i, the per-step advantages Ã_{i,t} (the same for
    every token of step t; 0 at padding), why each trajectory got them, and — for estimators that scale A_i over the
    steps (GRPO, the DeltaTTG family) — the step weights w_{i,t} with Ã = A·w (Eq. 11). Additive estimators (GiGPO's
    episode + step terms, IGPO / A²TGPO's information-gain terms) have no weights. ``clip_scale`` ``[n, S]``: a
    per-step factor c_{i,t} of the PPO clip range, [1 − ε_low·c, 1 + ε_high·c] for every token of step t (A²TGPO's
    adaptive turn clip; 1 at padding); None = 1 everywhere. CrEST's verified term is additive too."""

    advantage: Tensor
    step_advantages: Tensor
    fallback: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int8))
    step_weights: Tensor | None = None
    clip_scale: Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # batch-level readings an estimator reports (trust, AUC)

    @classmethod
    def weighted(cls, advantage: Tensor, step_weights: Tensor, fallback: Tensor) -> Credit:
        """Ã_{i,t} = A_i · w_{i,t} (Eq. 11)."""
        return cls(advantage, advantage[:, None] * step_weights, fallback, step_weights)

    @classmethod
    def additive(cls, advantage: Tensor, step_advantages: Tensor, kind: Fallback, **extra: Tensor | None) -> Credit:
        """An additive estimator's answer (GiGPO, HGPO, IGPO, A²TGPO, CrEST): ``kind`` for every trajectory but those
        whose outcome advantage and step advantages are all 0 (``zero_advantage``) — a trajectory without steps
        keeps ``kind`` while its A_i ≠ 0."""
        nothing = (advantage == 0) & (step_advantages == 0).all(dim=1)
        fallback = torch.where(nothing, Fallback.ZERO_ADVANTAGE, kind).to(torch.int8)
        return cls(advantage.to(step_advantages.dtype), step_advantages, fallback, **extra)

    def fallback_counts(self) -> dict[str, int]:
        """How many trajectories each Algorithm 1 rule applied to (``credit/redistributed``, ``credit/zero_mass``, ...)."""
        return {f"credit/{f.name.lower()}": int((self.fallback == f).sum()) for f in Fallback}


def credit_shares(step_advantages: Tensor, step_tokens: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """How a trajectory's credit is spread over its steps, for every trajectory at once (``[n, S]`` inputs, 0 at
    padding): a step's share is |Ã_t|·n_t / Σ_s |Ã_s|·n_s. Returns, per trajectory, the largest share, the entropy
    (nats) of the shares, the total-variation distance ½·Σ_t |share_t − n_t/N| to the token shares (GRPO's: how much
    credit moved from where GRPO puts it), and which trajectories have any credit (the others' values are 0)."""
    tokens = step_tokens.double()
    mass = step_advantages.double().abs() * tokens
    total = mass.sum(dim=1, keepdim=True)
    credited = (total.squeeze(1) > 0) & (tokens.sum(dim=1) > 0)
    share = torch.where(credited[:, None], mass / total.clamp(min=1e-300), torch.zeros_like(mass))
    entropy = -torch.where(share > 0, share * share.clamp(min=1e-300).log(), torch.zeros_like(share)).sum(dim=1)
    token_share = tokens / tokens.sum(dim=1, keepdim=True).clamp(min=1)
    moved = torch.where(credited, 0.5 * (share - token_share).abs().sum(dim=1), torch.zeros_like(entropy))
    return share.max(dim=1).values if share.numel() else share.sum(dim=1), entropy, moved, credited
