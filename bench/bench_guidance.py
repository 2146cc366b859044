"""Test-time guidance with the oracle meter (E.5, the paper's Table 9 layout): natural rollout, random-of-K and
meter-of-K on the same short household tasks, one ``deltattg guide`` run of this Python per seed.

    .venv/bin/python bench/bench_guidance.py --out runs/guidance [--seeds 0 1 2 3] [--episodes 30] \\
        [--summary docs/results/bench_guidance.json]

The oracle (the household planner) reads every candidate exactly, so the meter-of-K arm shows what a perfect reading
buys an ``expert:0.7`` actor; a learned meter's guidance is in bench_transfer.py. A seed whose ``guide`` JSON is
under ``--out`` is read, not replayed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from deltattg.summaries import run_deltattg

ARMS = ("natural rollout", "random selection", "progress meter")


def guide(out: Path, seed: int, episodes: int, actor: str, candidates: int) -> dict:
    """The JSON of ``deltattg guide`` on short household train tasks with the oracle meter (run unless present)."""
    path = out / f"seed-{seed}.json"
    if not path.exists():
        out.mkdir(parents=True, exist_ok=True)
        run_deltattg(["guide", "--env", "household", "--short", "--actor", actor, "--meter", "oracle", "--tokenizer",
                      "smollm2", "--candidates", str(candidates), "--episodes", str(episodes), "--seed", str(seed),
                      "--json", str(path), "--no-progress"])  # fmt: skip
    return json.loads(path.read_text())


def guidance_table(runs: dict[int, dict]) -> tuple[tuple[str, ...], list[list[str]]]:
    """One row per seed: each arm's success % and average steps."""
    candidates = next(iter(runs.values()))["candidates"] if runs else 4
    columns = ("seed", "tasks", "natural rollout: success %, steps", f"random of {candidates}",
               f"oracle of {candidates}")  # fmt: skip
    rows = []
    for seed, run in runs.items():
        arms = {arm["name"]: arm for arm in run["arms"]}
        rows.append([str(seed), str(run["episodes"]),
                     *(f"{100 * arms[name]['success']:.1f}, {arms[name]['steps']:.1f}" for name in ARMS)])  # fmt: skip
    return columns, rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/guidance"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--episodes", type=int, default=30, help="tasks per seed (default 30)")
    parser.add_argument("--actor", default="expert:0.7", help="the guided actor (default expert:0.7)")
    parser.add_argument("--candidates", type=int, default=4, help="K (default 4)")
    parser.add_argument("--summary", help="the table also as a summary (deltattg.summaries)")
    args = parser.parse_args(argv)
    from deltattg.report import text_table

    runs = {seed: guide(args.out, seed, args.episodes, args.actor, args.candidates) for seed in args.seeds}
    columns, rows = guidance_table(runs)
    print(text_table(columns, rows))
    if args.summary:
        from deltattg.summaries import write_summary

        argv_used = argv if argv is not None else sys.argv[1:]
        write_summary(args.summary, "bench_guidance", ["bench/bench_guidance.py", *argv_used],
                      {"oracle": (columns, rows)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
