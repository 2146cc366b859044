"""``deltattg demo``: the whole pipeline on embedded defaults (``add_demo_parser`` plugs it into ``deltattg``'s parser;
``python -m deltattg.demo`` runs it on its own)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from collections.abc import Sequence

from deltattg.command import UsageError, number, run_parsed, seed_int

DESCRIPTION = """\
The main job, end to end on the built-in household environment (no network, 2 CPU cores, about 10 minutes):
  1. a tiny word-level Llama actor behaviour-cloned on noisy-expert episodes (the base actor);
  2. trajectories of a pool of diverse policies (noisy experts at several eps, random, the base actor);
  3. the meter of deltattg_robust@best-of-k: best-of-k labels (the base actor completes each pool state K times; no
     planner), a regression meter trained on them (RegimeConfig's meter recipe), its completion probability
     calibrated on held-out pool tasks, and read against the planner: b̂, v̂ and the step change Δ credit reads;
  4. where the credit goes on base-actor rollouts: GRPO, the paper's DeltaTTG and robust DeltaTTG with that meter,
     DeltaTTG with the oracle (`deltattg inspect`'s precision and concentration);
  5. RL from the same base actor and seed: GRPO, robust DeltaTTG with the learned meter (the planner-free arm
     recommended over deltattg with a learned meter) and DeltaTTG with the oracle, evaluated on held-out tasks,
     beside the paired-seed benchmark (bench/bench_train.py, docs/benchmarks.md) — one seed is not evidence;
  6. natural vs random-of-4 vs meter-guided-of-4 action selection for the base actor (Table 9 layout);
  7. report.md with plots (success curves, per-step credit, predicted vs true Token-to-Go) under --out, and a
     summary table on the console.
"""

EPILOG = """\
examples:
  deltattg demo                              # the full demo, ~10 minutes on 2 idle cores -> runs/demo/report.md
  deltattg demo --quick --out runs/quick     # < 2 minutes, nothing learns, every stage and plot runs (CI)
  deltattg demo --model smollm2              # SmolLM2-135M-Instruct actor (offline): RL takes minutes per step on CPU
  deltattg demo --env alfworld --data ALFWORLD_JSON_DIR --model smollm2
                                             # the real benchmark: hours on CPU (resets take seconds), meant for a GPU

--model takes any HF id or path, 'smollm2' or DIR::FILE.gguf; a pretrained actor is used as it is (no cloning) with
the paper's prompt (history window 2) and lr 1e-6. --env alfworld needs the [alfworld] extra and the json_2.1.1 game
files (--data or $ALFWORLD_DATA); it does not fit 15 minutes.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny everything (< 2 minutes): a CI check that every "
                        "stage runs and the full report is written; the numbers mean nothing")  # fmt: skip
    parser.add_argument("--out", default="runs/demo", metavar="DIR", help="output folder (default: runs/demo), one seed "
                        "of the regime as bench/bench_train.py lays it out: a rerun reuses what was made as it would "
                        "be made now and replaces the demo's own files that were made otherwise")  # fmt: skip
    parser.add_argument("--model", metavar="SPEC", help="actor: HF id or path, 'smollm2', DIR::FILE.gguf (default: a "
                        "tiny word-level Llama, behaviour-cloned; smollm2 on alfworld)")  # fmt: skip
    parser.add_argument("--env", choices=["household", "alfworld"], default="household",
                        help="household (built in, default) or alfworld (real games from $ALFWORLD_DATA; "
                        "slow)")  # fmt: skip
    parser.add_argument("--data", metavar="DIR", help="alfworld: the json_2.1.1 game files (default: $ALFWORLD_DATA)")
    parser.add_argument("--seed", type=seed_int, default=0, help="one seed for everything (default 0)")
    parser.add_argument("--threads", type=number(int, low=1, high=1024), metavar="N",
                        help="torch CPU threads (default: the demo's, 1)")
    parser.set_defaults(func=cmd_demo)


def add_demo_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "demo",
        help="the end-to-end demo: pool -> meter -> GRPO vs DeltaTTG -> guidance -> report.md",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    """Run every stage, write the report, print the summary table (bad options, missing data or extras: a usage
    error, exit 2)."""
    from deltattg.regime.config import regime_config
    from deltattg.demo.pipeline import run_demo
    from deltattg.demo.report import SUMMARY_FILE, summary_figures, summary_table, summary_tables, write_report
    from deltattg.summaries import write_summary

    try:
        config = regime_config(quick=args.quick, model=args.model, env=args.env, data_dir=args.data, seed=args.seed,
                             threads=args.threads)
    except ValueError as exc:  # an option combination the demo does not run
        raise UsageError(str(exc)) from exc
    try:
        result = run_demo(config, args.out)
    except (FileNotFoundError, ImportError) as exc:  # missing game files or a missing extra
        raise UsageError(str(exc)) from exc
    report = write_report(result)
    write_summary(Path(args.out) / SUMMARY_FILE, "demo", args.command_line, summary_tables(result),
                  figures=summary_figures(result))
    print(summary_table(result))
    print(f"\nreport: {report} (total {sum(result.timings.values()):.0f} s)", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="deltattg demo", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_arguments(parser)
    return run_parsed(parser, argv)
