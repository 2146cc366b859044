"""The ``deltattg`` command line. Each subcommand is a thin shell over a library function.

Bad input exits with status 2 and one line ``deltattg: error: FILE:LINE: FIELD: what is wrong``; no output file is
left behind (outputs are written atomically).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from deltattg import __version__
from deltattg.errors import InputError

EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """A bad option combination, reported like argparse does (exit 2)."""


def _add_tokenizer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokenizer",
        metavar="NAME_OR_PATH",
        help="HF tokenizer (id, path, 'smollm2' or DIR::FILE.gguf) to count each action's tokens when records lack "
        "step_tokens",
    )


def _add_skip_invalid(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip records that fail validation (their number is reported) instead of stopping at the first one",
    )


def _read(path: str, skip_invalid: bool):
    from deltattg.data.sources import read_trajectories

    items, skipped = read_trajectories(path, skip_invalid=skip_invalid)
    if skipped:
        print(f"deltattg: skipped {skipped} invalid record(s) of {path}", file=sys.stderr)
    return items


def _tokenizer(spec: str | None):
    if spec is None:
        return None
    from deltattg.hf import load_tokenizer

    return load_tokenizer(spec)


def cmd_labels(args: argparse.Namespace) -> int:
    """Write one label record per decision prefix (Eq. 1–2)."""
    from tqdm import tqdm

    from deltattg.data.jsonl import write_jsonl
    from deltattg.data.labels import prefix_labels
    from deltattg.data.tokens import resolve_step_tokens

    items = _read(args.input, args.skip_invalid)
    tokenizer = _tokenizer(args.tokenizer)

    def records():
        for item in tqdm(items, desc="labels", unit="traj", disable=not args.progress):
            try:
                tokens = resolve_step_tokens(item.trajectory, tokenizer) if args.target == "ttg" else None
                yield from prefix_labels(item.trajectory, tokens, target=args.target, terminal=args.terminal)
            except InputError as exc:
                raise exc.located(path=item.path, line=item.line) from None

    count = write_jsonl(args.out, records())
    print(f"wrote {count} prefix labels from {len(items)} trajectories to {args.out}", file=sys.stderr)
    return 0


def cmd_credit(args: argparse.Namespace) -> int:
    """Assign per-step credit with a registered estimator."""
    from deltattg.credit import CreditConfig
    from deltattg.credit.records import assign_credit
    from deltattg.data.jsonl import write_jsonl

    from deltattg.credit.deltattg import needs_failure_cost

    try:
        config = CreditConfig(rho=args.rho, cap=args.cap, failure_cost=args.failure_cost, epsilon=args.epsilon)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if needs_failure_cost(args.method) and args.failure_cost is None:
        raise UsageError(f"--method {args.method} needs --failure-cost C (the paper uses 16384 for ALFWorld/AWM and "
                         "6144 for PaperSearchQA)")
    items = _read(args.input, args.skip_invalid)
    records = assign_credit(items, args.method, config, _tokenizer(args.tokenizer))
    write_jsonl(args.out, records)
    if args.table:
        from deltattg.report import credit_table

        print(credit_table(records))
    print(f"wrote {len(records)} records with --method {args.method} to {args.out}", file=sys.stderr)
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    """List the registered credit estimators."""
    from deltattg.credit import available_estimators
    from deltattg.credit.registry import describe

    for name in available_estimators():
        print(f"{name:10s} {describe(name)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from deltattg.credit import available_estimators
    from deltattg.data.labels import TARGETS

    parser = argparse.ArgumentParser(
        prog="deltattg",
        description="Step-level credit assignment for multi-turn LLM agents with a Token-to-Go progress meter.",
    )
    parser.add_argument("--version", action="version", version=f"deltattg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    labels = sub.add_parser(
        "labels",
        help="Token-to-Go labels for every decision prefix (Eq. 1-2)",
        description="One record per decision prefix t = 0..T-1 of every trajectory: id, group, step, can_complete "
        "(= success) and the target (tokens_to_go | steps_to_go | score; null for unsuccessful trajectories), plus "
        "the prefix messages when the input has messages. Input: our trajectory JSONL or AgentProcessBench records.",
    )
    labels.add_argument("input", help="trajectory JSONL")
    labels.add_argument("--out", required=True, help="label JSONL to write")
    labels.add_argument("--target", choices=TARGETS, default="ttg", help="ttg: remaining assistant tokens (Eq. 1); "
                        "steps: remaining action units (E.6); score: the final outcome (E.6). Default: ttg")
    labels.add_argument("--terminal", action="store_true", help="also label the terminal prefix t = T")
    labels.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    _add_tokenizer(labels)
    _add_skip_invalid(labels)
    labels.set_defaults(func=cmd_labels)

    credit = sub.add_parser(
        "credit",
        help="per-step credit: advantages, step weights and step advantages",
        description="Compute group advantages and redistribute them over steps. Each record needs id, group, reward, "
        "success, step_tokens (or messages + --tokenizer) and, for the DeltaTTG family, meter: one reading per state "
        "before each action ({\"can_complete\": bool, \"tokens_to_go\": n|null}, {\"logit\": x} for logit, "
        "{\"score\": x} for value, null when invalid). Output: each record with advantage, step_weights, "
        "step_advantages and credit (why it was or was not redistributed).",
    )
    credit.add_argument("input", help="trajectory JSONL")
    credit.add_argument("--out", required=True, help="JSONL to write")
    credit.add_argument("--method", default="deltattg", choices=available_estimators(), help="estimator (default: deltattg; see `deltattg methods`)")
    credit.add_argument("--rho", type=float, default=0.2, help="uniform mixing ρ (Eq. 10), default 0.2")
    credit.add_argument("--cap", type=float, default=5.0, help="token multiplier cap M >= 1 (D.4), default 5")
    credit.add_argument("--failure-cost", type=float, default=None, metavar="C",
                        help="cost C of a state predicted unsuccessful and of a failed terminal state (Eq. 7); no default: "
                        "the paper uses 16384 (ALFWorld, AWM) and 6144 (PaperSearchQA)")
    credit.add_argument("--epsilon", type=float, default=1e-6, help="ε of the group standard deviation (Eq. 14)")
    credit.add_argument("--table", action="store_true", help="also print a per-step credit table")
    _add_tokenizer(credit)
    _add_skip_invalid(credit)
    credit.set_defaults(func=cmd_credit)

    methods = sub.add_parser("methods", help="list the credit estimators")
    methods.set_defaults(func=cmd_methods)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except InputError as exc:
        print(f"deltattg: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except UsageError as exc:
        parser.exit(EXIT_BAD_INPUT, f"deltattg {args.command}: error: {exc}\n")


if __name__ == "__main__":
    raise SystemExit(main())
