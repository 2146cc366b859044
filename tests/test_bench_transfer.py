"""``bench/bench_transfer.py``: meters sharing one backbone read a pool's features once, and each meter's step
quality equals what ``eval-steps`` gives that meter alone; intervals are Wilson's."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest
import torch

from deltattg.cli.common import read_records
from deltattg.meter.commands import evaluate_steps
from deltattg.meter.regression import RegressionMeter, make_head
from test_meter_regression import episode, tiny_meter

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench_transfer():
    spec = importlib.util.spec_from_file_location("bench_transfer", REPO / "bench" / "bench_transfer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_transfer"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


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
    cells = bench_transfer.step_quality_cells({"a": first, "b": second}, "pool", [i.trajectory for i in items],
                                              tmp_path / "features.pt")  # fmt: skip
    assert (tmp_path / "features.pt").exists()
    for name, meter in (("a", first), ("b", second)):
        alone = evaluate_steps(items, meter, 6144.0, progress=False)["pooled"]["meter (binary)"].as_dict()
        assert {k: cells[name][k] for k in alone} == alone, name
        low, high = cells[name]["accuracy_ci"]
        assert low <= alone["accuracy"] <= high
    assert all(0 < cells[name]["correct"] < cells[name]["steps"] for name in cells)
    assert cells["a"]["correct"] != cells["b"]["correct"]  # two heads, two readings of the same features


def test_wilson_interval(bench_transfer):
    low, high = bench_transfer.wilson(7, 10)
    assert (round(low, 4), round(high, 4)) == (0.3968, 0.8922)  # Wilson (1927), z = 1.96
    assert bench_transfer.wilson(0, 12)[0] == 0.0
