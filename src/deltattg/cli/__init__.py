"""The ``deltattg`` command line. Each subcommand is a thin shell over a library function, in the module of its
stage: ``envs`` (search-data, serve-retriever, awm-examples: environments' data and servers), ``rollout`` (collect,
guide, evaluate, verl-tasks), ``meter`` (train-meter, score, eval-meter, eval-steps),
``records`` (labels, credit, inspect, methods); ``common`` is what they share; ``train`` and ``demo`` come from
:mod:`deltattg.train.cli` and :mod:`deltattg.demo.cli` (each also runs on its own).

Bad input exits with status 2 and one line ``deltattg: error: FILE:LINE: FIELD: what is wrong``; no output file is
left behind (outputs are written atomically).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from deltattg import __version__
from deltattg.cli import envs, meter, records, rollout
from deltattg.command import run_parsed
from deltattg.demo.cli import add_demo_parser
from deltattg.train.cli import add_train_parser


DOC_PAGES = {  # each command's page in docs/ (the site `make docs` builds), named at the end of its --help
    "search-data": "environments.md", "serve-retriever": "environments.md", "awm-examples": "environments.md",
    "collect": "environments.md", "guide": "guidance-evaluation.md#test-time-guidance-e5",
    "evaluate": "guidance-evaluation.md#evaluation", "verl-tasks": "verl.md#add-deltattg-to-a-verl-run",
    "train-meter": "concepts/meter.md", "score": "concepts/meter.md", "eval-meter": "concepts/meter.md",
    "eval-steps": "concepts/meter.md", "labels": "concepts/labels.md", "credit": "concepts/credit.md",
    "inspect": "concepts/credit.md#where-the-credit-goes-deltattg-inspect", "methods": "concepts/credit.md",
    "train": "training.md#actor-training", "demo": "quickstart.md#the-demo",
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deltattg",
        description="Step-level credit assignment for multi-turn LLM agents with a Token-to-Go progress meter.",
    )
    parser.add_argument("--version", action="version", version=f"deltattg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for stage in (envs, rollout, meter, records):  # the data flow: episodes, the meter, credit over the records
        stage.add_parsers(sub)
    add_train_parser(sub)  # RL with any estimator
    add_demo_parser(sub)  # all of it end to end
    for name, command in sub.choices.items():
        page = f"Documentation: docs/{DOC_PAGES[name]} in the repository (`make docs` builds the site)."
        command.epilog = f"{command.epilog}\n\n{page}" if command.epilog else page
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_parsed(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
