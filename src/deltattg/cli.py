"""The ``deltattg`` command line. Each subcommand is a thin shell over a library function.

Bad input exits with status 2 and one line ``deltattg: error: FILE:LINE: FIELD: what is wrong``; no output file is
left behind (outputs are written atomically).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from deltattg import __version__
from deltattg.command import (
    EXIT_NO_READING,
    UsageError,
    failure_cost,
    number,
    positive_float,
    positive_int,
    probability,
    run_parsed,
    seed_int,
    turn_limit,
)
from deltattg.errors import InputError

if TYPE_CHECKING:
    from deltattg.credit import CreditConfig
    from deltattg.credit.registry import Option

def _check_out(out: str | None, *inputs: str | None, folder: bool = False) -> None:
    """Refuse, before any work, an ``--out`` that is one of the command's inputs (compared as resolved paths, so
    ``./x`` and ``x`` and links are the same file), a folder where a file is written, a file where a folder is, or a
    place that cannot be written (a read-only file system, a missing permission)."""
    import os
    from pathlib import Path

    if out is None:
        return
    target = Path(out).expanduser()
    for source in inputs:
        if source is None:
            continue
        path = Path(source).expanduser()
        same = path.resolve() == target.resolve()
        if not same and path.exists() and target.exists():
            same = os.path.samefile(path, target)
        if same:
            raise UsageError(f"--out {out} is also an input ({source}): refusing to overwrite it")
    from deltattg.data.jsonl import check_output_file, check_writable

    if folder:
        if target.exists() and not target.is_dir():
            raise InputError("exists and is not a folder (this command writes a folder)", path=out)
    else:
        check_output_file(target)
    check_writable(target, folder=folder)  # an unwritable place is refused here, not after the work


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


def _add_tokenizer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokenizer",
        metavar="NAME_OR_PATH",
        help="HF tokenizer (id, path, 'smollm2' or DIR::FILE.gguf) to count each action's tokens when records lack "
        "step_tokens",
    )


SPLITS = ("(household, alfworld: train, valid_seen, valid_unseen; alfworld also valid_train; bfcl: base, miss_func, "
          "miss_param, long_context; tau2: retail, airline, telecom, DOMAIN/test, ...); default train (bfcl: base; "
          "tau2: retail)")


def _add_environment(parser: argparse.ArgumentParser, *, several_splits: bool = False) -> None:
    """--env, --split, --short and --data: which environment and which of its tasks."""
    from deltattg.envs.registry import ENVIRONMENTS

    parser.add_argument("--env", required=True, choices=ENVIRONMENTS)
    parser.add_argument("--split", help=("task split, or several separated by commas " if several_splits
                                         else "task split ") + SPLITS)
    parser.add_argument("--short", action="store_true", help="household: short tasks for CPU demos")
    parser.add_argument("--data", help="alfworld: the json_2.1.1 folder (default: $ALFWORLD_DATA)")


def _add_rollout(parser: argparse.ArgumentParser, max_new_tokens: int, seed_help: str | None = None) -> None:
    """--max-turns, --temperature, --max-new-tokens and --seed: how the episodes are played."""
    from deltattg.rollout.policies import SamplingConfig

    parser.add_argument("--max-turns", type=number(int, low=1, high=10**5),
                        help="stop an episode after this many actions (default: the env's)")
    parser.add_argument("--temperature", type=number(float, low=0, high=100), default=SamplingConfig.temperature,
                        help="lm actors: sampling temperature (0 = greedy), default %(default)s")
    parser.add_argument("--max-new-tokens", type=number(int, low=1, high=10**6), default=max_new_tokens,
                        help="lm actors: tokens per action, default %(default)s")
    parser.add_argument("--seed", type=seed_int, default=0, help=seed_help)
    parser.add_argument("--prefix-cache", type=number(int, low=0, high=10**4), default=SamplingConfig.prefix_cache,
                        metavar="N", help="in-process lm actors: generate one prompt at a time, keeping the key/values "
                        "of the N most recent conversations so a prompt is prefilled only past the prefix it shares "
                        "with one (the next turn; the same system prompt). Worth it on CPU with long prompts (bfcl, "
                        "tau2); 0 (default): batched, no reuse")


def _environment(args: argparse.Namespace, splits: Sequence[str]) -> tuple:
    """``(make_env, an instance, the tasks of splits)`` of the environment ``args`` name; ``ValueError`` when the
    splits hold no task (alfworld: no data at --data or $ALFWORLD_DATA)."""
    from deltattg.envs.registry import env_factory

    make_env = env_factory(args.env, data=args.data, size="short" if args.short else "full")
    probe = make_env()
    tasks = [task for split in splits for task in probe.tasks(split)]
    if not tasks:
        raise ValueError(f"--split {','.join(splits)}: the {args.env} environment has no tasks in it")
    return make_env, probe, tasks


def _add_skip_invalid(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip records that fail validation (their number is reported) instead of stopping at the first one",
    )


def _read(path: str, skip_invalid: bool):
    from deltattg.data.sources import read_trajectory_file

    read = read_trajectory_file(path, skip_invalid=skip_invalid)
    if read.skipped:
        what = [f"{read.invalid} invalid record(s)"] if read.invalid else []
        what += [f"{read.duplicates} record(s) repeating an earlier id"] if read.duplicates else []
        print(f"deltattg: skipped {' and '.join(what)} of {path}", file=sys.stderr)
    return read.items


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

    _check_out(args.out, args.input)
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
    _check_out(args.out, args.input)
    items = _read(args.input, args.skip_invalid)
    records = assign_credit(items, args.method, config, _tokenizer(args.tokenizer))
    write_jsonl(args.out, records)
    if args.table:
        from deltattg.report import credit_table

        print(credit_table(records))
    print(f"wrote {len(records)} records with --method {args.method} to {args.out}", file=sys.stderr)
    return 0


GENERATIVE_STAGE = "sft+grpo"  # train-meter --stage's default


def _kind_options() -> dict[str, tuple[str, str, object]]:
    """``--option -> (the kind it trains, its attribute, its default)`` for ``train-meter``'s one-kind options."""
    from deltattg.meter.regression import RegressionConfig
    from deltattg.meter.train_regression import RegressionTrainConfig

    regression = {"--target": ("target", RegressionConfig.target),
                  "--ensemble": ("ensemble", RegressionConfig.ensemble), "--layer": ("layer", RegressionConfig.layer),
                  "--calibration-fraction": ("calibration_fraction", 0.0),
                  "--pooling": ("pooling", RegressionConfig.pooling),
                  "--max-message-chars": ("max_message_chars", RegressionConfig.max_message_chars),
                  "--head-epochs": ("head_epochs", RegressionTrainConfig.head_epochs), "--full": ("full", False)}
    generative = {"--stage": ("stage", GENERATIVE_STAGE), "--lora": ("lora", False)}
    return {**{flag: ("regression", *v) for flag, v in regression.items()},
            **{flag: ("generative", *v) for flag, v in generative.items()}}


def _check_kind_options(args: argparse.Namespace) -> None:
    """Refuse options set away from their default that train the other kind of meter than ``--kind``."""
    foreign = [flag for flag, (kind, name, default) in _kind_options().items()
               if kind != args.kind and getattr(args, name) != default]  # fmt: skip
    if foreign:
        other = "generative" if args.kind == "regression" else "regression"
        raise UsageError(f"{', '.join(foreign)} {'trains' if len(foreign) == 1 else 'train'} a {other} meter "
                         f"(--kind {other}), not a {args.kind} one")


def cmd_train_meter(args: argparse.Namespace) -> int:
    """Train a progress meter on recorded trajectories (outcomes only; step labels never enter training). Every option,
    the output folder and every record are checked before training starts or anything is printed; the meter appears
    at --out whole or not at all (built in a work folder next to it)."""
    from deltattg.meter.commands import check_meter_output, select_split, train_generative, train_regression

    _check_out(args.out, args.data, args.split, folder=True)
    _check_kind_options(args)
    check_meter_output(args.out, model=args.model, tokenizer=args.tokenizer)
    items = select_split(_read(args.data, args.skip_invalid), args.split, args.subset)
    if not items:
        raise UsageError("no trajectories left to train on (check --split / --subset)")
    limit = records_turn_limit(items) if args.turn_limit == "auto" else args.turn_limit
    heldout: list = []
    if args.calibration_fraction:
        from deltattg.data.sources import split_by_task

        items, heldout = split_by_task(items, args.calibration_fraction, args.seed)
        if not items or not heldout:
            raise UsageError(f"--calibration-fraction {args.calibration_fraction} leaves no tasks to train on or none "
                             "to calibrate on")
    tokenizer = _tokenizer(args.tokenizer)
    if args.kind == "regression":
        meter_settings = {"max_length": args.max_length, "max_message_chars": args.max_message_chars,
                          "pooling": args.pooling, "target": args.target, "ensemble": args.ensemble, "layer": args.layer,
                          "turn_limit": limit}  # fmt: skip
        train_settings = {"freeze_backbone": not args.full, "head_epochs": args.head_epochs, "epochs": args.epochs,
                          "batch_size": args.batch_size, "seed": args.seed}
        if args.lr is not None:
            train_settings["lr_head_frozen" if not args.full else "lr_backbone"] = args.lr
        report = train_regression(items, args.model, args.out, count_tokenizer=tokenizer, meter_settings=meter_settings,
                                  train_settings=train_settings, calibration=heldout)  # fmt: skip
        print(f"{report['examples']} decision states; final loss {report['final_loss']:.4f}", file=sys.stderr)
        if "calibration" in report:
            fit = report["calibration"]
            print(f"completion temperature {fit['temperature']:.3f} on {fit['states']} held-out states (ECE "
                  f"{fit['ece_before']:.3f} -> {fit['ece_after']:.3f})", file=sys.stderr)
    else:
        settings = {"num_train_epochs": args.epochs, "per_device_train_batch_size": args.batch_size, "seed": args.seed}
        if args.lr is not None:
            settings["learning_rate"] = args.lr
        train_generative(items, args.model, args.out, stage=args.stage, count_tokenizer=tokenizer,
                         max_prompt_tokens=args.max_length, lora=args.lora, train_settings=settings, turn_limit=limit)
    print(f"saved the meter to {args.out}", file=sys.stderr)
    return 0


def records_turn_limit(items: Sequence) -> int | None:
    """The turn limit every record's ``env.max_turns`` agrees on (``collect`` and ``train`` write it), else ``None``."""
    limits = {(item.trajectory.extra.get("env") or {}).get("max_turns") if isinstance(item.trajectory.extra.get("env"), dict)
              else None for item in items}  # fmt: skip
    limit = limits.pop() if len(limits) == 1 else None
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1 else None


def _meter(args: argparse.Namespace):
    from deltattg.meter.loading import load_meter
    from deltattg.meter.oracle import ORACLE, OracleConfig

    dials = (args.oracle_noise, args.oracle_flip, args.oracle_false_negative, args.oracle_missed_failure)
    if args.meter != ORACLE and any(dials):
        raise UsageError("--oracle-noise, --oracle-flip, --oracle-false-negative and --oracle-missed-failure dial the "
                         "oracle meter: use them with --meter oracle")
    try:
        oracle = OracleConfig(noise=args.oracle_noise, flip=args.oracle_flip, seed=args.oracle_seed,
                              false_negative=args.oracle_false_negative, missed_failure=args.oracle_missed_failure)
        if args.meter == ORACLE and getattr(args, "tokenizer", None) is None:
            raise ValueError("--meter oracle counts Token-to-Go with --tokenizer NAME_OR_PATH (the one `labels` uses)")
        return load_meter(args.meter, endpoint_model=args.meter_model, cache=args.cache,
                          endpoint_timeout_s=getattr(args, "meter_timeout", 60.0),
                          tokenizer=getattr(args, "tokenizer", None), oracle=oracle)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_score(args: argparse.Namespace) -> int:
    """Add the meter's reading of every decision state to each trajectory (what ``credit`` consumes)."""
    from deltattg.data.jsonl import write_jsonl
    from deltattg.credit.records import queried
    from deltattg.meter.commands import score_records

    _check_out(args.out, args.input, args.cache)
    items = _read(args.input, args.skip_invalid)
    meter = _meter(args)
    asked = queried(items) if args.skip_zero_advantage else [True] * len(items)
    records = score_records(items, meter, asked=asked, progress=args.progress)
    read = [r for record, ask in zip(records, asked) if ask for r in record["meter"]]
    invalid = sum(r is None for r in read)
    if read and invalid == len(read):  # nothing usable: refuse to write a file of nulls
        last = _last_meter_error(meter)
        print(f"deltattg: error: no valid reading: every one of {len(read)} readings was null"
              f"{f' (last error: {last})' if last else ''}; nothing written to {args.out}", file=sys.stderr)
        return EXIT_NO_READING
    write_jsonl(args.out, records)
    unread = sum(len(record["meter"]) for record in records) - len(read)
    note = f"; {unread} states of zero-advantage trajectories not read" if unread else ""
    print(f"wrote {len(records)} scored trajectories to {args.out} ({invalid} of {len(read)} readings null{note})",
          file=sys.stderr)
    return 0


def _last_meter_error(meter) -> str | None:
    """The latest failure a meter (or the backend it wraps) recorded, e.g. an endpoint's HTTP status and URL."""
    while meter is not None:
        last = getattr(getattr(meter, "stats", None), "last_error", None)
        if last:
            return str(last)
        meter = getattr(meter, "meter", None)
    return None


def cmd_eval_steps(args: argparse.Namespace) -> int:
    """Step-quality accuracy of a meter against step labels (§5.1, E.6)."""
    from deltattg.data.jsonl import write_json
    from deltattg.meter.commands import evaluate_steps, select_split
    from deltattg.meter.step_quality import format_table

    _check_out(args.json, args.data, args.split, args.cache)
    items = select_split(_read(args.data, args.skip_invalid), args.split, args.subset)
    results = evaluate_steps(items, _meter(args), args.failure_cost, readouts=args.readout, progress=args.progress)
    for dataset, rows in results.items():
        print(f"== {dataset} ==")
        print(format_table(rows))
    if args.json:
        write_json(args.json, {d: {name: q.as_dict() for name, q in rows.items()} for d, rows in results.items()})
    return 0


def cmd_eval_meter(args: argparse.Namespace) -> int:
    """Completion accuracy and TTG rank correlation of a meter on labelled trajectories (and its agreement with a
    reference meter on the same states)."""
    from deltattg.data.jsonl import write_json
    from deltattg.data.tokens import resolve_step_tokens
    from deltattg.meter.commands import evaluate_meter
    from deltattg.meter.loading import load_meter

    _check_out(args.json, args.data, args.cache)
    items = _read(args.data, args.skip_invalid)
    tokenizer = _tokenizer(args.tokenizer)
    for item in items:
        try:
            item.trajectory.step_tokens = resolve_step_tokens(item.trajectory, tokenizer)
        except InputError as exc:
            raise exc.located(path=item.path, line=item.line) from None
    meter = _meter(args)
    try:  # refused up front
        reference = load_meter(args.reference, tokenizer=args.tokenizer) if args.reference else None
    except ValueError as exc:
        raise UsageError(f"--reference {args.reference}: {exc}") from None
    fit, agree = evaluate_meter(items, meter, reference)
    if not fit.success:  # nothing to measure: refuse to print NaN
        last = _last_meter_error(meter)
        print(f"deltattg: error: no valid reading: the meter read every state of {args.data} as null"
              f"{f' (last error: {last})' if last else ''}; nothing measured", file=sys.stderr)
        return EXIT_NO_READING
    results = {"meter": args.meter, "data": args.data, "trajectories": len(items), **fit.as_dict()}
    print(f"{args.meter} on {len(items)} trajectories of {args.data}: {fit.completion_accuracy:.1%} completion "
          f"accuracy, Spearman {fit.spearman:.3f} of predicted vs true TTG ({len(fit.success)} states)")
    if agree is not None:
        results["reference"] = {"meter": args.reference, **agree.as_dict()}
        print(f"against {args.reference}: b agrees on {agree.completion_agreement:.1%} of {agree.states} states, "
              f"Spearman {agree.ttg_spearman:.3f} of the two meters' TTG")
    if args.json:
        write_json(args.json, results)
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    """Roll out a pool of policies in an environment and write their trajectories."""
    from deltattg.data.jsonl import write_jsonl
    from deltattg.data.tokens import count_step_tokens
    from deltattg.envs.registry import DEFAULT_SPLIT
    from deltattg.rollout.collect import collect, parse_policy
    from deltattg.rollout.policies import SamplingConfig

    _check_out(args.out)
    split = args.split or DEFAULT_SPLIT[args.env]
    try:
        specs = [parse_policy(p) for p in args.policy]
        names = [spec.name for spec in specs]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"--policy {', '.join(repeated)} given more than once (trajectory ids would repeat)")
        make_env, _, _ = _environment(args, [split])
        sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                                  prefix_cache=args.prefix_cache)
    except (ValueError, ImportError, OSError) as exc:
        raise UsageError(str(exc)) from None
    tokenizer = _tokenizer(args.tokenizer)
    trajectories = collect(make_env, split, specs, episodes=args.episodes,
                           group_size=args.group_size, seed=args.seed, sampling=sampling, max_turns=args.max_turns,
                           progress=args.progress)
    for traj in trajectories:
        if traj.step_tokens is None and tokenizer is not None:
            traj.step_tokens = count_step_tokens(traj.messages or [], tokenizer)
        for step in traj.steps or []:
            step.prompt_ids = None  # rebuilt from the messages when needed; keeps the file small
    write_jsonl(args.out, (t.to_json() for t in trajectories))
    for spec in specs:
        mine = [t for t in trajectories if t.policy == spec.name]
        rate = sum(t.success for t in mine) / max(len(mine), 1)
        print(f"{spec.name:>16}: {len(mine)} episodes, success {100 * rate:.1f}%", file=sys.stderr)
    print(f"wrote {len(trajectories)} trajectories to {args.out}", file=sys.stderr)
    return 0


def cmd_verl_tasks(args: argparse.Namespace) -> int:
    """verl's training data for the deltattg_env agent loop: one parquet row per task."""
    from deltattg.envs.registry import DEFAULT_SPLIT
    from deltattg.verl.tasks import task_rows, write_parquet

    _check_out(args.out)
    split = args.split or DEFAULT_SPLIT[args.env]
    try:
        make_env, _, _ = _environment(args, [split])
        rows = task_rows(make_env, split, args.limit)
    except (ValueError, ImportError, OSError) as exc:
        raise UsageError(str(exc)) from None
    write_parquet(rows, args.out)
    print(f"wrote {len(rows)} {args.env} tasks of split {split} to {args.out}", file=sys.stderr)
    return 0


def cmd_guide(args: argparse.Namespace) -> int:
    """Test-time action selection (E.5): natural rollout vs random-of-K vs meter-of-K on the same tasks (Table 9)."""
    from deltattg.data.jsonl import write_json
    from deltattg.envs.registry import DEFAULT_SPLIT
    from deltattg.guidance import compare_guidance, guidance_header, guidance_row
    from deltattg.report import text_table
    from deltattg.meter.oracle import ORACLE
    from deltattg.rollout.collect import build_policy, check_episodes, choose_tasks, parse_policy
    from deltattg.rollout.policies import SamplingConfig
    from deltattg.rollout.prompts import PromptConfig

    if args.meter == ORACLE and args.env != "household":
        raise UsageError("--meter oracle reads the household planner: use it with --env household")
    _check_out(args.json, args.cache)
    split = args.split or DEFAULT_SPLIT[args.env]
    try:
        spec = parse_policy(args.actor)
        make_env, probe, tasks = _environment(args, [split])
        check_episodes(args.episodes, tasks)  # each task once, as evaluate plays them
    except (ValueError, ImportError, OSError) as exc:
        raise UsageError(str(exc)) from None
    meter = _meter(args)
    tasks = choose_tasks(tasks, args.episodes, 1, args.seed)
    sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                              prefix_cache=args.prefix_cache)
    prompt = PromptConfig(layout=getattr(probe, "prompt_layout", "window"))
    if spec.kind in ("expert", "random"):  # stateful: every arm starts a fresh one from the same seed
        def make_actor():
            return build_policy(spec, args.seed, sampling, prompt)
    else:  # a model: loaded once, every arm from the same torch seed
        actor = build_policy(spec, args.seed, sampling, prompt)

        def make_actor():
            return actor
    result = compare_guidance(make_env, tasks, make_actor, meter, candidates=args.candidates, seed=args.seed,
                              max_turns=args.max_turns, progress=args.progress)  # fmt: skip
    print(f"test-time action selection, {len(tasks)} {args.env} {split} tasks, meter {args.meter} (Table 9 layout):")
    print(text_table(guidance_header(args.candidates), [guidance_row(spec.name, split, result.rows)]))
    wall = sum(row.seconds for row in result.rows)
    print(f"meter: {result.meter_seconds:.2f} s of the meter-guided arm's {result.rows[-1].seconds:.2f} s "
          f"({100 * result.meter_share:.1f}%); all arms {wall:.2f} s")
    if args.json:
        report = {"env": args.env, "short": args.short, "split": split, "actor": args.actor, "meter": args.meter,
                  "candidates": args.candidates, "episodes": len(tasks), "seed": args.seed,
                  "max_turns": args.max_turns, "tasks": [t.id for t in tasks],
                  "arms": [{"name": r.name, "candidates": r.candidates, "success": r.success, "steps": r.steps,
                            "seconds": r.seconds} for r in result.rows],
                  "meter_seconds": result.meter_seconds, "meter_share": result.meter_share}  # fmt: skip
        write_json(args.json, report)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """An actor on an environment split: success, average steps, per-task-type (BFCL: per-category) table; resumable."""
    from pathlib import Path

    from deltattg.envs.registry import DEFAULT_SPLIT
    from deltattg.rollout.collect import build_policy, parse_policy
    from deltattg.rollout.evaluate import PerEpisodePolicy, EvalSettings, results_markdown, run_evaluation, select_tasks
    from deltattg.rollout.policies import SamplingConfig
    from deltattg.rollout.prompts import PromptConfig

    _check_out(args.out, folder=True)
    splits = [s.strip() for s in (args.split or DEFAULT_SPLIT[args.env]).split(",")]
    if not all(splits) or len(set(splits)) != len(splits):
        raise UsageError(f"--split {args.split}: name each split once, several separated by commas")
    try:
        spec = parse_policy(args.actor, trials=True).resolved()  # DIR, DIR/ and ./DIR: one actor, one run
        make_env, probe, tasks = _environment(args, splits)
        tasks = select_tasks(tasks, args.episodes, args.seed)
    except (ValueError, ImportError, OSError) as exc:
        raise UsageError(str(exc)) from None
    model = spec.is_model
    settings = EvalSettings(env=args.env, short=args.short, split=",".join(splits), actor=spec.name, seed=args.seed,
                            max_turns=args.max_turns, temperature=args.temperature if model else None,
                            max_new_tokens=args.max_new_tokens if model else None)  # fmt: skip
    sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                              prefix_cache=args.prefix_cache)
    prompt = PromptConfig(layout=getattr(probe, "prompt_layout", "window"))

    def make_policy():
        if not model:
            return PerEpisodePolicy(lambda seed: build_policy(spec, seed, sampling, prompt), args.seed, spec.name)
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        try:  # loaded once, only when some task is left to play
            return build_policy(spec, args.seed, sampling, prompt)
        except (ValueError, ImportError, OSError) as exc:
            raise UsageError(f"--actor {args.actor}: {exc}") from None

    results = run_evaluation(make_env, tasks, make_policy, spec, settings, Path(args.out), progress=args.progress,
                             log=lambda message: print(message, file=sys.stderr))  # fmt: skip
    print(results_markdown(results), end="")
    print(f"wrote {results['played']} episodes to {Path(args.out) / 'episodes.jsonl'} ({results['episodes']} in all), "
          f"results.json and results.md", file=sys.stderr)
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
    _check_out(args.out, *args.input, folder=True)
    names = input_labels(args.input)  # distinct arm labels (the same file twice is refused before any reading)
    inputs = [(name, _read(path, args.skip_invalid)) for name, path in zip(names, args.input)]
    result = inspect_credit(arms_of(inputs, methods), config, env=args.env, tokenizer=_tokenizer(args.tokenizer))
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


def build_parser() -> argparse.ArgumentParser:
    from deltattg.credit import available_estimators
    from deltattg.meter.regression import RegressionConfig
    from deltattg.meter.train_regression import RegressionTrainConfig
    from deltattg.data.labels import TARGETS
    from deltattg.rollout.policies import SamplingConfig
    from deltattg.train.config import RunConfig

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
    _add_tokenizer(credit)
    _add_skip_invalid(credit)
    credit.set_defaults(func=cmd_credit)

    train_meter = sub.add_parser(
        "train-meter",
        help="train a progress meter (regression head, or generative SFT + GRPO)",
        description="Train a Token-to-Go progress meter on recorded trajectories (ours or AgentProcessBench records). "
        "Labels come from trajectory outcomes and token counts only (Eq. 1-2); step labels never enter training. "
        "regression: backbone + head predicting the completion logit and log1p(TTG), every decision state of a "
        "trajectory read in one pass; by default the backbone is frozen and its features cached, so only the head "
        "trains (fast on CPU). generative: the paper's meter, SFT on the JSON answer (Eq. 3) then GRPO refinement "
        "with our reconstructed reward (the README's Progress meter section; deltattg.meter.train_generative.progress_reward).",
    )
    train_meter.add_argument("data", help="trajectory JSONL (or AgentProcessBench records)")
    train_meter.add_argument("--out", required=True, help="folder to save the meter to (save_pretrained layout)")
    train_meter.add_argument("--kind", choices=["regression", "generative"], default="regression")
    train_meter.add_argument("--model", default="smollm2",
                             help="backbone / base model: HF id or path, 'smollm2' (offline CPU default) or DIR::FILE.gguf; "
                             "GPU recipe: Qwen/Qwen3-4B-Instruct-2507")
    train_meter.add_argument("--split", help="split file ({\"train\": [ids], ...}); train on one subset of it")
    train_meter.add_argument("--subset", default="train", help="subset of --split to train on (default: train)")
    train_meter.add_argument("--max-length", type=positive_int, default=RegressionConfig.max_length,
                             help="token budget of one meter input (regression window / generative prompt), default "
                             "%(default)s")
    train_meter.add_argument("--max-message-chars", type=positive_int, default=RegressionConfig.max_message_chars,
                             help="regression: cap each message at this many characters (middle elided), default "
                             "%(default)s")
    train_meter.add_argument("--pooling", choices=["last", "last+mean"], default=RegressionConfig.pooling,
                             help="regression: features of a decision state: the boundary token's hidden state, or also "
                             "the mean over its last block (default: last)")
    train_meter.add_argument("--target", choices=["ttg", "score"], default=RegressionConfig.target,
                             help="regression: what the value head predicts: ttg = log1p(Token-to-Go) of completable "
                             "states (the DeltaTTG meter), score = the trajectory's final reward at every state (an "
                             "outcome-score meter, read by --method value, E.4). Default: ttg")
    train_meter.add_argument("--ensemble", type=positive_int, default=RegressionConfig.ensemble,
                             help="regression: train N heads (seeds --seed .. --seed+N-1) on the same features; a "
                             "reading averages their completion probabilities and Token-to-Go (default: 1)")
    train_meter.add_argument("--layer", type=positive_int, default=RegressionConfig.layer,
                             help="regression: read the output of this decoder layer of the backbone (1..its layer "
                             "count) instead of its final state")
    train_meter.add_argument("--full", action="store_true", help="regression: train the backbone too (default: frozen)")
    train_meter.add_argument("--head-epochs", type=positive_int, default=RegressionTrainConfig.head_epochs,
                             help="regression, frozen backbone: head epochs, default %(default)s")
    train_meter.add_argument("--epochs", type=positive_int, default=RegressionTrainConfig.epochs,
                             help="epochs over the data when the backbone trains, default %(default)s")
    train_meter.add_argument("--batch-size", type=positive_int, default=RegressionTrainConfig.batch_size,
                             help="examples per optimizer step, default %(default)s")
    train_meter.add_argument("--lr", type=positive_float, help=f"learning rate (defaults: head {RegressionTrainConfig.lr_head_frozen:g} frozen; backbone "
                             f"{RegressionTrainConfig.lr_backbone:g}; "
                             "generative SFT 1e-5, GRPO 3e-6)")
    train_meter.add_argument("--stage", choices=["sft", "grpo", "sft+grpo"], default=GENERATIVE_STAGE,
                             help="generative: training stages (default sft+grpo)")
    train_meter.add_argument("--lora", action="store_true", help="generative: LoRA r=16 on q,v instead of full fine-tuning")
    train_meter.add_argument("--turn-limit", type=turn_limit, default="auto", metavar="N|auto|none",
                             help="mark every decision state with the turns left of an N-turn episode limit (the "
                             "meter can then see a time-out coming). auto (default): the records' env.max_turns when "
                             "they all carry the same one (deltattg collect writes it), else none")
    train_meter.add_argument("--calibration-fraction", type=number(float, low=0, high=0.5), default=0.0, metavar="F",
                             help="regression: hold out this fraction of the tasks (groups) from training and fit "
                             "the completion temperature on their states, p̃ = σ(logit / T), stored with the meter "
                             "(read by deltattg_robust's soft readout); default 0: T = 1")
    train_meter.add_argument("--seed", type=seed_int, default=RegressionTrainConfig.seed)
    _add_tokenizer(train_meter)
    _add_skip_invalid(train_meter)
    train_meter.set_defaults(func=cmd_train_meter)

    def add_meter_source(p: argparse.ArgumentParser) -> None:
        p.add_argument("--meter", required=True, help="a trained meter folder, a model spec (untrained generative "
                       "meter), an OpenAI-compatible endpoint URL (vLLM / SGLang: http://HOST:8000/v1; /v1 is added "
                       "when missing), 'oracle' (household rollouts only: the planner's exact reading of each "
                       "state, tokens counted with --tokenizer), or several folders joined by commas (a pessimistic "
                       "ensemble: p̃ = mean − spread of theirs)")
        p.add_argument("--meter-model", help="with an endpoint URL: the served model's name")
        p.add_argument("--meter-timeout", type=positive_float, default=60.0, metavar="SECONDS",
                       help="with an endpoint URL: the most one reading may take, retries and slow answers included; "
                       "a reading that runs out is null (default 60)")
        p.add_argument("--cache", help="SQLite file caching readings across runs (prefix-by-prefix meters)")
        p.add_argument("--oracle-noise", type=number(float, low=0, high=10), default=0.0, metavar="SIGMA",
                       help="--meter oracle: multiply each tokens_to_go by exp(SIGMA*z), z ~ N(0,1) (default 0)")
        p.add_argument("--oracle-flip", type=probability, default=0.0, metavar="P",
                       help="--meter oracle: flip each can_complete with probability P (default 0)")
        p.add_argument("--oracle-false-negative", type=probability, default=0.0, metavar="P",
                       help="--meter oracle: read can_complete false on a state of a successful trajectory with "
                       "probability P (a learned meter's false alarm; default 0)")
        p.add_argument("--oracle-missed-failure", type=probability, default=0.0, metavar="P",
                       help="--meter oracle: read can_complete true on a state of a failed trajectory that cannot be "
                       "completed in the turns left, with probability P (a time-out the meter misses; default 0)")
        p.add_argument("--oracle-seed", type=seed_int, default=0, help="--meter oracle: seed of the noise and flips")
        p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")

    score = sub.add_parser(
        "score",
        help="add the meter's readings to each trajectory (what `credit` consumes)",
        description="Read every decision state (the history before each action) of each trajectory with a frozen meter "
        "and add `meter`: one reading per action, {\"can_complete\": b, \"tokens_to_go\": v} (regression meters also "
        "give \"logit\"), null when invalid. Exits 3, writing nothing, when not one reading is valid.",
    )
    score.add_argument("input", help="trajectory JSONL")
    score.add_argument("--out", required=True, help="JSONL to write")
    score.add_argument("--skip-zero-advantage", action="store_true",
                       help="as Algorithm 1: do not read trajectories whose GRPO advantage is 0 (their entries are null)")
    add_meter_source(score)
    _add_tokenizer(score)
    _add_skip_invalid(score)
    score.set_defaults(func=cmd_score)

    eval_meter = sub.add_parser(
        "eval-meter",
        help="completion accuracy and TTG rank correlation of a meter on held-out trajectories",
        description="Read every nonterminal decision state of DATA's trajectories with --meter and compare with the "
        "labels (Eq. 1-2): completion accuracy (b against the trajectory's outcome) and Spearman's rho of predicted "
        "against true Token-to-Go on the successful trajectories' states. With --reference (a meter folder, e.g. one "
        "trained in DATA's own domain): how often the two meters' b agree and the Spearman of their TTG, state by "
        "state (cross-domain transfer, paper 5.3). Input without a decision state is refused (exit 2); exits 3 when "
        "not one reading is valid.",
    )
    eval_meter.add_argument("data", help="trajectory JSONL with outcomes (collect's output)")
    eval_meter.add_argument("--reference", help="a second meter read on the same states")
    eval_meter.add_argument("--json", help="also write the numbers as JSON here")
    add_meter_source(eval_meter)
    _add_tokenizer(eval_meter)
    _add_skip_invalid(eval_meter)
    eval_meter.set_defaults(func=cmd_eval_meter)

    eval_steps = sub.add_parser(
        "eval-steps",
        help="step-quality accuracy of a meter against step labels (§5.1)",
        description="Predicted progress of each labelled step, Δ = c(h_t) - c(h_t+1) with c = v if b else C (terminal "
        "prefix included), against AgentProcessBench step labels; neutral steps excluded; ties and invalid readings "
        "count as wrong. Prints accuracy and balanced accuracy per dataset and pooled, beside always-beneficial and "
        "random baselines.",
    )
    eval_steps.add_argument("--data", required=True, help="records with step_labels (AgentProcessBench JSONL)")
    eval_steps.add_argument("--split", help="split file")
    eval_steps.add_argument("--subset", default="test", help="subset of --split to evaluate (default: test)")
    eval_steps.add_argument("--failure-cost", type=failure_cost, default=6144.0,
                            help="C for states predicted unsuccessful (default 6144, the paper's search-QA value)")
    eval_steps.add_argument("--readout", choices=["binary", "expected"], nargs="+", default=["binary"],
                            help="cost of a state (one row each): binary = Eq. 7 (v if b else C, what the credit uses); "
                            "expected = p*v + (1-p)*C with p = sigmoid(completion logit), the analogue of E.6's scalar "
                            "regression (needs a meter that gives logits, e.g. the regression meter). Default: binary")
    eval_steps.add_argument("--json", help="also write the results as JSON here")
    add_meter_source(eval_steps)
    _add_skip_invalid(eval_steps)
    eval_steps.set_defaults(func=cmd_eval_steps)

    collect_p = sub.add_parser(
        "collect",
        help="trajectories of a pool of diverse policies in an environment",
        description="Roll out each --policy for --episodes episodes on the same tasks and pool the trajectories (the "
        "meter's training data, §3.1 / D.1). Policies: expert (planner / walkthrough / ground truth), expert:EPS "
        "(with probability EPS a random admissible action, or on bfcl / tau2 a wrong argument, tool or early stop), "
        "random, lm:MODEL (HF id, path or smollm2), vllm:MODEL "
        "(extra [vllm], GPU), react:MODEL (ReAct: \"Thought: ... Action: ...\", only the action is executed). Every "
        "record carries its policy's name.",
    )
    _add_environment(collect_p)
    collect_p.add_argument("--policy", action="append", required=True, help="a policy spec; repeat to pool several")
    collect_p.add_argument("--episodes", type=number(int, low=1, high=10**6), required=True, help="episodes per policy")
    collect_p.add_argument("--out", required=True, help="trajectory JSONL to write")
    collect_p.add_argument("--group-size", type=number(int, low=1, high=10**4), default=1, help="episodes per task (a GRPO group)")
    _add_rollout(collect_p, max_new_tokens=256)
    collect_p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    _add_tokenizer(collect_p)
    collect_p.set_defaults(func=cmd_collect)

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
    _add_tokenizer(inspect)
    _add_skip_invalid(inspect)
    inspect.set_defaults(func=cmd_inspect)

    guide = sub.add_parser(
        "guide",
        help="test-time action selection (E.5): natural vs random-of-K vs meter-of-K, Table 9 layout",
        description="Roll out --actor on --episodes tasks three ways from the same seed: alone (natural rollout), "
        "picking uniformly among K proposals (random selection) and picking the proposal whose next state the meter "
        "reads as cheapest, c = v if b else C (progress meter; each proposal tried in a branch of the environment). "
        "Prints success % and average steps per arm (the paper's Table 9) and the meter's share of the time. Actors: "
        "expert:EPS (the planner with probability 1 - EPS, else a random admissible action or, on bfcl / tau2, a "
        "mistaken call), random, lm:MODEL, "
        "react:MODEL.",
    )
    _add_environment(guide)
    guide.add_argument("--actor", required=True,
                       help="policy spec: expert:EPS, random, lm:MODEL (HF id, path or smollm2), react:MODEL")
    guide.add_argument("--candidates", type=number(int, low=1, high=64), default=4, metavar="K",
                       help="proposals per step in the guided arms (default 4)")
    guide.add_argument("--episodes", type=number(int, low=1, high=10**5), required=True, metavar="N",
                       help="distinct tasks (one episode each per arm), drawn from --split with --seed; at most "
                       "the split's task count")
    _add_rollout(guide, max_new_tokens=64)
    guide.add_argument("--json", help="also write the numbers as JSON here")
    add_meter_source(guide)
    _add_tokenizer(guide)
    guide.set_defaults(func=cmd_guide)

    evaluate = sub.add_parser(
        "evaluate",
        help="an actor on an environment split: success, average steps, per-task-type table (Table 7); resumable",
        description="Play one episode of --actor on each task of --split (the first --episodes of the split shuffled "
        "with --seed; default: the whole split) and write OUT/episodes.jsonl (one trajectory record per finished "
        "episode, as `collect` writes them, appended as each episode ends), OUT/results.json and OUT/results.md: "
        "success %, average steps (all episodes and successful ones) and the same per task type (household, "
        "alfworld; the paper's Table 7 layout), per category (bfcl: base, miss_func, miss_param, long_context; "
        "--split base,miss_func,... evaluates several) or per domain (tau2). Rerunning the same command on the same --out plays only "
        "the tasks without a record (a killed run resumes); records of other settings are refused. Actors: expert "
        "or expert:EPS (the planner / walkthrough / ground truth; with probability EPS a random admissible action "
        "or, on bfcl / tau2, a mistaken call), "
        "random, lm:MODEL (HF id, path, smollm2 or a checkpoint folder saved by `deltattg train`, e.g. "
        "RUN/checkpoints/step-N/actor), vllm:MODEL (extra [vllm], GPU), react:MODEL (ReAct: a thought, then the "
        "action executed), reflexion:MODEL (ReAct with up to 3 trials per task, a self-reflection after each failure).",
    )
    _add_environment(evaluate, several_splits=True)
    evaluate.add_argument("--actor", required=True,
                          help="policy spec: expert, expert:EPS, random, lm:MODEL, vllm:MODEL, react:MODEL, "
                          "reflexion:MODEL")
    evaluate.add_argument("--episodes", type=number(int, low=1, high=10**6), metavar="N",
                          help="evaluate the first N tasks of the split shuffled with --seed (default: every task)")
    _add_rollout(evaluate, max_new_tokens=SamplingConfig.max_new_tokens,
                 seed_help="task order and the actor's randomness, default %(default)s")
    evaluate.add_argument("--threads", type=number(int, low=0, high=1024), default=RunConfig.threads,
                          help="lm actors: torch CPU threads (0: torch's default); on a shared CPU 1 avoids OpenMP "
                          "oversubscription (up to 30x slower otherwise)")
    evaluate.add_argument("--out", required=True, help="folder for episodes.jsonl, results.json and results.md "
                          "(a folder holding this run's episodes.jsonl is resumed)")
    evaluate.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    evaluate.set_defaults(func=cmd_evaluate)

    from deltattg.demo.cli import add_demo_parser
    from deltattg.train.cli import add_train_parser

    add_train_parser(sub)
    add_demo_parser(sub)

    verl_tasks = sub.add_parser(
        "verl-tasks",
        help="verl training data for the deltattg_env agent loop: one parquet row per environment task",
        description="Write --split's tasks as the parquet file verl's data.train_files / data.val_files read with "
        "the deltattg_env agent loop (agent_name column; the task in extra_info.deltattg_task). See docs/verl.md.",
    )
    _add_environment(verl_tasks)
    verl_tasks.add_argument("--limit", type=positive_int, metavar="N", help="only the first N tasks of the split")
    verl_tasks.add_argument("--out", required=True, help="parquet file to write")
    verl_tasks.set_defaults(func=cmd_verl_tasks)

    methods = sub.add_parser("methods", help="list the credit estimators, what each reads and its options")
    methods.set_defaults(func=cmd_methods)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_parsed(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
