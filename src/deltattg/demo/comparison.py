"""Comparing RL runs over paired seeds: held-out success curves, their area, steps to reach GRPO's final success, and
95 % bootstrap confidence intervals (seeds resampled with replacement; paired arms share each resample).

Every run of a comparison evaluates on the same schedule (``eval.every``), so a run's curve is the held-out greedy
success at those steps and curves of different seeds and arms line up point by point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_SAMPLES = 10_000
CURVE_METRIC = "eval/greedy_success"


def success_curve(records: Sequence[dict], metric: str = CURVE_METRIC) -> tuple[list[int], list[float]]:
    """(steps, values) of the evaluations in a run's metrics records (step 0 = before training)."""
    evals = [r for r in records if metric in r]
    return [r["step"] for r in evals], [float(r[metric]) for r in evals]


def area_under_curve(steps: Sequence[int], values: Sequence[float]) -> float:
    """Trapezoid area under the curve ÷ its step span: the mean success over training (0..1)."""
    if len(steps) < 2:
        return float(values[0]) if values else math.nan
    area = sum((a + b) / 2 * (t - s) for s, t, a, b in zip(steps, steps[1:], values, values[1:]))
    return float(area / (steps[-1] - steps[0]))


def first_step_reaching(steps: Sequence[int], values: Sequence[float], target: float) -> int | None:
    """The first step whose value is at least ``target`` (None: never)."""
    return next((s for s, v in zip(steps, values) if v >= target - 1e-12), None)


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float], n: int, *, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0
) -> tuple[float, float]:
    """95 % percentile interval of ``statistic(indices)`` over ``samples`` resamples of n seed indices."""
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, n, n)) for _ in range(samples)], dtype=float)
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds with its 95 % bootstrap interval."""

    mean: float
    low: float
    high: float

    def text(self, scale: float = 1.0, digits: int = 1) -> str:
        if math.isnan(self.mean):
            return "-"
        fmt = f"{{:.{digits}f}}"
        hi = "∞" if math.isinf(self.high) else fmt.format(scale * self.high)
        return f"{fmt.format(scale * self.mean)} [{fmt.format(scale * self.low)}, {hi}]"

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def mean_estimate(values: Sequence[float]) -> Estimate:
    """Mean of per-seed values with its bootstrap interval."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return Estimate(math.nan, math.nan, math.nan)
    return Estimate(float(x.mean()), *bootstrap_ci(lambda idx: float(x[idx].mean()), len(x)))


def reach_ratio(arm: np.ndarray, grpo: np.ndarray, steps: Sequence[int]) -> Estimate:
    """Steps the arm's seed-mean curve needs to reach GRPO's final seed-mean success, ÷ the run's steps, with a paired
    bootstrap interval (each resample draws the same seeds for both). ``arm`` and ``grpo`` are ``[seeds, evals]``;
    a resample in which the arm never reaches the target counts as ∞."""
    total = steps[-1]

    def ratio(idx: np.ndarray) -> float:
        target = grpo[idx, -1].mean()
        reached = first_step_reaching(steps, arm[idx].mean(axis=0).tolist(), target)
        return math.inf if reached is None else reached / total

    point = ratio(np.arange(len(arm)))
    low, high = bootstrap_ci(ratio, len(arm))
    return Estimate(point, low, high)


@dataclass
class ArmSummary:
    """One arm against GRPO over paired seeds: final success, area under the curve, paired differences, reach ratio."""

    arm: str
    seeds: int
    start: Estimate
    final: Estimate
    auc: Estimate
    final_minus_grpo: Estimate
    auc_minus_grpo: Estimate
    reach: Estimate  # steps to reach GRPO's final success ÷ steps


def summarize(arm: str, curves: np.ndarray, grpo: np.ndarray, steps: Sequence[int]) -> ArmSummary:
    """``curves`` / ``grpo``: ``[seeds, evals]`` greedy success of the arm and of GRPO, seed k paired with seed k."""
    aucs = np.array([area_under_curve(steps, c) for c in curves])
    grpo_aucs = np.array([area_under_curve(steps, c) for c in grpo])
    return ArmSummary(
        arm, len(curves), mean_estimate(curves[:, 0]), mean_estimate(curves[:, -1]), mean_estimate(aucs),
        mean_estimate(curves[:, -1] - grpo[:, -1]), mean_estimate(aucs - grpo_aucs), reach_ratio(curves, grpo, steps),
    )  # fmt: skip
