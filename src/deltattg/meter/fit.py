"""How well a meter reads held-out trajectories (§4.2's meter fit, §5.3's transfer): completion accuracy against the
outcome (b of Eq. 2), Spearman's ρ of predicted against true Token-to-Go (Eq. 1) on the successful trajectories'
states, and, between two meters on the same states, how often their b̂ agree, the rank correlation of their v̂
(a meter moved to another domain against the one trained there) and — what credit reads — how their per-step
changes Δ (Eq. 8) agree, step by step and between sibling actions from one state. ``deltattg eval-meter`` prints them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deltattg.data.labels import remaining_sums
from deltattg.data.trajectory import Trajectory, calibrated_probability
from deltattg.meter.loading import read_states
from deltattg.ranks import spearman


def mean(values: Sequence[float]) -> float:
    """The mean; NaN for none."""
    return float(np.mean(values)) if len(values) else float("nan")


@dataclass
class MeterFit:
    """The meter on held-out trajectories, every nonterminal decision state: truth and reading."""

    success: list[bool]  # the trajectory's outcome (b of Eq. 2)
    true_ttg: list[float]  # Eq. 1 (meaningful where success)
    predicted_can: list[bool]  # b̂
    predicted_ttg: list[float | None]  # v̂ (the regression meter gives it where b̂ = 0 too; None where a meter does not)
    steps: list[int] = field(default_factory=list)  # t: the actions taken before the state
    probability: list[float | None] = field(default_factory=list)  # p̃, where the meter gives one

    @property
    def completion_accuracy(self) -> float:
        return mean([p == s for p, s in zip(self.predicted_can, self.success)])

    def accuracy_on(self, outcome: bool) -> float:
        """Completion accuracy on the states of the successful (``True``) or the failed trajectories."""
        return mean([p == s for p, s in zip(self.predicted_can, self.success) if s == outcome])

    def accuracy_by_step(self) -> dict[int, float]:
        """Completion accuracy of the states after t actions, for each t."""
        return {t: mean([p == s for p, s, u in zip(self.predicted_can, self.success, self.steps) if u == t])
                for t in sorted(set(self.steps))}  # fmt: skip

    @property
    def calibration_error(self) -> float:
        """ECE of p̃ against the outcome over the states that have one (NaN without any)."""
        pairs = [(p, s) for p, s in zip(self.probability, self.success) if p is not None]
        return expected_calibration_error([p for p, _ in pairs], [s for _, s in pairs])

    def confusion(self) -> dict[tuple[bool, bool], int]:
        """States counted by (the trajectory succeeded, the meter predicted b̂ = 1)."""
        out = {(s, p): 0 for s in (True, False) for p in (True, False)}
        for s, p in zip(self.success, self.predicted_can):
            out[s, p] += 1
        return out

    def successful_pairs(self) -> tuple[list[float], list[float]]:
        """(true, predicted) TTG of the successful trajectories' states (v̂ whatever b̂ says)."""
        pairs = [(t, p) for s, t, p in zip(self.success, self.true_ttg, self.predicted_ttg) if s and p is not None]
        return [t for t, _ in pairs], [p for _, p in pairs]

    @property
    def spearman(self) -> float:
        """Spearman's rank correlation of true and predicted TTG on the successful trajectories' states (tied values
        share their mean rank); NaN where it is undefined."""
        return spearman(*self.successful_pairs())

    def as_dict(self) -> dict[str, float]:
        return {"states": len(self.success), "completion_accuracy": self.completion_accuracy,
                "ttg_spearman": self.spearman, "ttg_mean_absolute_error": self.mean_absolute_error}  # fmt: skip

    @property
    def mean_absolute_error(self) -> float:
        true, predicted = self.successful_pairs()
        return mean([abs(t - p) for t, p in zip(true, predicted)])


def meter_fit(meter: Any, trajectories: Sequence[Trajectory]) -> MeterFit:
    """The meter's reading of every nonterminal decision state of ``trajectories``, next to its labels."""
    return fit_of(trajectories, read_states(meter, trajectories)[0])


def fit_of(trajectories: Sequence[Trajectory], readings: Sequence[Sequence[Any]]) -> MeterFit:
    """:class:`MeterFit` of readings already taken (``read_states`` rows, one per trajectory); invalid ones skipped."""
    fit = MeterFit([], [], [], [])
    for trajectory, row in zip(trajectories, readings):
        for t, (ttg, reading) in enumerate(zip(remaining_sums(trajectory.step_tokens or []), row)):
            if reading is None:
                continue
            fit.success.append(trajectory.success)
            fit.true_ttg.append(float(ttg))
            fit.predicted_can.append(bool(reading.can_complete))
            fit.predicted_ttg.append(reading.tokens_to_go)
            fit.steps.append(t)
            fit.probability.append(reading.probability)
    return fit


@dataclass(frozen=True)
class Agreement:
    """Two meters on the same nonterminal decision states (those both read validly), the second taken as the
    reference: how often their b̂ agree, the balanced accuracy of ours against the reference's b̂ (the mean of the
    shares of its completable and of its hopeless states that ours reads alike: a meter that reads every state one
    way scores 0.5 however the states divide), the Spearman of their v̂ on every state where both give one — hopeless
    states included, with the v̂ each meter reads there (the planner's: the expert's remaining tokens as if the turns
    allowed them; a regression meter's: the work left if the task completes) — and how their per-step changes agree
    (:class:`StepChanges`)."""

    states: int
    completion_agreement: float  # share of states where their b̂ agree
    ttg_spearman: float  # Spearman's ρ of their v̂ (where both give one)
    b_balanced_accuracy: float = float("nan")  # ours against the reference's b̂, balanced over its two classes
    reference_completable: int = 0  # states the reference reads completable
    changes: StepChanges | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {"states": self.states, "completion_agreement": self.completion_agreement,
               "b_balanced_accuracy": self.b_balanced_accuracy, "reference_completable": self.reference_completable,
               "ttg_spearman": self.ttg_spearman}  # fmt: skip
        return out | (self.changes.as_dict() if self.changes else {})

    @property
    def delta_spearman(self) -> float:
        return self.changes.delta_spearman if self.changes else float("nan")

    @property
    def delta_sign_agreement(self) -> float:
        return self.changes.delta_sign_agreement if self.changes else float("nan")

    @property
    def sibling_ranking(self) -> float:
        return self.changes.sibling_ranking if self.changes else float("nan")


def balanced_accuracy(predicted: Sequence[bool], truth: Sequence[bool]) -> float:
    """The mean over the two classes of ``truth`` of the share ``predicted`` gets right (NaN where a class is empty)."""
    rates = []
    for cls in (True, False):
        hits = [p == t for p, t in zip(predicted, truth) if t == cls]
        rates.append(mean(hits))
    return mean(rates) if all(r == r for r in rates) else float("nan")


def agreement_of(trajectories: Sequence[Trajectory], ours: Sequence[Sequence[Any]], theirs: Sequence[Sequence[Any]],
                 failure_cost: float | None = None) -> Agreement:
    """How one meter agrees with a reference meter on the same nonterminal decision states of ``trajectories``: their
    ``read_states`` rows; Δ with failure cost C = ``failure_cost`` (default: :func:`default_failure_cost`)."""
    pairs = [(a, b) for row_a, row_b in zip(ours, theirs) for a, b in zip(row_a, row_b)
             if a is not None and b is not None]  # fmt: skip
    ttg = [(a.tokens_to_go, b.tokens_to_go) for a, b in pairs
           if a.tokens_to_go is not None and b.tokens_to_go is not None]  # fmt: skip
    predicted, truth = [bool(a.can_complete) for a, _ in pairs], [bool(b.can_complete) for _, b in pairs]
    cost = default_failure_cost(trajectories, theirs) if failure_cost is None else failure_cost
    return Agreement(len(pairs), mean([p == t for p, t in zip(predicted, truth)]),
                     spearman([a for a, _ in ttg], [b for _, b in ttg]), balanced_accuracy(predicted, truth),
                     sum(truth), step_change_agreement(trajectories, ours, theirs, cost))  # fmt: skip


# ---- the step changes credit reads (Eq. 7–8) ----------------------------------------------------------------------
def state_cost(reading: Any, failure_cost: float) -> float | None:
    """c = min(v̂, C) if b̂ else C (Eq. 7, as ``credit.deltattg.state_costs`` reads it); None for an invalid reading."""
    if reading is None:
        return None
    if not reading.can_complete:
        return failure_cost
    return min(float(reading.tokens_to_go), failure_cost)


def step_changes(success: bool, row: Sequence[Any], failure_cost: float) -> list[float | None]:
    """Δ_t = c_t − c_{t+1} for t = 0..T−1 of one trajectory (Eq. 8): ``row`` holds its readings of h_0..h_{T−1},
    the terminal state is anchored at 0 on success and C otherwise (Eq. 7); None where either reading is invalid."""
    costs = [state_cost(r, failure_cost) for r in row] + [0.0 if success else failure_cost]
    return [None if a is None or b is None else a - b for a, b in zip(costs, costs[1:])]


def sign(value: float) -> int:
    return (value > 0) - (value < 0)


STEP_KINDS = {1: "progress", 0: "none", -1: "regress"}  # a step by the sign of its Δ


def sign_confusion(pairs: Sequence[tuple[float, float]]) -> dict[str, dict[str, int]]:
    """Steps counted by the kind the reference's Δ gives them (rows: progress, none, regress) and the kind ours gives
    (columns) from ``(ours, reference)`` pairs — where a meter's Δ goes wrong, e.g. no-op steps read as progress."""
    out = {row: dict.fromkeys(STEP_KINDS.values(), 0) for row in STEP_KINDS.values()}
    for ours, reference in pairs:
        out[STEP_KINDS[sign(reference)]][STEP_KINDS[sign(ours)]] += 1
    return out


@dataclass(frozen=True)
class StepChanges:
    """How one meter's per-step change Δ (what DeltaTTG redistributes credit by, Eq. 8) follows a reference's, on the
    steps both read (both states valid; the terminal state anchored at 0 or C, so the last step counts too):
    Spearman of the two Δ; the share of steps whose sign — progress (Δ > 0), none (Δ = 0), regress (Δ < 0) — agrees;
    and, where recorded trajectories share a decision state and take different actions from it (``sibling_pairs``
    such pairs), the share of pairs both order alike by Δ (the reference's ties left out, the meter's ties count ½);
    and the steps of each kind by the reference's sign counted by ours (:func:`sign_confusion`)."""

    steps: int
    delta_spearman: float
    delta_sign_agreement: float
    sibling_pairs: int
    sibling_ranking: float
    failure_cost: float
    sign_confusion: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "delta_spearman": self.delta_spearman,
                "delta_sign_agreement": self.delta_sign_agreement, "sibling_pairs": self.sibling_pairs,
                "sibling_ranking": self.sibling_ranking, "failure_cost": self.failure_cost,
                "delta_sign_confusion": self.sign_confusion}  # fmt: skip


def sibling_steps(trajectories: Sequence[Trajectory]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Every pair of steps ((i, t), (j, t)) whose trajectories share the decision state h_t and take different
    actions from it (GRPO's groups share their first state; a pool's trajectories of one task share theirs)."""
    from deltattg.data.trajectory import action_texts, decision_state_keys

    by_state: dict[tuple[int, str], list[tuple[int, str]]] = {}
    for i, trajectory in enumerate(trajectories):
        for t, (key, action) in enumerate(zip(decision_state_keys(trajectory), action_texts(trajectory))):
            if key is not None:
                by_state.setdefault((t, key), []).append((i, action))
    pairs = []
    for (t, _), members in by_state.items():
        for a, (i, action_i) in enumerate(members):
            pairs += [((i, t), (j, t)) for j, action_j in members[a + 1:] if action_j != action_i]
    return pairs


def step_change_agreement(trajectories: Sequence[Trajectory], ours: Sequence[Sequence[Any]],
                          theirs: Sequence[Sequence[Any]], failure_cost: float) -> StepChanges:
    """:class:`StepChanges` of ``ours`` against ``theirs``: ``read_states`` rows of the same trajectories."""
    mine = [step_changes(t.success, row, failure_cost) for t, row in zip(trajectories, ours)]
    reference = [step_changes(t.success, row, failure_cost) for t, row in zip(trajectories, theirs)]
    pairs = [(a, b) for row_a, row_b in zip(mine, reference) for a, b in zip(row_a, row_b)
             if a is not None and b is not None]  # fmt: skip
    orders = []
    for (i, t), (j, u) in sibling_steps(trajectories):
        a, b, x, y = mine[i][t], mine[j][u], reference[i][t], reference[j][u]
        if None not in (a, b, x, y) and x != y:
            orders.append(1.0 if sign(a - b) == sign(x - y) else 0.5 if a == b else 0.0)
    return StepChanges(len(pairs), spearman([a for a, _ in pairs], [b for _, b in pairs]),
                       mean([sign(a) == sign(b) for a, b in pairs]), len(orders), mean(orders), failure_cost,
                       sign_confusion(pairs))


def default_failure_cost(trajectories: Sequence[Trajectory], reference: Sequence[Sequence[Any]]) -> float:
    """A failure cost C above every Token-to-Go (as Table 4 chooses it): the smallest power of two of at least twice
    the largest the reference reads on a completable state or the data's successful trajectories took."""
    largest = [float(r.tokens_to_go) for row in reference for r in row
               if r is not None and r.can_complete and r.tokens_to_go is not None]  # fmt: skip
    largest += [float(sum(t.step_tokens or [])) for t in trajectories if t.success]
    return float(2 ** math.ceil(math.log2(max(2 * max(largest, default=1.0), 2.0))))


# ---- calibration of the completion probability ----------------------------------------------------------------------
def fit_temperature(logits: Sequence[float], outcomes: Sequence[float]) -> float:
    """Temperature scaling (Guo et al. 2017): the T > 0 that minimises the mean negative log-likelihood of the
    outcomes under p̃ = σ(logit / T), over held-out states; 1.0 when the states hold a single outcome (nothing to fit)
    or none. T is searched in [e⁻⁵, e⁵] by L-BFGS on log T."""
    import torch

    y = torch.tensor([float(o) for o in outcomes], dtype=torch.float64)
    if len(y) == 0 or y.min() == y.max():
        return 1.0
    z = torch.tensor(list(logits), dtype=torch.float64)
    log_t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z / log_t.clamp(-5, 5).exp(), y)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(log_t.detach().clamp(-5, 5).exp())


def reliability_bins(probabilities: Sequence[float], outcomes: Sequence[bool], bins: int = 10) -> list[dict]:
    """The reliability diagram's points: for each non-empty equal-width probability bin, its bounds, its states, their
    mean p̃ and their outcome rate (a calibrated meter's points lie on the diagonal)."""
    p = np.asarray(probabilities, dtype=float)
    y = np.asarray(outcomes, dtype=float)
    which = np.minimum((p * bins).astype(int), bins - 1)
    return [{"lower": b / bins, "upper": (b + 1) / bins, "states": int((which == b).sum()),
             "mean_probability": float(p[which == b].mean()), "outcome_rate": float(y[which == b].mean())}
            for b in range(bins) if (which == b).any()]  # fmt: skip


def expected_calibration_error(probabilities: Sequence[float], outcomes: Sequence[bool], bins: int = 10) -> float:
    """ECE: Σ_b (n_b / n)·|mean outcome − mean p̃| over ``bins`` equal-width probability bins (NaN for no states)."""
    points = reliability_bins(probabilities, outcomes, bins)
    total = sum(b["states"] for b in points)
    if not total:
        return float("nan")
    return float(sum(b["states"] / total * abs(b["outcome_rate"] - b["mean_probability"]) for b in points))


@dataclass(frozen=True)
class Calibration:
    """A completion-probability temperature fitted on held-out states, and what it changed: the outcomes' mean
    negative log-likelihood, the ECE and the reliability diagram's points under σ(logit) and σ(logit / T).
    ``ece_after`` is measured on the states T was fitted on (optimistic); ``ece_unseen`` on states it was not
    (:func:`cross_fitted_ece`: the held-out trajectories halved, T fitted on each half, read on the other)."""

    temperature: float
    states: int
    nll_before: float
    nll_after: float
    ece_before: float
    ece_after: float
    bins_before: list[dict] = field(default_factory=list)
    bins_after: list[dict] = field(default_factory=list)
    ece_unseen: float = float("nan")

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def calibrate(meter: Any, trajectories: Sequence[Trajectory], targets: dict[str, Sequence[float]] | None = None
              ) -> Calibration:
    """Fit a completion temperature to ``meter``'s logits on every nonterminal decision state of the held-out
    ``trajectories`` against their outcomes — or, with ``targets`` (trajectory id → the completion target of each
    state, from the label source the meter learned), against those. The meter is left as it is: the caller sets the
    temperature (a generative meter is read with ``readout="logit"`` here, so that every state has a logit)."""
    import math

    readings, _ = read_states(meter, trajectories)
    by_trajectory = [[(r.logit, t.success if targets is None else targets[t.id][k]) for k, r in enumerate(row)
                      if r is not None and r.logit is not None] for t, row in zip(trajectories, readings)]  # fmt: skip
    pairs = [pair for rows in by_trajectory for pair in rows]
    logits, outcomes = [z for z, _ in pairs], [y for _, y in pairs]
    temperature = fit_temperature(logits, outcomes)

    def probabilities(t: float) -> list[float]:
        return [calibrated_probability(z, t) for z in logits]

    def nll(t: float) -> float:
        eps = 1e-12
        return mean([-(y * math.log(max(p, eps)) + (1.0 - y) * math.log(max(1.0 - p, eps)))
                     for p, y in zip(probabilities(t), map(float, outcomes))])  # fmt: skip

    return Calibration(temperature, len(pairs), nll(1.0), nll(temperature),
                       expected_calibration_error(probabilities(1.0), outcomes),
                       expected_calibration_error(probabilities(temperature), outcomes),
                       reliability_bins(probabilities(1.0), outcomes),
                       reliability_bins(probabilities(temperature), outcomes),
                       cross_fitted_ece(by_trajectory))  # fmt: skip


def cross_fitted_ece(by_trajectory: Sequence[Sequence[tuple[float, float]]]) -> float:
    """ECE of the calibrated probability on states the temperature was not fitted on: the trajectories split in two
    halves (alternately), T fitted on each half and read on the other, the two ECEs weighted by their states."""
    halves = [[pair for rows in by_trajectory[k::2] for pair in rows] for k in (0, 1)]
    if not all(halves):
        return float("nan")
    total, weighted = 0, 0.0
    for fit_on, read_on in ((halves[0], halves[1]), (halves[1], halves[0])):
        t = fit_temperature([z for z, _ in fit_on], [y for _, y in fit_on])
        weighted += len(read_on) * expected_calibration_error([calibrated_probability(z, t) for z, _ in read_on],
                                                              [y for _, y in read_on])  # fmt: skip
        total += len(read_on)
    return weighted / total
