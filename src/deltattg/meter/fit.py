"""How well a meter reads held-out trajectories (§4.2's meter fit, §5.3's transfer): completion accuracy against the
outcome (b of Eq. 2), Spearman's ρ of predicted against true Token-to-Go (Eq. 1) on the successful trajectories'
states, and, between two meters on the same states, how often their b̂ agree and the rank correlation of their v̂
(a meter moved to another domain against the one trained there). ``deltattg eval-meter`` prints them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from deltattg.data.labels import remaining_sums
from deltattg.data.trajectory import Trajectory
from deltattg.meter.loading import read_states


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

    @property
    def completion_accuracy(self) -> float:
        return mean([p == s for p, s in zip(self.predicted_can, self.success)])

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


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 0..n−1 of ``values``, ties given the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    _, tie, counts = np.unique(np.asarray(values), return_inverse=True, return_counts=True)
    return (np.bincount(tie, weights=ranks) / counts)[tie]


def meter_fit(meter: Any, trajectories: Sequence[Trajectory]) -> MeterFit:
    """The meter's reading of every nonterminal decision state of ``trajectories``, next to its labels."""
    readings, _ = read_states(meter, trajectories)
    fit = MeterFit([], [], [], [])
    for trajectory, row in zip(trajectories, readings):
        for ttg, reading in zip(remaining_sums(trajectory.step_tokens or []), row):
            if reading is None:
                continue
            fit.success.append(trajectory.success)
            fit.true_ttg.append(float(ttg))
            fit.predicted_can.append(bool(reading.can_complete))
            fit.predicted_ttg.append(reading.tokens_to_go)
    return fit


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (ties share their mean rank); NaN for fewer than three pairs or a constant side."""
    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return float("nan")
    return float(np.corrcoef(average_ranks(a), average_ranks(b))[0, 1])


@dataclass(frozen=True)
class Agreement:
    """Two meters on the same nonterminal decision states (those both read validly)."""

    states: int
    completion_agreement: float  # share of states where their b̂ agree
    ttg_spearman: float  # Spearman's ρ of their v̂ (where both give one)

    def as_dict(self) -> dict[str, float]:
        return {"states": self.states, "completion_agreement": self.completion_agreement,
                "ttg_spearman": self.ttg_spearman}  # fmt: skip


def agreement(meter: Any, reference: Any, trajectories: Sequence[Trajectory]) -> Agreement:
    """How ``meter`` agrees with ``reference`` on every nonterminal decision state of ``trajectories``."""
    ours, _ = read_states(meter, trajectories)
    theirs, _ = read_states(reference, trajectories)
    pairs = [(a, b) for row_a, row_b in zip(ours, theirs) for a, b in zip(row_a, row_b)
             if a is not None and b is not None]  # fmt: skip
    ttg = [(a.tokens_to_go, b.tokens_to_go) for a, b in pairs
           if a.tokens_to_go is not None and b.tokens_to_go is not None]  # fmt: skip
    return Agreement(len(pairs), mean([a.can_complete == b.can_complete for a, b in pairs]),
                     spearman([a for a, _ in ttg], [b for _, b in ttg]))  # fmt: skip
