"""RL gain over GRPO against the meter's step-change quality: one point per (benchmark, arm that reads a meter).

y: the arm's final greedy success on the test split minus GRPO's, the mean paired difference over the benchmark's
seeds with its 95 % t interval (the benchmark's own report, ``bench_train.json`` in a ``bench/bench_train.py``
``--out`` or archive folder after a report is drawn there). x: the Spearman of the arm's meter's per-step change Δ
against the planner's, on held-out pool states (a ``bench/bench_train.py --meter-fit --summary`` file's ``meters``
records; the oracle is 1 by definition). Each benchmark is paired with the meter-fit summary of its own recipe:

    .venv/bin/python bench/bench_train.py --report-only --allow-mixed --out bench/results/household-20 --seeds ...
    .venv/bin/python bench/gain_vs_delta.py \\
        --benchmark bench/results/household-20 docs/results/bench_train_meter_fit.json \\
        --benchmark bench/results/household-new docs/results/bench_train_meter_fit_220.json \\
        --out docs/images/gain_vs_delta.png --summary docs/results/gain_vs_delta.json

The answer to "how does the RL gain move with Δ": nothing is fitted or asserted, read the intervals.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from deltattg.regime.comparison import Estimate
from deltattg.regime.stages import Arm
from deltattg.summaries import write_summary

STATE_SET = "held-out"
COLUMNS = ("benchmark", "seeds", "arm", "meter read", "meter's Δ Spearman vs planner (held-out)",
           "test − GRPO (points)")  # fmt: skip


def meter_row(arm: Arm) -> str | None:
    """The meter-fit row an arm's meter is read as: ``oracle``, ``belief``, or the learned meter of its label source;
    None for an arm that reads no meter (GRPO) or one the meter-fit does not read (generative, ensembles)."""
    if arm.meter in ("oracle", "belief"):
        return arm.meter
    if arm.meter == "learned" and arm.members == 1:
        return arm.labels
    return None


def delta_of(records: list[dict], row: str) -> float | None:
    """The held-out Δ Spearman of the meter-fit row ``row`` (the first record of that meter on held-out states)."""
    for record in records:
        if record.get("state_set") == STATE_SET and record.get("meter") == row:
            return float(record["delta_spearman"])
    return None


def points(benchmark: Path, fit: Path) -> list[dict[str, Any]]:
    """Every arm of the benchmark that reads a meter the meter-fit summary read: its label, Δ, and paired test gain."""
    report = benchmark / "bench_train.json"
    if not report.is_file():
        raise ValueError(f"{report}: no report there (draw one with bench/bench_train.py --report-only --out {benchmark})")
    arms = json.loads(report.read_text())["arms"]
    records = json.loads(fit.read_text()).get("meters")
    if not isinstance(records, list):
        raise ValueError(f"{fit}: not a --meter-fit summary (no 'meters' records)")
    seeds = json.loads(report.read_text())["seeds"]
    found = []
    for name, summary in arms.items():
        row = meter_row(Arm.parse(name))
        gain = summary.get("test_minus_grpo")
        if row is None or gain is None:
            continue
        delta = delta_of(records, row)
        if delta is None:
            raise ValueError(f"{fit}: no held-out record of the meter {row!r} that {name} reads")
        found.append({"benchmark": str(benchmark), "arm": name, "meter": row, "delta_spearman": delta,
                      "seeds": seeds, "gain": gain["mean"], "low": gain["low"], "high": gain["high"],
                      "p": gain.get("p")})  # fmt: skip
    return found


def machines(benchmarks: list[Path]) -> list[dict[str, Any]]:
    """Which seeds of the benchmarks ran on which machine (each report's ``machines``), for the summary's line."""
    return [run for benchmark in benchmarks
            for run in json.loads((benchmark / "bench_train.json").read_text()).get("machines", [])]  # fmt: skip


def gain_text(point: dict[str, Any]) -> str:
    """The paired gain in points as bench_train's tables write it: mean [95 % t interval] p=…"""
    gain = Estimate(point["gain"], point["low"], point["high"], point.get("p"))
    return gain.text(100, signed=True) + ("" if gain.p is None else f" p={gain.p:.3f}")


def points_table(found: list[dict[str, Any]]) -> list[list[str]]:
    """One row per point: where it comes from, the meter and its Δ, and the paired gain with its interval."""
    return [[Path(p["benchmark"]).name, f"{min(p['seeds'])}–{max(p['seeds'])}", p["arm"], p["meter"],
             f"{p['delta_spearman']:.3f}", gain_text(p)] for p in found]  # fmt: skip


def draw(found: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for k, benchmark in enumerate(dict.fromkeys(p["benchmark"] for p in found)):
        mine = [p for p in found if p["benchmark"] == benchmark]
        x = [p["delta_spearman"] for p in mine]
        y = [100 * p["gain"] for p in mine]
        err = [[100 * (p["gain"] - p["low"]) for p in mine], [100 * (p["high"] - p["gain"]) for p in mine]]
        seeds = mine[0]["seeds"]
        ax.errorbar(x, y, yerr=err, fmt="os"[k % 2], capsize=3,
                    label=f"{Path(benchmark).name} (seeds {min(seeds)}–{max(seeds)})")  # fmt: skip
        for p, xi, yi in zip(mine, x, y):
            ax.annotate(p["arm"], (xi, yi), textcoords="offset points", xytext=(4, 4 - 12 * k), fontsize=7)  # benchmarks apart
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xlabel("meter's Δ Spearman vs the planner (held-out pool states)")
    ax.set_ylabel("test success − GRPO (points, 95 % t interval)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", nargs=2, action="append", required=True, metavar=("RUNS", "METER_FIT"),
                        type=Path, help="a bench_train --out/archive folder with its report, and the --meter-fit "
                        "summary of its meter recipe; repeatable")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="the picture (PNG)")
    parser.add_argument("--summary", type=Path, help="also write the points as a summary (bench/summary.py's "
                        "format: a `points` table and the `points` records)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        found = [p for runs, fit in args.benchmark for p in points(runs, fit)]
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        print(f"gain_vs_delta.py: error: {exc}", file=sys.stderr)
        return 2
    if not found:
        print("gain_vs_delta.py: error: no arm that reads a meter in these benchmarks", file=sys.stderr)
        return 2
    draw(found, args.out)
    rows = points_table(found)
    print(" | ".join(COLUMNS))
    for row in rows:
        print(" | ".join(row))
    if args.summary:
        command = ["bench/gain_vs_delta.py", *(sys.argv[1:] if argv is None else argv)]
        write_summary(args.summary, "gain_vs_delta", command, {"points": (COLUMNS, rows)},
                      measured_on={"runs": machines([runs for runs, _ in args.benchmark])},
                      records={"points": found})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
