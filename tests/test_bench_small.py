"""The small benchmark scripts: bench_guidance.py's table (a row per seed, every arm), bench_labels.py's recalls
(each planner class apart), and run_deltattg, which every benchmark runs the user's commands with."""

from __future__ import annotations

import json

import pytest
from conftest import bench_script


def test_the_guidance_table_has_a_row_per_seed_with_every_arm():
    bench = bench_script("bench_guidance")
    arms = [{"name": "progress meter", "success": 1.0, "steps": 6.25}, {"name": "natural rollout", "success": 0.5,
            "steps": 15.0}, {"name": "random selection", "success": 1 / 3, "steps": 14.96}]  # fmt: skip
    columns, rows = bench.guidance_table({3: {"candidates": 4, "episodes": 30, "arms": arms}})
    assert columns[-1] == "oracle of 4"
    assert rows == [["3", "30", "50.0, 15.0", "33.3, 15.0", "100.0, 6.2"]]


def test_label_class_recalls_count_each_planner_class_apart():
    """bench_labels.py: the share of the planner's completable states labelled completable and of its hopeless
    states labelled hopeless; states either side leaves unread do not count."""
    from deltattg.data.trajectory import MeterOutput

    bench = bench_script("bench_labels")
    yes, no = MeterOutput(True, 10.0), MeterOutput(False, None)
    labels = [[no, yes, no, None], [no]]
    planner = [[yes, yes, no, yes], [yes]]
    assert bench.class_recalls(labels, planner) == (1 / 3, 1.0, 3, 1)


def test_run_deltattg_logs_each_command_and_stops_the_benchmark_on_a_failure(tmp_path):
    """The benchmarks' one way to run the user's commands: output appended to the log after the command line, the
    exit status and time after it; a failing command raises SystemExit naming it and the log (or its stderr)."""
    from deltattg.summaries import run_deltattg

    log = tmp_path / "commands.log"
    assert run_deltattg(["methods"], log) > 0
    text = log.read_text()
    assert text.startswith("$ deltattg methods\n") and "deltattg_robust" in text and ", exit 0]" in text
    missing = str(tmp_path / "missing.jsonl")
    with pytest.raises(SystemExit, match=f"`deltattg labels {missing} --out .*` exited 2:\nsee {log}"):
        run_deltattg(["labels", missing, "--out", str(tmp_path / "l.jsonl")], log)
    with pytest.raises(SystemExit, match="exited 2:\n.*missing.jsonl"):
        run_deltattg(["labels", missing, "--out", str(tmp_path / "l.jsonl")])


def test_meter_candidates_set_meter_fields_only():
    bench = bench_script("bench_meter_candidates")
    assert bench.overrides("meter_epochs=3,meter_delta_weight=1.5,meter_init=actor") == {
        "meter_epochs": 3, "meter_delta_weight": 1.5, "meter_init": "actor"}
    for bad in ("optim.lr=1e-3", "pool_episodes=3", "meter_epochs=three"):
        with pytest.raises((ValueError, TypeError)):
            bench.overrides(bad)


def test_meter_candidates_train_each_recipe_on_each_label_source_and_read_it_against_the_planner(tmp_path):
    """The learnability check's labels are the planner's own readings: a recipe trained on them, and one trained on
    the regime's best-of-k labels, each kept under the seed and read on held-out and training states."""
    bench = bench_script("bench_meter_candidates")
    summary = tmp_path / "candidates.json"
    assert bench.main(["--quick", "--seeds", "0", "--out", str(tmp_path / "bench"), "--labels", "planner",
                       "best-of-k", "--candidates", "one=meter_epochs=1", "--summary", str(summary)]) == 0
    records = json.loads(summary.read_text())["candidates"]
    assert [(r["candidate"], r["labels"]) for r in records] == [("one", "planner"), ("one", "best-of-k")]
    for record in records:
        assert record["held-out"]["states"] > 20 and record["training"]["steps"] > 20
        assert {"delta_spearman", "sibling_ranking", "b_balanced_accuracy"} <= set(record["held-out"])
        assert record["train_seconds"] > 0
    meters = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "bench" / "seed-0" / "candidates").iterdir())
    assert meters == ["best-of-k-one", "planner-one"]
    made = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "bench" / "seed-0" / "candidates").iterdir()}
    assert bench.main(["--quick", "--seeds", "0", "--out", str(tmp_path / "bench"), "--labels", "planner",
                       "--candidates", "one=meter_epochs=1", "--allow-mixed"]) == 0  # the same recipe: reused
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "bench" / "seed-0" / "candidates").iterdir()} == made
    assert bench.main(["--quick", "--seeds", "0", "--out", str(tmp_path / "bench"), "--labels", "planner",
                       "--candidates", "one=meter_epochs=2", "--allow-mixed"]) == 0  # renamed alike, trained anew
    assert len(list((tmp_path / "bench" / "seed-0" / "candidates").iterdir())) == 3


def test_gain_vs_delta_pairs_each_meter_reading_arm_with_its_meters_delta(tmp_path, capsys):
    """gain_vs_delta.py: a point per arm that reads a meter (GRPO none), x the held-out Δ Spearman of the meter it
    reads (the learned meter of its label source, the oracle, the belief reference), y its paired test gain; a
    benchmark without a drawn report, or a meter the fit did not read, exits 2 naming the file."""
    bench = bench_script("gain_vs_delta")
    runs = tmp_path / "runs"
    runs.mkdir()
    gain = {"mean": 0.05, "low": 0.01, "high": 0.09, "p": 0.02}
    (runs / "bench_train.json").write_text(json.dumps({"seeds": [1, 2, 3], "arms": {
        "grpo": {"test_minus_grpo": None}, "deltattg_robust@best-of-k": {"test_minus_grpo": gain},
        "deltattg@belief": {"test_minus_grpo": gain | {"mean": 0.07}}}}))  # fmt: skip
    records = [{"meter": m, "state_set": s, "delta_spearman": d} for m, s, d in (
        ("best-of-k", "training", 0.9), ("labels: best-of-k", "held-out", 0.8), ("best-of-k", "held-out", 0.6),
        ("belief", "held-out", 0.95))]  # fmt: skip
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"meters": records}))
    summary = tmp_path / "points.json"
    assert bench.main(["--benchmark", str(runs), str(fit), "--out", str(tmp_path / "g.png"), "--summary",
                       str(summary)]) == 0  # fmt: skip
    written = json.loads(summary.read_text())
    found = {p["arm"]: (p["delta_spearman"], p["gain"]) for p in written["points"]}
    assert found == {"deltattg_robust@best-of-k": (0.6, 0.05), "deltattg@belief": (0.95, 0.07)}
    assert [row[2:] for row in written["tables"]["points"]["rows"]] == [
        ["deltattg_robust@best-of-k", "best-of-k", "0.600", "+5.0 [+1.0, +9.0] p=0.020"],
        ["deltattg@belief", "belief", "0.950", "+7.0 [+1.0, +9.0] p=0.020"]]  # fmt: skip
    assert (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG")
    fit.write_text(json.dumps({"meters": records[:3]}))  # no belief record
    assert bench.main(["--benchmark", str(runs), str(fit), "--out", str(tmp_path / "h.png")]) == 2
    assert "no held-out record of the meter 'belief'" in capsys.readouterr().err and not (tmp_path / "h.png").exists()
    assert bench.main(["--benchmark", str(tmp_path), str(fit), "--out", str(tmp_path / "h.png")]) == 2
    assert "no report there" in capsys.readouterr().err
