"""``bench/bench_guidance.py``'s table: a row per seed with each arm's success and steps, in the paper's arm order."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_guidance_table_has_a_row_per_seed_with_every_arm():
    spec = importlib.util.spec_from_file_location("bench_guidance", REPO / "bench" / "bench_guidance.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    arms = [{"name": "progress meter", "success": 1.0, "steps": 6.25}, {"name": "natural rollout", "success": 0.5,
            "steps": 15.0}, {"name": "random selection", "success": 1 / 3, "steps": 14.96}]  # fmt: skip
    columns, rows = bench.guidance_table({3: {"candidates": 4, "episodes": 30, "arms": arms}})
    assert columns[-1] == "oracle of 4"
    assert rows == [["3", "30", "50.0, 15.0", "33.3, 15.0", "100.0, 6.2"]]
