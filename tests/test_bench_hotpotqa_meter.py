"""``bench/bench_hotpotqa_meter.py``'s tables: seed-set means with their t interval, every set's balanced accuracy,
the end-to-end ``eval-steps`` row, the baselines and the costs, from the evaluations a run keeps."""

from __future__ import annotations

import pytest
from conftest import bench_script


@pytest.fixture(scope="module")
def bench():
    return bench_script("bench_hotpotqa_meter")


def quality(accuracy: float, balanced: float, ties: int = 0) -> dict:
    return {"steps": 10, "beneficial": 6, "harmful": 4, "correct": round(10 * accuracy), "ties": ties, "invalid": 0,
            "accuracy": accuracy, "balanced_accuracy": balanced}


def rows(balanced: float, ties: int) -> dict:
    return {"meter (expected)": quality(0.6, balanced, ties), "meter (binary)": quality(0.5, 0.4, 2 * ties),
            "always-beneficial": quality(0.6, 0.5), "random (expected)": quality(0.5, 0.5)}


def test_the_tables_hold_the_seed_set_spread_the_cli_check_and_the_costs(bench):
    done = {"ensemble-0": {"rows": rows(0.50, 1), "train_s": 900.4, "cli_s": 300.0,
                           "cli": {"hotpotqa": rows(0.55, 1), "pooled": rows(0.55, 1)}},
            "ensemble-10": {"rows": rows(0.54, 3), "train_s": 12.0},
            "single-0": {"rows": rows(0.40, 0), "train_s": 10.0}, "single-1": {"rows": rows(0.48, 0), "train_s": 9.0}}
    tables = bench.hotpot_tables(done, seed_sets=2)
    columns, table = tables["step_quality"]
    assert columns[0] == "row" and len(table) == 8
    # mean of 0.50 and 0.54, half width t(1 d.f.) × s/√2 = 12.706 × 0.02 = 25.4 points
    assert table[0] == ["meter, `--ensemble 10`, expected readout", "60.0 ± 0.0 %", "52.0 ± 25.4 %", "50.0 / 54.0", "2.0"]
    assert table[2][2] == "44.0 ± 50.8 %" and table[3][3] == "40.0 / 40.0"
    assert table[4][:3] == ["`eval-steps` on the first seed set, expected readout", "60.0 %", "55.0 %"]
    assert [row[0] for row in table[6:]] == ["always-beneficial", "random (expected)"]
    _, cost = tables["cost"]
    assert cost[0][1] == "10 (6 / 4)" and cost[1][1] == "900 s" and cost[2][1] == "12 s" and cost[3][1] == "300 s"
