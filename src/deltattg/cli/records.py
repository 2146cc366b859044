"""Commands over trajectory records: ``labels`` (Token-to-Go labels), ``credit`` (per-step credit of one estimator),
``inspect`` (several estimators side by side, credit precision) and ``methods`` (the registry). Credit options are
built from the registry's ``Option`` records."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from deltattg.cli.common import (
    add_label_source,
    add_skip_invalid,
    add_tokenizer,
    check_out,
    compute_labels,
    label_settings,
    read_records,
    tokenizer_of,
)
from deltattg.command import UsageError, number, positive_int
from deltattg.errors import InputError

if TYPE_CHECKING:
    from deltattg.credit import CreditConfig
    from deltattg.credit.registry import Option

def add_credit_options(parser: argparse.ArgumentParser) -> None:
    """Every setting of the estimators that run on records, built from their registry ``Option`` records (flag,
    domain, help; the default is ``CreditConfig``'s): one argument group per set of methods that read the same
    settings, and ε, which all read."""
    from deltattg.credit.registry import EPSILON

    groups: dict[tuple[str, ...], list[Option]] = {}
    for option, methods in record_options().items():
        groups.setdefault(methods, []).append(option)
    for methods, options in groups.items():
        group = parser.add_argument_group(f"read by {', '.join(methods)}")
        for option in options:
            add_option(group, option)
    add_option(parser, EPSILON)


def record_options() -> dict[Option, tuple[str, ...]]:
    """The settings of the estimators that run on records (not those only ``deltattg train`` runs), each with the
    methods that read it, in registry order."""
    from deltattg.credit import available_estimators, get_estimator

    readers: dict[Option, tuple[str, ...]] = {}
    for name in available_estimators():
        estimator = get_estimator(name)
        if estimator.records_problem() is None:
            for option in estimator.options:
                readers[option] = (*readers.get(option, ()), name)
    return readers


def add_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, option: Option) -> None:
    """``option``'s flag: ``--flag`` / ``--no-flag`` for a bool, its ``choices`` for a word, a number in its domain
    (refused at parse time otherwise) for the rest."""
    shown = "" if option.default is None else ", default %(default)s"
    if option.kind is bool:
        parser.add_argument(option.flag, action=argparse.BooleanOptionalAction, default=option.default,
                            help=option.help + shown)
    elif option.choices:
        parser.add_argument(option.flag, choices=option.choices, default=option.default, help=option.help + shown)
    else:
        parse = number(option.kind, low=option.low, high=option.high, low_open=option.low_open)
        parser.add_argument(option.flag, type=parse, default=option.default, metavar=option.metavar,
                            help=option.help + shown)


def credit_config(args: argparse.Namespace) -> CreditConfig:
    """The ``CreditConfig`` of :func:`add_credit_options`' settings (a usage error when they do not fit together)."""
    from deltattg.credit import CreditConfig
    from deltattg.credit.registry import EPSILON

    try:
        return CreditConfig(**{option.name: getattr(args, option.name) for option in (*record_options(), EPSILON)})
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_labels(args: argparse.Namespace) -> int:
    """Write one label record per decision prefix: the paper's (Eq. 1–2), or from another ``--labels`` source."""
    from tqdm import tqdm

    from deltattg.data.jsonl import write_jsonl
    from deltattg.data.labels import prefix_labels

    settings = label_settings(args)  # refused before anything is read
    if settings.source != "outcome" and (args.target != "ttg" or args.terminal):
        raise UsageError(f"--labels {settings.source} labels Token-to-Go of the nonterminal states: it takes neither "
                         "--target steps/score nor --terminal")
    check_out(args.out, args.input, settings.bootstrap_meter)
    if settings.source == "outcome":
        from deltattg.rollout.label_sources import file_source

        kept = file_source(args.out)
        if kept not in (None, "outcome"):
            raise UsageError(f"--out {args.out} holds {kept} labels (completions cost time to make): refusing to "
                             "replace them with --labels outcome; write elsewhere, or delete the file first")
    items = read_records(args.input, args.skip_invalid)
    tokenizer = tokenizer_of(args.tokenizer)
    if settings.source != "outcome":
        labels, report = compute_labels(args, items, tokenizer, args.out)
        print(f"labels: {report.summary()}", file=sys.stderr)
        print(f"wrote {report.states} prefix labels from {len(items)} trajectories to {args.out}", file=sys.stderr)
        return 0

    def records():
        for item in tqdm(items, desc="labels", unit="traj", disable=not args.progress):
            try:
                tokens = resolve_step_tokens(item.trajectory, tokenizer) if args.target == "ttg" else None
                yield from prefix_labels(item.trajectory, tokens, target=args.target, terminal=args.terminal)
            except InputError as exc:
                raise exc.located(path=item.path, line=item.line) from None

    from deltattg.data.tokens import resolve_step_tokens

    count = write_jsonl(args.out, records())
    print(f"wrote {count} prefix labels from {len(items)} trajectories to {args.out}", file=sys.stderr)
    return 0


def cmd_credit(args: argparse.Namespace) -> int:
    """Assign per-step credit with a registered estimator."""
    from deltattg.credit import get_estimator
    from deltattg.credit.records import assign_credit
    from deltattg.data.jsonl import write_jsonl

    config = credit_config(args)
    problem = get_estimator(args.method).records_problem()  # it reads what no record carries (DelTA's hidden states)
    if problem is not None:
        raise UsageError(problem)
    if get_estimator(args.method).needs_failure_cost and args.failure_cost is None:
        raise UsageError(f"--method {args.method} needs --failure-cost C (the paper uses 16384 for ALFWorld/AWM and "
                         "6144 for PaperSearchQA)")
    check_out(args.out, args.input)
    items = read_records(args.input, args.skip_invalid)
    records = assign_credit(items, args.method, config, tokenizer_of(args.tokenizer))
    write_jsonl(args.out, records)
    if args.table:
        from deltattg.report import credit_table

        print(credit_table(records))
    print(f"wrote {len(records)} records with --method {args.method} to {args.out}", file=sys.stderr)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Per-step credit of several methods side by side; with --env household, credit precision."""
    from pathlib import Path

    from deltattg.credit import available_estimators, get_estimator
    from deltattg.inspection import (
        arms_of,
        concentration_table,
        input_labels,
        inspect_credit,
        precision_table,
        write_report,
    )

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in available_estimators()]
    if not methods or unknown:
        raise UsageError(f"--methods: unknown {unknown or 'none given'}; choose from {', '.join(available_estimators())}")
    if len(set(methods)) != len(methods):
        raise UsageError(f"--methods: name each estimator once, got {args.methods}")
    problem = next(filter(None, (get_estimator(m).records_problem() for m in methods)), None)
    if problem is not None:  # it reads what no record carries (DelTA's hidden states)
        raise UsageError(problem)
    if any(get_estimator(m).needs_failure_cost for m in methods) and args.failure_cost is None:
        raise UsageError("--methods with the ttg or feas signal need --failure-cost C")
    if args.show < 1:
        raise UsageError(f"--show must be at least 1, got {args.show}")
    config = credit_config(args)
    check_out(args.out, *args.input, folder=True)
    names = input_labels(args.input)  # distinct arm labels (the same file twice is refused before any reading)
    inputs = [(name, read_records(path, args.skip_invalid)) for name, path in zip(names, args.input)]
    result = inspect_credit(arms_of(inputs, methods), config, env=args.env, tokenizer=tokenizer_of(args.tokenizer))
    write_report(result, inputs[0][1], Path(args.out), show=args.show)
    if result.precision:
        print(precision_table(result))
    print(concentration_table(result))
    print(f"wrote inspect.md, inspect.json and inspect.png to {args.out}", file=sys.stderr)
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    """List the registered credit estimators."""
    from deltattg.credit import available_estimators, get_estimator

    for name in available_estimators():
        estimator = get_estimator(name)
        options = ", ".join(f"{o.name}={o.default}" for o in estimator.options)
        print(f"{name:10s} {estimator.summary}\n{'':10s} reads: {estimator.inputs()}"
              + (f"; options: {options}" if options else ""))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to ``sub``."""
    from deltattg.credit import available_estimators
    from deltattg.data.labels import TARGETS

    labels = sub.add_parser(
        "labels",
        help="Token-to-Go labels for every decision prefix (Eq. 1-2, or from replayed states)",
        description="One record per decision prefix t = 0..T-1 of every trajectory: id, group, step, can_complete "
        "and the target (tokens_to_go | steps_to_go | score; null where the state is not completable), the label's "
        "source, plus the prefix messages when the input has messages. --labels outcome (default): the paper's "
        "labels, can_complete = the trajectory's success. --labels rollout / best-of-k: the environment is put back "
        "into each recorded state (reset + the recorded actions, every observation checked against the record; a "
        "state that does not reproduce keeps its outcome label, counted) and --completer finishes the episode "
        "--completions times within the turns the record had left; --labels td: bootstrapped from "
        "--bootstrap-meter's readings. These are appended trajectory by trajectory: the same command resumes a "
        "killed run. Input: our trajectory JSONL or AgentProcessBench records (outcome labels only: they carry no "
        "environment to replay).",
    )
    labels.add_argument("input", help="trajectory JSONL")
    labels.add_argument("--out", required=True, help="label JSONL to write (resumed when it holds labels of the same "
                        "settings from a killed run)")
    labels.add_argument("--target", choices=TARGETS, default="ttg", help="ttg: remaining assistant tokens (Eq. 1); "
                        "steps: remaining action units (E.6); score: the final outcome (E.6). Default: ttg")
    labels.add_argument("--terminal", action="store_true", help="also label the terminal prefix t = T")
    labels.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_label_source(labels)
    add_tokenizer(labels)
    add_skip_invalid(labels)
    labels.set_defaults(func=cmd_labels)
    credit = sub.add_parser(
        "credit",
        help="per-step credit: advantages, step weights and step advantages",
        description="Compute group advantages and redistribute them over steps. Each record needs id, group, reward, "
        "success, step_tokens (or messages + --tokenizer) and, for the DeltaTTG family, meter: one reading per state "
        "before each action ({\"can_complete\": bool, \"tokens_to_go\": n|null}, {\"logit\": x} for logit, "
        "{\"score\": x} for value, null when invalid); for igpo and a2tgpo, answer_logprobs: the mean token log-prob "
        "of the task's reference answer after 0..T actions (T + 1 numbers <= 0). Output: each record with advantage, "
        "step_weights, step_advantages, clip_scale (a2tgpo's per-step clip factors) and credit (why it was or was "
        "not redistributed).",
    )
    credit.add_argument("input", help="trajectory JSONL")
    credit.add_argument("--out", required=True, help="JSONL to write")
    credit.add_argument("--method", default="deltattg", choices=available_estimators(), help="estimator (default: deltattg; see `deltattg methods`)")
    add_credit_options(credit)
    credit.add_argument("--table", action="store_true", help="also print a per-step credit table")
    add_tokenizer(credit)
    add_skip_invalid(credit)
    credit.set_defaults(func=cmd_credit)
    inspect = sub.add_parser(
        "inspect",
        help="per-step credit of several methods side by side; credit precision on household rollouts",
        description="Assign credit with every --methods estimator to the scored trajectories of each INPUT (several "
        "inputs: the same trajectories scored by different meters, e.g. a learned meter and the oracle; methods that "
        "read no meter run on the first) and write OUT/inspect.md, inspect.json and inspect.png: per-step credit of a "
        "few trajectories side by side. With --env household every trajectory is replayed with the planner, each step "
        "is progress (its distance to the goal drops), neutral or regress, and the precision table gives each arm's "
        "share of positive credit (A > 0, token-weighted) on progress steps and of negative credit (A < 0) on the "
        "others, beside GRPO's uniform share.",
    )
    inspect.add_argument("input", nargs="+", help="scored trajectory JSONL (the same trajectories in every file); an arm "
                         "names its file by the stem, with as many folders as tell two equal stems apart")
    inspect.add_argument("--methods", default="grpo,deltattg", help="comma-separated estimators (default grpo,deltattg)")
    inspect.add_argument("--out", required=True, help="folder for inspect.md, inspect.json and inspect.png")
    inspect.add_argument("--env", choices=["household"], help="replay with this environment's planner: precision table")
    add_credit_options(inspect)
    inspect.add_argument("--show", type=positive_int, default=4, help="trajectories drawn and tabulated (default 4)")
    add_tokenizer(inspect)
    add_skip_invalid(inspect)
    inspect.set_defaults(func=cmd_inspect)
    methods = sub.add_parser("methods", help="list the credit estimators, what each reads and its options")
    methods.set_defaults(func=cmd_methods)
