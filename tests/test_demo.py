"""``deltattg demo --quick`` in-process through its command-line function: it writes ``report.md`` and every plot the
report references (real PNG files), both methods' numbers in the report are the ones in their ``metrics.jsonl``, and
the console gets the summary table. Real tiny models, no mocks; about a minute on one CPU thread."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from deltattg.demo.cli import main
from deltattg.regime.config import QUICK, RECOMMENDED_ARM, RegimeConfig
from deltattg.regime.stages import Arm
from deltattg.demo.report import benchmark, label
from deltattg.report import percent

pytestmark = pytest.mark.slow  # ~40 s: the whole quick demo, once for the module

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
THREADS_BEFORE = torch.get_num_threads()


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, str]:
    """The quick demo's output folder and what it printed on stdout."""
    out = tmp_path_factory.mktemp("demo")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--quick", "--out", str(out), "--threads", "1"]) == 0
    return out, printed.getvalue()


def read_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_report_and_every_plot_it_references_exist(demo):
    out, _ = demo
    report = (out / "report.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert {"success.png", "credit/inspect.png", "meter_fit.png"} <= set(images)
    assert (out / "credit" / "inspect.md").is_file() and "| DeltaTTG (oracle meter) | deltattg |" in report
    for name in images:
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE, name
    assert "Against the planner on the same states" in report and "b̂ balanced accuracy" in report
    assert "the step change Δ_t = c_t − c_{t+1}" in report and "ordered as the planner orders them" in report


def test_report_shows_both_methods_numbers_from_their_metrics(demo):
    out, _ = demo
    report = (out / "report.md").read_text()
    for arm in map(Arm.parse, RegimeConfig().arms):
        records = read_records(out / arm.folder)
        evals = [r for r in records if "eval/greedy_success" in r]
        assert [r["step"] for r in evals] == list(range(QUICK["steps"] + 1))  # eval every step, and before the first
        rl_section = report[report.index("## 5. RL") :]
        row = next(line for line in rl_section.splitlines() if line.startswith(f"| {label(arm.name)} |"))
        for mode in ("greedy", "sampled"):
            first, last = evals[0][f"eval/{mode}_success"], evals[-1][f"eval/{mode}_success"]
            assert f"{percent(first)} → {percent(last)}" in row, (arm, mode, row)


def test_both_methods_start_from_one_actor_and_seed(demo):
    """GRPO and the recommended arm, which reads the seed's meter learned from best-of-k labels (the one the report
    shows), start from one actor and seed."""
    out, _ = demo
    recommended = Arm.parse(RECOMMENDED_ARM)
    grpo, ours = (yaml.safe_load((out / folder / "config.yaml").read_text()) for folder in ("grpo", recommended.folder))
    assert (grpo["algo"]["method"], ours["algo"]["method"]) == ("grpo", recommended.method)
    assert grpo["meter"]["path"] is None and ours["meter"]["path"] == str(out / "meter-best-of-k")
    assert "meter-best-of-k/" in (out / "report.md").read_text()
    assert grpo["actor"] == ours["actor"] and grpo["actor"]["model"] == str(out / "actor")
    assert grpo["run"]["seed"] == ours["run"]["seed"] and grpo["rollout"] == ours["rollout"]


def test_console_summary_has_both_methods_and_the_guidance_table(demo):
    """Each arm's one-seed row, the meter's Δ against the planner, and the paired-seed benchmark's rows beside them,
    named as the evidence."""
    _, printed = demo
    assert all(re.search(rf"^{re.escape(label(arm))}\s", printed, re.MULTILINE) for arm in RegimeConfig().arms)
    assert "step change Δ (what credit reads) against the planner's" in printed
    assert "the evidence; this run's one seed is not" in printed
    assert all(re.search(rf"^{re.escape(row[0])}\s+{re.escape(row[1])}", printed, re.MULTILINE)
               for row in benchmark()["table"]["rows"])
    for condition in ("natural rollout (1)", "random selection (4)", "progress meter (4)"):
        assert condition in printed


def test_the_run_writes_its_numbers_as_a_stamped_summary(demo):
    """``summary.json``: the report's tables as the docs' results tables are generated from them, with the command."""
    out, _ = demo
    summary = json.loads((out / "summary.json").read_text())
    assert summary["name"] == "demo" and summary["command"].startswith("deltattg demo --quick --out ")
    assert {"stages", "meter", "rl", "guidance", "credit"} <= set(summary["tables"])
    report = (out / "report.md").read_text()
    rl = summary["tables"]["rl"]
    assert len(rl["rows"]) == len(RegimeConfig().arms)
    assert all("| " + " | ".join(row) + " |" in report for row in rl["rows"])  # the report's own numbers
    assert summary["machine"]["aten_capability"] == torch.backends.cpu.get_cpu_capability()


def test_the_demo_leaves_the_process_as_it_found_it(demo):
    """It flushes denormals and sets torch threads while it runs; afterwards subnormal floats exist again (hypothesis,
    later in the same pytest process, refuses to run without them) and the thread count is what it was."""
    assert torch.tensor(1e-310, dtype=torch.float64).item() != 0.0
    assert torch.get_num_threads() == THREADS_BEFORE


def test_a_rerun_reuses_what_was_made_as_it_would_be_made_now(demo, tmp_path):
    """The demo's folder is one seed of the regime (``regime.seeds``, as the benchmark's): run again with the same
    settings, it makes nothing again (the actor, pool, meter and RL runs are the first run's files); with a setting
    that shapes the preparation changed, it replaces them (the folder is the demo's own output)."""
    import shutil

    from deltattg.demo.pipeline import run_demo
    from deltattg.regime.config import regime_config

    out, _ = demo
    copy = tmp_path / "demo"
    shutil.copytree(out, copy)
    config = regime_config(quick=True, threads=1)
    made = {name: (copy / name).stat().st_mtime_ns for name in ("actor", "pool.jsonl", "meter-best-of-k/head.pt")}
    runs = {arm: (copy / Arm.parse(arm).folder / "metrics.jsonl").read_text() for arm in config.arms}
    run_demo(config, copy, guidance=False)
    assert {name: (copy / name).stat().st_mtime_ns for name in made} == made
    assert {arm: (copy / Arm.parse(arm).folder / "metrics.jsonl").read_text() for arm in config.arms} == runs
    run_demo(config.replace(meter_epochs=config.meter_epochs + 1), copy, guidance=False)
    assert (copy / "meter-best-of-k" / "head.pt").stat().st_mtime_ns != made["meter-best-of-k/head.pt"]


def test_the_benchmark_the_demo_shows_is_the_documented_one():
    """The paired-seed table the demo prints beside its own seed (package data) is docs/results/bench_train_new.json's
    test table, from the same command and commit."""
    docs = json.loads((Path(__file__).parent.parent / "docs" / "results" / "bench_train_new.json").read_text())
    shown = benchmark()
    assert shown["table"] == docs["tables"]["test"]
    assert (shown["command"], shown["commit"], shown["date"]) == (docs["command"], docs["commit"], docs["date"])
