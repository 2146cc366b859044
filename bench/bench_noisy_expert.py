"""How diverse a noisy-expert pool is where no admissible commands are listed: the success rate of ``expert:EPS`` on
BFCL, τ², AWM and search (docs/environments.md), each cell one ``deltattg evaluate`` run of this Python.

    .venv/bin/python bench/bench_noisy_expert.py --out runs/noisy_expert [--search-data DIR] \
        [--summary docs/results/bench_noisy_expert.json]

``expert:EPS`` plays the gold calls and, with probability EPS per turn, a mistake a tool-using agent makes
(``deltattg.envs.mistakes``); nothing is sampled from a model, and the mistakes are seeded, so a rerun reproduces the
table. AWM (our two example scenarios: six tasks) and search (`--search-data`: 36 questions) play every task. Needs the extras
``[bfcl]``, ``[tau2]``, ``[awm]`` and ``[search]``; an evaluation already under ``--out`` is resumed, not replayed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deltattg.summaries import run_deltattg

EPSILONS = ("0", "0.1", "0.2", "0.4")

@dataclass(frozen=True)
class Setting:
    """An environment and split to evaluate on; ``whole``: play every task (the split has fewer than --episodes)."""

    env: tuple[str, ...]
    split: str
    whole: bool = False


SETTINGS = {"BFCL base": Setting(("--env", "bfcl"), "base"),
            "τ² retail/train": Setting(("--env", "tau2"), "retail/train"),
            "AWM, our example scenarios": Setting(("--env", "awm"), "all", whole=True)}  # fmt: skip


def search_setting(folder: Path) -> Setting:
    """The closed hotpotqa set ``deltattg search-data`` wrote in ``folder``, train and test questions."""
    return Setting(("--env", "search", "--data", str(folder / "questions"), "--corpus", str(folder / "corpus.jsonl")),
                   "train,test", whole=True)  # fmt: skip


def success(out: Path, setting: Setting, epsilon: str, episodes: int) -> dict:
    """``results.json``'s overall row of ``deltattg evaluate`` for ``expert:EPS`` (run or resumed in ``out``) on the
    first ``episodes`` tasks of the split (every task for a ``whole`` setting)."""
    actor = "expert" if epsilon == "0" else f"expert:{epsilon}"
    run_deltattg(["evaluate", *setting.env, "--split", setting.split, "--actor", actor,
                  *([] if setting.whole else ["--episodes", str(episodes)]), "--out", str(out), "--no-progress"])
    return json.loads((out / "results.json").read_text())["overall"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/noisy_expert"))
    parser.add_argument("--episodes", type=int, default=40, help="tasks per evaluation (default 40)")
    parser.add_argument("--search-data", type=Path, help="also the search environment on this closed set (a folder "
                        "`deltattg search-data` wrote)")
    parser.add_argument("--summary", help="the table also as a summary (deltattg.summaries)")
    args = parser.parse_args(argv)
    settings = SETTINGS | ({"search, closed hotpotqa set": search_setting(args.search_data)} if args.search_data else {})
    from deltattg.report import text_table
    from deltattg.summaries import write_summary

    columns = ("expert:EPS, success % (episodes)", *(f"EPS {e}" for e in EPSILONS))
    rows = []
    for name, setting in settings.items():
        cells = []
        for epsilon in EPSILONS:
            folder = f"{setting.env[1]}-{setting.split.replace('/', '-').replace(',', '-')}-{epsilon}"
            overall = success(args.out / folder, setting, epsilon, args.episodes)
            cells.append(f"{100 * overall['success']:.1f} ({overall['episodes']})")
        rows.append([name, *cells])
    print(text_table(columns, rows))
    if args.summary:
        argv_used = argv if argv is not None else sys.argv[1:]
        write_summary(args.summary, "bench_noisy_expert", ["bench/bench_noisy_expert.py", *argv_used],
                      {"success": (columns, rows)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
