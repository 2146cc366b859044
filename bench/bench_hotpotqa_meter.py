"""The CPU meter on AgentProcessBench hotpotqa (docs/concepts/meter.md's recipe): step quality on the test split for
several seed sets of the recipe's heads, beside the baselines, and what it costs.

    .venv/bin/python bench/bench_hotpotqa_meter.py --data ../shared/data/agentprocessbench --out runs/hotpot \\
        [--seed-sets 5] [--summary docs/results/bench_hotpotqa_meter.json]

The recipe is the user's command, run with this Python: ``deltattg train-meter hotpotqa.jsonl --split split.json
--subset train --model smollm2 --max-message-chars 1500 --max-length 2048 --pooling last+mean --head-epochs 10
--ensemble 10 --seed S`` into one ``--out``, S = 0, 10, 20, ... (seed set k: heads of seeds 10k … 10k+9), then the
single heads ``--ensemble 1 --seed 0..N-1``. The backbone's features of the train windows are computed by the first
run and reused by every later one (train-meter's ``features.pt``), so a seed set costs seconds. Each trained meter is
read on the test split as ``eval-steps`` reads it (:func:`deltattg.meter.commands.evaluate_steps`, expected and
binary readouts, C = 6144), with the test windows' backbone features also computed once (``test-features.pt``
under ``--out``, the meter's ``feature_cache``); ``eval-steps`` itself runs once, on the first seed set, as the end-to-end check (its batching pads
differently, so its features differ in the last digits and a step whose Δ is close to 0 may flip).

Rows: mean over the seed sets ± the 95 % Student t interval over them (it covers head seeds only, not the sampling
of the 50 test trajectories), and every set's balanced accuracy. An interrupted run resumes: finished evaluations
are kept in ``--out/evaluations.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from deltattg.summaries import run_deltattg

RECIPE = ("--model", "smollm2", "--max-message-chars", "1500", "--max-length", "2048", "--pooling", "last+mean",
          "--head-epochs", "10")  # fmt: skip
FAILURE_COST = 6144.0
READOUTS = ("expected", "binary")


def percent(x: float) -> str:
    return f"{100 * x:.1f} %"


def spread(values: Sequence[float]) -> str:
    """Mean ± half the 95 % t interval, in percent (the mean alone for one value)."""
    from deltattg.regime.comparison import t_interval

    mean = sum(values) / len(values)
    low, high = t_interval(values)
    return percent(mean) if len(values) < 2 else f"{100 * mean:.1f} ± {100 * (high - low) / 2:.1f} %"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--data", type=Path, required=True, help="folder with hotpotqa.jsonl and split.json")
    parser.add_argument("--out", type=Path, default=Path("runs/hotpot"))
    parser.add_argument("--seed-sets", type=int, default=5, help="ensembles of 10 heads, and single heads (default 5)")
    parser.add_argument("--summary", help="the tables also as a summary (deltattg.summaries)")
    args = parser.parse_args(argv)
    from deltattg.cli.common import read_records
    from deltattg.meter.commands import evaluate_steps, select_split
    from deltattg.meter.regression import RegressionMeter

    data, split = args.data / "hotpotqa.jsonl", args.data / "split.json"
    args.out.mkdir(parents=True, exist_ok=True)
    log, meter, done_path = args.out / "commands.log", args.out / "meter", args.out / "evaluations.json"
    done = json.loads(done_path.read_text()) if done_path.exists() else {}
    test = select_split(read_records(str(data), False), str(split), "test")
    runs = [("ensemble", 10, 10 * k) for k in range(args.seed_sets)] + [("single", 1, k) for k in range(args.seed_sets)]
    for kind, size, seed in runs:
        key = f"{kind}-{seed}"
        if key in done:
            continue
        train = ["train-meter", str(data), "--split", str(split), "--subset", "train", *RECIPE, "--ensemble",
                 str(size), "--seed", str(seed), "--out", str(meter)]  # fmt: skip
        seconds = run_deltattg(train, log)
        start = time.perf_counter()
        reader = RegressionMeter.from_pretrained(meter)
        reader.feature_cache = args.out / "test-features.pt"
        rows = evaluate_steps(test, reader, FAILURE_COST, readouts=READOUTS, progress=False)["pooled"]
        done[key] = {"train_s": seconds, "eval_s": time.perf_counter() - start,
                     "rows": {name: q.as_dict() for name, q in rows.items()}}
        if key == "ensemble-0":  # the end-to-end check: the user's eval-steps on the same meter
            check = args.out / "eval-steps.json"
            done[key]["cli_s"] = run_deltattg(["eval-steps", "--meter", str(meter), "--data", str(data), "--split",
                                           str(split), "--subset", "test", "--readout", *READOUTS, "--json",
                                           str(check), "--no-progress"], log)  # fmt: skip
            done[key]["cli"] = json.loads(check.read_text())
        done_path.write_text(json.dumps(done, indent=2) + "\n")
        print(f"[hotpot] {key}: balanced {percent(rows['meter (expected)'].balanced_accuracy)}", file=sys.stderr)

    tables = hotpot_tables(done, args.seed_sets)
    for name, (columns, rows) in tables.items():
        print(f"\n{name}\n" + "\n".join(" | ".join(row) for row in [list(columns), *rows]))
    if args.summary:
        from deltattg.summaries import write_summary

        write_summary(args.summary, "bench_hotpotqa_meter", ["bench/bench_hotpotqa_meter.py",
                                                             *(argv if argv is not None else sys.argv[1:])], tables)
    return 0


def hotpot_tables(done: dict, seed_sets: int) -> dict[str, tuple]:
    """The step-quality table (seed-set means and spreads, the end-to-end check, the baselines) and the cost table
    from the finished evaluations (``--out/evaluations.json``)."""
    first = done["ensemble-0"]
    rows = []
    for kind, label in (("ensemble", "meter, `--ensemble 10`"), ("single", "meter, single head (`--ensemble 1`)")):
        for readout in READOUTS:
            sets = [done[f"{kind}-{10 * k if kind == 'ensemble' else k}"]["rows"][f"meter ({readout})"]
                    for k in range(seed_sets)]  # fmt: skip
            balanced = [q["balanced_accuracy"] for q in sets]
            rows.append([f"{label}, {readout} readout", spread([q["accuracy"] for q in sets]), spread(balanced),
                         " / ".join(f"{100 * b:.1f}" for b in balanced), f"{sum(q['ties'] for q in sets) / len(sets):.1f}"])
    cli = first["cli"]["pooled"]  # eval-steps --json: {dataset or "pooled": rows}
    for readout in READOUTS:
        q = cli[f"meter ({readout})"]
        rows.append([f"`eval-steps` on the first seed set, {readout} readout", percent(q["accuracy"]),
                     percent(q["balanced_accuracy"]), "", str(q["ties"])])
    for name in ("always-beneficial", "random (expected)"):
        q = first["rows"][name]
        rows.append([name, percent(q["accuracy"]), percent(q["balanced_accuracy"]), "", ""])
    steps = first["rows"]["always-beneficial"]
    quality = (("row", "accuracy", "balanced accuracy", "per seed set (balanced)", "ties (Δ = 0, mean)"), rows)
    later = [done[f"ensemble-{10 * k}"]["train_s"] for k in range(1, seed_sets)]
    cost = (("measure", "value"), [
        ["test split: non-neutral steps (beneficial / harmful)",
         f"{steps['steps']} ({steps['beneficial']} / {steps['harmful']})"],
        ["`train-meter`, first run (train features, then 10 heads)", f"{first['train_s']:.0f} s"],
        ["`train-meter`, a later seed set (features reused), slowest", f"{max(later):.0f} s" if later else "–"],
        ["`eval-steps` on the test split (its features, then the heads)", f"{first['cli_s']:.0f} s"],
    ])  # fmt: skip
    return {"step_quality": quality, "cost": cost}


if __name__ == "__main__":
    raise SystemExit(main())
