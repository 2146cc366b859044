"""Tables of the small benchmark scripts: bench_guidance.py (a row per seed, every arm) and bench_labels.py (each
planner class apart)."""

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


def test_label_class_recalls_count_each_planner_class_apart():
    """bench_labels.py: the share of the planner's completable states labelled completable and of its hopeless
    states labelled hopeless; states either side leaves unread do not count."""
    from deltattg.data.trajectory import MeterOutput

    spec = importlib.util.spec_from_file_location("bench_labels", REPO / "bench" / "bench_labels.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    yes, no = MeterOutput(True, 10.0), MeterOutput(False, None)
    labels = [[no, yes, no, None], [no]]
    planner = [[yes, yes, no, yes], [yes]]
    assert bench.class_recalls(labels, planner) == (1 / 3, 1.0, 3, 1)
