"""``bench/bench_transfer.py``: meters sharing one backbone read a pool's features once, and each meter's step
quality equals what ``eval-steps`` gives that meter alone; intervals are Wilson's."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import bench_script
from test_meter_regression import episode, tiny_meter

from deltattg.cli.common import read_records
from deltattg.meter.commands import evaluate_steps
from deltattg.meter.regression import RegressionMeter, make_head


@pytest.fixture(scope="module")
def bench_transfer():
    return bench_script("bench_transfer")


def completable_head(meter: RegressionMeter, seed: int) -> RegressionMeter:
    """A head set by hand: every state completable (logit bias +20), Token-to-Go log1p ≈ 3 + a random projection of
    the features, so Δ's sign varies from step to step and from head to head."""
    torch.manual_seed(seed)
    head = make_head(48, meter.config)
    with torch.no_grad():
        last = head.net[-1]
        last.bias.copy_(torch.tensor([20.0, 3.0]))
        last.weight[0].zero_()
        last.weight[1].mul_(20.0)
    return RegressionMeter(meter.backbone, meter.tokenizer, meter.config, head=head).eval()


def test_shared_features_give_each_meter_its_own_step_quality(bench_transfer, tmp_path):
    base = tiny_meter(seed=0)
    first, second = completable_head(base, 1), completable_head(base, 2)
    rng = random.Random(0)
    path = tmp_path / "pool.jsonl"
    with path.open("w") as out:
        for k in range(6):
            messages = episode(goal=3 + k % 3, actions=3 + k % 3, rng=rng)
            labels = {str(2 + 2 * t): rng.choice([1, -1]) for t in range(3 + k % 3)}
            out.write(json.dumps({"id": f"t{k}", "group": f"g{k}", "reward": float(k % 2), "success": bool(k % 2), "messages": messages,
                                  "step_labels": labels}) + "\n")  # fmt: skip
    items = read_records(str(path), False)
    alone = {name: evaluate_steps(items, meter, 6144.0, progress=False)["pooled"]["meter (binary)"].as_dict()
             for name, meter in (("a", first), ("b", second))}  # each meter reading the pool through its backbone
    cells = bench_transfer.step_quality_cells({"a": first, "b": second}, "pool", items,
                                              tmp_path / "features.pt")  # fmt: skip
    assert (tmp_path / "features.pt").exists()
    assert first.feature_cache == second.feature_cache == tmp_path / "features.pt"
    for name in ("a", "b"):
        assert {k: cells[name][k] for k in alone[name]} == alone[name], name
        low, high = cells[name]["accuracy_ci"]
        assert low <= alone[name]["accuracy"] <= high
    assert all(0 < cells[name]["correct"] < cells[name]["steps"] for name in cells)
    assert cells["a"]["correct"] != cells["b"]["correct"]  # two heads, two readings of the same features


def test_wilson_interval(bench_transfer):
    low, high = bench_transfer.wilson(7, 10)
    assert (round(low, 4), round(high, 4)) == (0.3968, 0.8922)  # Wilson (1927), z = 1.96
    assert bench_transfer.wilson(0, 12)[0] == 0.0


def test_the_transfer_tables_hold_each_cell_and_the_always_beneficial_row(bench_transfer):
    """The report's tables (what --summary writes): a cell per (meter, states read) with its Wilson interval and
    counts, the always-beneficial row from the labelled steps, and a guidance row per arm of each target."""
    cell = {"accuracy": 0.75, "accuracy_ci": [0.41, 0.93], "balanced_accuracy": 0.5, "steps": 8, "beneficial": 6,
            "harmful": 2, "ties": 1}
    quality = {"household": {"household": cell, "bfcl": {**cell, "steps": 0, "beneficial": 0, "harmful": 0}}}
    guide = {"episodes": 10, "arms": [{"name": "natural rollout", "success": 0.5, "steps": 9.0},
                                      {"name": "random selection", "success": 0.3, "steps": 9.5},
                                      {"name": "progress meter", "success": 0.6, "steps": 8.25}]}
    domains = bench_transfer.domains(None, None)
    tables = bench_transfer.transfer_tables(quality, {"household": {"household": guide}}, domains)
    columns, rows = tables["step_quality"]
    assert columns == ("meter ↓ / read on →", "household", "bfcl")
    assert rows[0][1] == "75.0 [41, 93], bal. 50.0, n = 8 (6/2), ties 1"
    assert rows[1] == ["always beneficial", "75.0", "–"]
    _, guidance = tables["guidance"]
    assert [row[1] for row in guidance] == ["natural rollout", "random selection", "meter trained on household"]
    low, high = bench_transfer.wilson(6, 10)
    assert guidance[2][2] == f"60.0 [{100 * low:.0f}, {100 * high:.0f}]" and guidance[2][3] == "8.2"
    assert guidance[0][0].startswith("household (10 episodes, ")
