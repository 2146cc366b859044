"""Where each credit method puts the credit, offline: ``deltattg inspect`` on noisy-expert household trajectories
scored by the oracle and by degraded oracles (the tables of docs/concepts/credit.md).

    .venv/bin/python bench/bench_inspect.py --out runs/bench_inspect [--summary docs/results/bench_inspect.json]

The user's commands, run with this Python's ``deltattg``: ``collect`` 96 household trajectories (``expert:0.3`` and
``expert:0.6``, 48 tasks each, groups of 8, 12 turns), ``score`` them with the planner (``--meter oracle``, tokens
counted with SmolLM2's tokenizer) exactly and with one kind of error at a time, then ``inspect`` (``--env household``:
each step is progress, neutral or regress by the planner's distance to the goal). Three tables:

* ``methods``: GRPO, the paper's DeltaTTG with the exact and two noisy oracles, GiGPO and HGPO (no meter) — the
  share of positive credit on progress steps and of negative credit on the others, the largest step's share of a
  trajectory's credit and the credit moved from GRPO's places;
* ``errors``: the paper's DeltaTTG and robust DeltaTTG under each kind of meter error (v̂ noise, b̂ flips, the
  learned meter's false b̂ = 0 on successes and missed b̂ = 0 on failures);
* ``stages``: robust DeltaTTG on the σ 0.5 / flip 0.1 oracle with one stage switched off at a time.

Every stage is skipped when its output exists (an interrupted run resumes); nothing here is random but the oracle's
seeded noise, so a rerun reproduces the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from deltattg.summaries import run_deltattg

COLLECT = ["--env", "household", "--short", "--policy", "expert:0.3", "--policy", "expert:0.6", "--episodes", "48",
           "--group-size", "8", "--max-turns", "12"]  # fmt: skip
METERS = {  # scored input -> the oracle's errors (deltattg score --meter oracle ...)
    "exact": [],
    "vnoise": ["--oracle-noise", "0.5"],
    "flip": ["--oracle-flip", "0.1"],
    "noisy": ["--oracle-noise", "0.5", "--oracle-flip", "0.1"],
    "heavy": ["--oracle-noise", "1", "--oracle-flip", "0.3"],
    "falseneg": ["--oracle-false-negative", "0.22"],
    "missed": ["--oracle-missed-failure", "0.26"],
    "learnederrors": ["--oracle-false-negative", "0.22", "--oracle-missed-failure", "0.26"],
}
METER_NAMES = {"exact": "none", "vnoise": "v̂ noise σ 0.5", "flip": "b̂ flips 10 %", "noisy": "σ 0.5 and flips 10 %",
               "heavy": "σ 1 and flips 30 %", "falseneg": "false b̂ = 0 on successes, 22 %",
               "missed": "missed b̂ = 0 on failures, 26 %", "learnederrors": "both of the learned meter's errors"}
STAGES = {"every stage on": [], "soft readout off": ["--no-soft"], "hindsight off": ["--no-hindsight"],
          "smoothing off": ["--smooth", "1"], "share cap off": ["--share-cap", "1e12"], "trust off": ["--trust", "none"],
          "every stage off (the paper's deltattg)": ["--no-soft", "--no-hindsight", "--smooth", "1", "--share-cap",
                                                     "1e12", "--trust", "none"]}  # fmt: skip
INSPECT = ["--failure-cost", "256", "--env", "household", "--tokenizer", "smollm2"]


def inspected(out: Path, name: str, inputs: Sequence[str], methods: str, *flags: str) -> dict:
    """``inspect.json`` of ``deltattg inspect INPUTS --methods M FLAGS`` in ``out/name`` (run unless it is there)."""
    folder = out / name
    if not (folder / "inspect.json").is_file():
        run_deltattg(["inspect", *(str(out / f"{i}.jsonl") for i in inputs), "--methods", methods, *INSPECT, *flags,
                      "--out", str(folder)])  # fmt: skip
    return json.loads((folder / "inspect.json").read_text())


def cells(report: dict, label: str) -> list[str]:
    """An arm's + on progress %, − on the others %, largest step share (mean) and credit moved %."""
    p, c = report["precision"][label], report["concentration"][label]
    return [f"{100 * p['positive_on_progress']:.1f}", f"{100 * p['negative_off_progress']:.1f}",
            f"{c['largest_share_mean']:.3f}", f"{100 * c['redistributed']:.1f}"]  # fmt: skip


def label_of(report: dict, method: str, index: int = 0) -> str:
    """The label of the ``index``-th arm running ``method``."""
    return [arm["label"] for arm in report["arms"] if arm["method"] == method][index]


METHODS_COLUMNS = ("arm", "meter error", "positive credit on progress steps %", "negative credit on the others %",
                   "largest step share, mean", "credit moved from GRPO's places %")  # fmt: skip
ERRORS_COLUMNS = ("meter error", "paper's: + on progress %", "paper's: − on the others %", "paper's: largest share",
                  "robust: + on progress %", "robust: − on the others %", "robust: largest share",
                  "robust: credit moved %")  # fmt: skip
STAGES_COLUMNS = ("robust DeltaTTG", "largest step share, mean", "p90", "credit moved from GRPO's places %",
                  "positive credit on progress steps %", "negative credit on the others %")  # fmt: skip


def tables(out: Path) -> dict[str, tuple]:
    methods = inspected(out, "methods", ["exact", "noisy", "heavy"], "grpo,deltattg,gigpo,hgpo")
    rows = [["GRPO", "–", *cells(methods, label_of(methods, "grpo"))]]
    rows += [["DeltaTTG (the paper's)", METER_NAMES[m], *cells(methods, label_of(methods, "deltattg", k))]
             for k, m in enumerate(["exact", "noisy", "heavy"])]  # fmt: skip
    rows += [["GiGPO (no meter)", "–", *cells(methods, label_of(methods, "gigpo"))],
             ["HGPO (no meter)", "–", *cells(methods, label_of(methods, "hgpo"))]]
    inputs = ["exact", "vnoise", "flip", "noisy", "falseneg", "missed", "learnederrors"]
    errors = inspected(out, "errors", inputs, "grpo,deltattg,deltattg_robust")
    grpo = cells(errors, label_of(errors, "grpo"))
    error_rows = [["GRPO (no meter)", *grpo[:3], "–", "–", "–", "–"]]
    for k, name in enumerate(inputs):
        paper, robust = cells(errors, label_of(errors, "deltattg", k)), cells(errors, label_of(errors, "deltattg_robust", k))
        error_rows.append([METER_NAMES[name], *paper[:3], *robust])
    stage_rows = []
    for name, flags in STAGES.items():
        report = inspected(out, "stage-" + name.split(" (")[0].replace(" ", "-"), ["noisy"], "grpo,deltattg_robust",
                           *flags)  # fmt: skip
        label = label_of(report, "deltattg_robust")
        c, p = report["concentration"][label], report["precision"][label]
        stage_rows.append([name, f"{c['largest_share_mean']:.3f}", f"{c['largest_share_p90']:.3f}",
                           f"{100 * c['redistributed']:.1f}", f"{100 * p['positive_on_progress']:.1f}",
                           f"{100 * p['negative_off_progress']:.1f}"])  # fmt: skip
    return {"methods": (METHODS_COLUMNS, rows), "errors": (ERRORS_COLUMNS, error_rows),
            "stages": (STAGES_COLUMNS, stage_rows)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_inspect"))
    parser.add_argument("--summary", help="the tables also as a summary (deltattg.summaries)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    pool = args.out / "pool.jsonl"
    if not pool.is_file():
        run_deltattg(["collect", *COLLECT, "--out", str(pool), "--no-progress"])
    for name, errors in METERS.items():
        if not (args.out / f"{name}.jsonl").is_file():
            run_deltattg(["score", str(pool), "--meter", "oracle", *errors, "--tokenizer", "smollm2", "--no-progress",
                          "--out", str(args.out / f"{name}.jsonl")])  # fmt: skip
    from deltattg.report import text_table
    from deltattg.summaries import write_summary

    found = tables(args.out)
    print("\n\n".join(f"{name}:\n{text_table(*columns_rows)}" for name, columns_rows in found.items()))
    if args.summary:
        argv_used = argv if argv is not None else sys.argv[1:]
        write_summary(args.summary, "bench_inspect", ["bench/bench_inspect.py", *argv_used], found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
