"""Comparing RL runs over paired seeds: held-out success curves, their area, steps to reach GRPO's final success,
collapses, and intervals that keep their coverage at a handful of seeds.

* Means and paired differences get the **Student t interval** (mean ± t_{n−1, 0.975}·s/√n) and, for differences,
  the **exact paired permutation p-value** (every one of the 2^n sign flips of the per-seed differences; two-sided,
  statistic = the mean). A percentile bootstrap over 5–10 seeds is too narrow: simulated, its 95 % interval covered
  the true mean about 83 % of the time at 5 seeds, where the t interval holds 95 % for normal differences
  (``tests/test_comparison.py`` checks ≥ 93 % at 10 seeds for normal, moderately skewed and binomial-with-seed-effect
  differences). No interval holds at 10 seeds when some seeds *collapse*: with a tenth of them collapsing the
  differences are bimodal and the t interval covers about 87 % (the bootstrap 79 %), so the tables count collapses
  per arm; read an interval of an arm with collapses as too narrow.
* The steps ratio (the first step a curve reaches a target) is not a mean, so it keeps a percentile bootstrap (seeds
  resampled with replacement, paired); a resample that never reaches the target is ∞, and an end of the interval
  that is ∞ prints ∞.

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
LEVEL = 0.95
COLLAPSE_AT = 0.05  # held-out success at or below this, at any evaluation after the start, is a collapse
EXACT_PERMUTATION_SEEDS = 20  # up to 2^20 sign flips are enumerated; more seeds use 100,000 random flips
ROUND_TO = 9  # decimals a success difference is rounded to before the permutation test (success rates are k / n)


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


def collapsed(curve: Sequence[float], threshold: float = COLLAPSE_AT) -> bool:
    """Whether a run's held-out success fell to ``threshold`` or below at any evaluation after the first."""
    return any(v <= threshold + 1e-12 for v in curve[1:])


# ---- intervals ---------------------------------------------------------------------------------------------------------
def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Student t interval of the mean: x̄ ± t_{n−1, (1+level)/2}·s/√n (s the sample standard deviation). One value
    says nothing about the spread: (−∞, ∞)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return -math.inf, math.inf
    half = stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean() - half), float(x.mean() + half)


def paired_permutation_p(differences: Sequence[float], *, seed: int = 0) -> float:
    """Two-sided p-value of "no difference" for paired per-seed differences: the share of sign flips of the
    differences whose mean is at least as far from 0 as the observed mean (exact: every one of the 2^n flips for
    n ≤ :data:`EXACT_PERMUTATION_SEEDS`). With n seeds the smallest possible p is 2 / 2^n (0.0625 at 5 seeds)."""
    from scipy import stats

    d = np.round(np.asarray(differences, dtype=float), ROUND_TO)  # 0.1 + 0.2 − 0.3 is 0: ties compare as ties
    if len(d) < 2 or not np.any(d):  # one difference: its two flips are equally far from 0
        return 1.0
    exact = len(d) <= EXACT_PERMUTATION_SEEDS
    result = stats.permutation_test((d,), np.mean, permutation_type="samples", alternative="two-sided",
                                    n_resamples=np.inf if exact else 100_000, rng=np.random.default_rng(seed))  # fmt: skip
    return float(min(result.pvalue, 1.0))


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float], n: int, *, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0
) -> tuple[float, float]:
    """95 % percentile interval of ``statistic(indices)`` over ``samples`` resamples of n seed indices. The
    percentiles are order statistics (no interpolation), so infinite values give ∞, never NaN."""
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, n, n)) for _ in range(samples)], dtype=float)
    low, high = np.percentile(values, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2], method="inverted_cdf")
    return float(low), float(high)


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95 % interval, and for a paired difference the permutation p-value."""

    mean: float
    low: float
    high: float
    p: float | None = None

    def text(self, scale: float = 1.0, digits: int = 1, *, signed: bool = False) -> str:
        if math.isnan(self.mean):
            return "-"

        def number(value: float) -> str:
            if math.isinf(value):
                return "∞" if value > 0 else "−∞"
            return f"{scale * value:{'+' if signed else ''}.{digits}f}".replace("-", "−")

        return f"{number(self.mean)} [{number(self.low)}, {number(self.high)}]"

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def verdict(self) -> str:
        """How the README words it: a difference whose interval includes 0 is "no difference"; so is one whose
        interval has no width (every seed's difference the same) while the permutation test finds nothing."""
        degenerate = self.low == self.high and self.p is not None and self.p >= 1 - LEVEL  # no spread, no evidence
        if not self.excludes_zero or degenerate:
            return "no difference"
        return "above" if self.low > 0 else "below"


def mean_estimate(values: Sequence[float]) -> Estimate:
    """Mean of per-seed values with its t interval."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return Estimate(math.nan, math.nan, math.nan)
    return Estimate(float(x.mean()), *t_interval(x))


def paired_difference(arm: Sequence[float], reference: Sequence[float]) -> Estimate:
    """Mean of the per-seed differences arm − reference (seed k paired with seed k), its t interval and the exact
    paired permutation p-value."""
    d = np.round(np.asarray(arm, dtype=float) - np.asarray(reference, dtype=float), ROUND_TO)  # no float noise
    if len(d) == 0:
        return Estimate(math.nan, math.nan, math.nan)
    return Estimate(float(d.mean()), *t_interval(d), p=paired_permutation_p(d))


def reach_ratio(arm: np.ndarray, grpo: np.ndarray, steps: Sequence[int]) -> Estimate:
    """Steps the arm's seed-mean curve needs to reach GRPO's final seed-mean success, ÷ the run's steps, with a paired
    percentile-bootstrap interval (each resample draws the same seeds for both). ``arm`` and ``grpo`` are
    ``[seeds, evals]``; a resample in which the arm never reaches the target counts as ∞."""
    total = steps[-1]

    def ratio(idx: np.ndarray) -> float:
        target = grpo[idx, -1].mean()
        reached = first_step_reaching(steps, arm[idx].mean(axis=0).tolist(), target)
        return math.inf if reached is None else reached / total

    point = ratio(np.arange(len(arm)))
    low, high = bootstrap_ci(ratio, len(arm))
    return Estimate(point, low, high)


def paired_power(sd: float, seeds: int, effect: float, level: float = LEVEL) -> float:
    """Power of the two-sided paired t test at ``level`` to find a true mean difference ``effect`` when the per-seed
    differences spread with standard deviation ``sd``: P(|T| > t_crit), T noncentral t with n − 1 degrees of
    freedom and noncentrality effect·√n / sd (NaN where undefined)."""
    from scipy import stats

    if seeds < 2 or not sd > 0 or math.isnan(sd):
        return math.nan
    df, shift = seeds - 1, effect * math.sqrt(seeds) / sd
    critical = stats.t.ppf((1 + level) / 2, df)
    return float(stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift))


@dataclass
class ArmSummary:
    """One arm against GRPO over paired seeds: final success, area under the curve, paired differences (with their
    permutation p-values), reach ratio, how many of its seeds collapsed, and — where the runs evaluated a test split
    at the end — the final success there, its paired difference, the standard deviation of that difference and the
    power a test of this many seeds has to find a +3-point difference at that spread."""

    arm: str
    seeds: int
    start: Estimate
    final: Estimate
    auc: Estimate
    final_minus_grpo: Estimate
    auc_minus_grpo: Estimate
    reach: Estimate  # steps to reach GRPO's final success ÷ steps
    collapses: int = 0
    test: Estimate | None = None
    test_minus_grpo: Estimate | None = None
    test_sd: float = math.nan  # SD of the paired test differences
    test_power: float = math.nan  # power to find +POWER_EFFECT at that SD and seed count


POWER_EFFECT = 0.03  # the difference the benchmark should be able to see: +3 points of success


def summarize(arm: str, curves: np.ndarray, grpo: np.ndarray, steps: Sequence[int],
              test: np.ndarray | None = None, grpo_test: np.ndarray | None = None) -> ArmSummary:
    """``curves`` / ``grpo``: ``[seeds, evals]`` greedy success of the arm and of GRPO, seed k paired with seed k;
    ``test`` / ``grpo_test``: ``[seeds]`` final success on the test split, where the runs have it."""
    aucs = np.array([area_under_curve(steps, c) for c in curves])
    grpo_aucs = np.array([area_under_curve(steps, c) for c in grpo])
    summary = ArmSummary(
        arm, len(curves), mean_estimate(curves[:, 0]), mean_estimate(curves[:, -1]), mean_estimate(aucs),
        paired_difference(curves[:, -1], grpo[:, -1]), paired_difference(aucs, grpo_aucs),
        reach_ratio(curves, grpo, steps), sum(collapsed(c) for c in curves),
    )  # fmt: skip
    if test is not None and grpo_test is not None:
        differences = np.asarray(test, dtype=float) - np.asarray(grpo_test, dtype=float)
        sd = float(differences.std(ddof=1)) if len(differences) > 1 else math.nan
        summary.test, summary.test_minus_grpo = mean_estimate(test), paired_difference(test, grpo_test)
        summary.test_sd, summary.test_power = sd, paired_power(sd, len(differences), POWER_EFFECT)
    return summary


def seed_curves_png(steps: Sequence[int], curves: dict[str, Sequence[Sequence[float]]]) -> bytes:
    """Each arm's held-out success over training steps: the mean over seeds (rows of ``curves[arm]``, success
    rates) with its 95 % t interval as a band, as PNG bytes."""
    from deltattg.report import figure_png, pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    colors = plt.get_cmap("tab20" if len(curves) > 10 else "tab10").colors  # one distinct colour per arm
    for (name, rows), color in zip(curves.items(), colors):
        c = np.asarray(rows, dtype=float)
        ax.plot(steps, 100 * c.mean(axis=0), "o-", ms=3, label=name, color=color)
        if len(c) > 1:  # the table's 95 % t interval of each evaluation's mean
            low, high = np.array([t_interval(column) for column in c.T]).T
            ax.fill_between(steps, 100 * low, 100 * high, alpha=0.12, color=color)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"held-out greedy success %\n(mean, 95 % t interval, {len(next(iter(curves.values())))} seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return figure_png(fig, dpi=110)
