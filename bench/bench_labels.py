"""Label sources against the planner (docs/concepts/labels.md): on a household pool of noisy experts and a random
policy, how each ``deltattg labels --labels SOURCE`` labelling reads the pool's states, taking the planner (the oracle
meter: can the task still be done in the turns left, and how many tokens the expert needs) as the truth.

    .venv/bin/python bench/bench_labels.py --out runs/labels [--summary docs/results/bench_labels.json]

The pool is issue 34's check pool (``collect --env household --short --policy expert:0.3 --policy expert:0.6
--policy random --episodes 24 --group-size 4 --max-turns 12 --tokenizer smollm2``); each labelling is the user's
``deltattg labels`` command, run with this Python (a file already under ``--out`` is kept). Completers: ``random``
and ``expert:0.3``; the expert completer only checks the machinery (it plans with what a planner knows), it is not a
source a benchmark arm may use. Columns: the planner-completable states labelled completable, the planner-hopeless
states labelled hopeless, their mean (balanced accuracy, ``eval-meter``'s ``reference.b_balanced_accuracy``), and
Spearman's ρ of the labels' Token-to-Go against the planner's where both give one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from deltattg.summaries import run_deltattg

POOL = ("--env", "household", "--short", "--policy", "expert:0.3", "--policy", "expert:0.6", "--policy", "random",
        "--episodes", "24", "--group-size", "4", "--max-turns", "12", "--tokenizer", "smollm2", "--seed", "0")  # fmt: skip
ENV = ("--env", "household", "--short", "--max-turns", "12")
# name -> the options of `deltattg labels`
SOURCES = {
    "outcome (the paper's Eq. 1–2)": ("--labels", "outcome"),
    "rollout, random × 4": ("--labels", "rollout", "--completer", "random", "--completions", "4", *ENV),
    "best-of-k, random × 4": ("--labels", "best-of-k", "--completer", "random", "--completions", "4", *ENV),
    "best-of-k, expert:0.3 × 4 (machinery check)": ("--labels", "best-of-k", "--completer", "expert:0.3",
                                                     "--completions", "4", *ENV),
}


def class_recalls(labels: Sequence[Sequence], planner: Sequence[Sequence]) -> tuple[float, float, int, int]:
    """The share of the planner's completable states labelled completable and of its hopeless states labelled
    hopeless, and how many of each (nonterminal states where both give a reading)."""
    pairs = [(bool(a.can_complete), bool(b.can_complete)) for row_a, row_b in zip(labels, planner)
             for a, b in zip(row_a, row_b) if a is not None and b is not None]  # fmt: skip
    completable = [a for a, b in pairs if b]
    hopeless = [not a for a, b in pairs if not b]
    return (sum(completable) / max(len(completable), 1), sum(hopeless) / max(len(hopeless), 1), len(completable),
            len(hopeless))  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("runs/labels"))
    parser.add_argument("--summary", help="the table also as a summary (deltattg.summaries)")
    args = parser.parse_args(argv)
    from deltattg.data.jsonl import read_jsonl
    from deltattg.data.labels import labels_of_records
    from deltattg.data.sources import read_trajectory_file
    from deltattg.data.trajectory import MeterOutput
    from deltattg.hf import load_tokenizer
    from deltattg.meter.fit import agreement_of
    from deltattg.meter.loading import read_states
    from deltattg.meter.oracle import OracleMeter
    from deltattg.report import text_table

    args.out.mkdir(parents=True, exist_ok=True)
    pool = args.out / "pool.jsonl"
    if not pool.exists():
        run_deltattg(["collect", *POOL, "--out", str(pool), "--no-progress"])
    trajectories = [item.trajectory for item in read_trajectory_file(str(pool)).items]
    planner = read_states(OracleMeter(load_tokenizer("smollm2")), trajectories)[0]
    columns = ("labels", "planner-completable labelled completable %", "planner-hopeless labelled hopeless %",
               "balanced accuracy", "TTG Spearman", "Δ Spearman", "Δ sign agreement", "sibling ranking",
               "seconds")  # fmt: skip
    rows = []
    for name, options in SOURCES.items():
        out = args.out / f"labels-{options[1]}-{len(rows)}.jsonl"
        seconds = None if out.exists() else run_deltattg(["labels", str(pool), *options, "--tokenizer", "smollm2",
                                                          "--out", str(out), "--no-progress"])  # fmt: skip
        by_id: dict[str, list] = {}
        for _, record in read_jsonl(out):
            by_id.setdefault(record["id"], []).append(record)
        readings = [[MeterOutput(label.can_complete, label.tokens_to_go) for label in labels_of_records(by_id[t.id], t)]
                    for t in trajectories]  # fmt: skip
        completable, hopeless, n_completable, n_hopeless = class_recalls(readings, planner)
        agreement = agreement_of(trajectories, readings, planner)
        rows.append([name, f"{100 * completable:.1f}", f"{100 * hopeless:.1f}", f"{agreement.b_balanced_accuracy:.3f}",
                     f"{agreement.ttg_spearman:.3f}", f"{agreement.delta_spearman:.3f}",
                     f"{agreement.delta_sign_agreement:.3f}", f"{agreement.sibling_ranking:.3f}",
                     "–" if seconds is None else f"{seconds:.0f}"])
    print(f"{len(trajectories)} trajectories; the planner reads {n_completable} states completable and {n_hopeless} "
          "hopeless")  # fmt: skip
    print(text_table(columns, rows))
    if args.summary:
        from deltattg.summaries import write_summary

        argv_used = argv if argv is not None else sys.argv[1:]
        write_summary(args.summary, "bench_labels", ["bench/bench_labels.py", *argv_used],
                      {"against_planner": (columns, rows)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
