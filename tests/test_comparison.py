"""Paired-seed statistics of RL comparisons (``deltattg.demo.comparison``) by hand, and the demo's arm specs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from deltattg.demo.comparison import (
    area_under_curve,
    first_step_reaching,
    mean_estimate,
    reach_ratio,
    success_curve,
    summarize,
)
from deltattg.demo.pipeline import Arm


def test_curve_area_and_first_crossing_by_hand():
    records = [{"step": 0, "eval/greedy_success": 0.1}, {"step": 1, "loss": 0.3},
               {"step": 5, "eval/greedy_success": 0.3}, {"step": 10, "eval/greedy_success": 0.5}]  # fmt: skip
    steps, values = success_curve(records)
    assert (steps, values) == ([0, 5, 10], [0.1, 0.3, 0.5])
    # Trapezoids: 5·(0.1+0.3)/2 + 5·(0.3+0.5)/2 = 1.0 + 2.0 = 3.0, over 10 steps -> 0.3.
    assert area_under_curve(steps, values) == pytest.approx(0.3)
    assert first_step_reaching(steps, values, 0.3) == 5 and first_step_reaching(steps, values, 0.6) is None


def test_intervals_are_seeded_and_collapse_on_identical_seeds():
    assert mean_estimate([0.4] * 5).text(100) == "40.0 [40.0, 40.0]"
    a, b = mean_estimate([0.1, 0.5, 0.2, 0.4, 0.3]), mean_estimate([0.1, 0.5, 0.2, 0.4, 0.3])
    assert a == b and a.low < a.mean < a.high and a.mean == pytest.approx(0.3)
    assert mean_estimate([0.1, 0.2, 0.3]).excludes_zero and not mean_estimate([-0.1, 0.1, 0.0]).excludes_zero


def test_reach_ratio_and_paired_differences_by_hand():
    steps = [0, 10, 20, 30, 40]
    grpo = np.array([[0.1, 0.2, 0.3, 0.4, 0.5]] * 3)  # final mean 0.5
    fast = np.array([[0.1, 0.3, 0.5, 0.6, 0.6]] * 3)  # reaches 0.5 at step 20 -> 20 / 40 = 0.5
    never = np.array([[0.1, 0.1, 0.1, 0.1, 0.1]] * 3)
    assert reach_ratio(fast, grpo, steps).mean == pytest.approx(0.5)
    assert reach_ratio(grpo, grpo, steps).mean == pytest.approx(1.0)
    assert math.isinf(reach_ratio(never, grpo, steps).mean)
    summary = summarize("fast", fast, grpo, steps)
    assert summary.final_minus_grpo.mean == pytest.approx(0.1) and summary.final_minus_grpo.excludes_zero
    # Areas: grpo (0.15+0.25+0.35+0.45)/4 = 0.3; fast (0.2+0.4+0.55+0.6)/4 = 0.4375.
    assert summary.auc_minus_grpo.mean == pytest.approx(0.1375)


def test_arm_specs():
    assert Arm.parse("grpo") == Arm("grpo") and Arm.parse("deltattg") == Arm("deltattg", "learned")
    noisy = Arm.parse("deltattg@oracle:0.5:0.1")
    assert (noisy.meter, noisy.noise, noisy.flip, noisy.name) == ("oracle", 0.5, 0.1, "deltattg@oracle:0.5:0.1")
    assert noisy.folder == "deltattg-oracle-0.5-0.1" and Arm.parse("pos@oracle").name == "pos@oracle"
    assert "meter.oracle_noise=0.5" in noisy.overrides(Path("m"))
    for bad in ("grpo@oracle", "deltattg@magic", "deltattg@oracle:0.5", "nope"):
        with pytest.raises(ValueError):
            Arm.parse(bad)
