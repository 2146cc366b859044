"""What the ``deltattg`` subcommands share: the output check every command runs before any work, reading a
trajectory file, a tokenizer by spec, and the environment and rollout options."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from deltattg.command import UsageError, number, positive_float, probability, seed_int
from deltattg.errors import InputError
from deltattg.settings import setting_default, setting_help


def check_out(out: str | None, *inputs: str | None, folder: bool = False, flag: str = "--out") -> None:
    """Refuse, before any work, an output (the option ``flag``) that names one of the command's inputs or lies inside
    one (a meter folder: ``--json METER/meter_config.json``), compared as resolved paths (so ``./x``, ``x`` and links
    are the same file); an input may be a model or meter spec (``DIR::FILE.gguf``, several folders joined by commas,
    an URL: only what exists here is compared). Also refused: a folder where a file is written, a file where a folder
    is, or a place that cannot be written (a read-only file system, a missing permission)."""
    import os
    from pathlib import Path

    if out is None:
        return
    target = Path(out).expanduser()
    for source in inputs:
        for path in local_inputs(source):
            same = path.resolve() == target.resolve() or (target.exists() and os.path.samefile(path, target))
            inside = path.is_dir() and path.resolve() in target.resolve().parents
            if same or inside:
                where = "is also an input" if same else "lies inside an input"
                raise UsageError(f"{flag} {out} {where} ({source}): refusing to overwrite it")
    from deltattg.data.jsonl import check_output_file, check_writable

    if folder:
        if target.exists() and not target.is_dir():
            raise InputError("exists and is not a folder (this command writes a folder)", path=out)
    else:
        check_output_file(target)
    check_writable(target, folder=folder)  # an unwritable place is refused here, not after the work


def local_inputs(spec: str | None) -> list:
    """The local files and folders an input option names: the path itself, the folder of ``DIR::FILE.gguf``, or the
    folders of a comma-joined ensemble; what does not exist here (an URL, a Hub id, ``oracle``) is left out."""
    from pathlib import Path

    if spec is None:
        return []
    names = [spec] if Path(spec).expanduser().exists() else spec.split(",")
    paths = [Path(name.partition("::")[0]).expanduser() for name in names if name]
    return [path for path in paths if path.exists()]


def add_setting(parser: argparse.ArgumentParser, flag: str, config: type, name: str, **kwargs: Any) -> None:
    """``flag`` for the field ``name`` of the dataclass ``config``: its default and its help come from the field
    (:func:`deltattg.settings.setting`); ``kwargs`` as ``add_argument`` takes them (``type``, ``choices``, ...)."""
    shown = "" if setting_default(config, name) is None else ", default %(default)s"
    parser.add_argument(flag, default=setting_default(config, name), help=setting_help(config, name) + shown,
                        **kwargs)


def add_tokenizer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokenizer",
        metavar="NAME_OR_PATH",
        help="HF tokenizer (id, path, 'smollm2' or DIR::FILE.gguf) to count each action's tokens when records lack "
        "step_tokens",
    )


SPLITS = ("(household, alfworld: train, valid_seen, valid_unseen; alfworld also valid_train; search: the question "
          "files' stems; awm: train, test, all or a scenario; bfcl: base, miss_func, "
          "miss_param, long_context; tau2: retail, airline, telecom, DOMAIN/test, ...); default train (awm: all; bfcl: "
          "base; tau2: retail)")


def add_environment(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, several_splits: bool = False,
                    required: bool = True, split: bool = True, data_dest: str = "data") -> None:
    """--env, --split (unless ``split`` is off: the tasks come from elsewhere), --short, the household environment's
    --env-options / --env-option, --data (into ``data_dest``, where the command has a positional DATA of its own) and
    the search environment's --corpus / --retriever / --topk: which environment and which of its tasks."""
    from deltattg.envs.registry import ENVIRONMENTS

    parser.add_argument("--env", required=required, choices=ENVIRONMENTS,
                        help=None if required else "the environment the records were played in (default: rebuilt "
                        "from each record's env description)")
    if split:
        parser.add_argument("--split", help=("task split, or several separated by commas " if several_splits
                                             else "task split ") + SPLITS)
    parser.add_argument("--short", action="store_true", help="household: short tasks for CPU demos")
    parser.add_argument("--env-options", choices=("regime",), help="household: every knob as the household RL regime "
                        "sets it (deltattg demo, bench/bench_train.py: its options over the short tasks), so that "
                        "the tasks are the regime's; --env-option entries override single knobs")
    parser.add_argument("--env-option", action="append", metavar="KEY=VALUE", help="household: one HouseholdConfig "
                        "knob, VALUE in YAML (receptacles=[3,4], start_closed=false, object_types=[apple,mug,book]), "
                        "over --env-options, --short or the full size; repeat for several, the last of a key wins")
    parser.add_argument("--data", dest=data_dest, help="alfworld: the json_2.1.1 folder (default: $ALFWORLD_DATA); search: a question "
                        "file (JSONL or Parquet) or a folder of them, one split per file; awm: an AWM release folder "
                        "(its gen_*.jsonl files; default: our example scenarios, as `deltattg awm-examples` writes "
                        "them)")
    search = parser.add_argument_group("search environment (one of --corpus and --retriever)") if isinstance(
        parser, argparse.ArgumentParser) else parser
    search.add_argument("--corpus", help="a passage corpus JSONL ({id, contents}), searched here with BM25")
    search.add_argument("--retriever", metavar="URL", help="a Search-R1 retrieval server (POST URL/retrieve), e.g. "
                        "`deltattg serve-retriever`")
    search.add_argument("--topk", type=number(int, low=1, high=100), help="passages per query (default 3)")


def environment_options(args: argparse.Namespace) -> dict[str, Any]:
    """The environment options the command line gives (the search environment's, the household environment's knobs;
    each refused for the other environments)."""
    given = {k: v for k, v in {"corpus": args.corpus, "retriever": args.retriever, "topk": args.topk}.items()
             if v is not None}
    if given and args.env != "search":
        raise UsageError(f"--{', --'.join(given)}: only for --env search")
    return given | household_options(args)


def household_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``HouseholdConfig`` knobs of --env-options (every knob of the regime's config: complete, so that --short
    changes nothing under it) and the --env-option entries over them in order; refused for other environments."""
    entries = args.env_option or []
    if args.env_options is None and not entries:
        return {}
    if args.env != "household":
        given = [flag for flag, value in (("--env-option", entries), ("--env-options", args.env_options)) if value]
        raise UsageError(f"{' and '.join(given)}: HouseholdConfig options, only for --env household (not --env "
                         f"{args.env})")
    options = regime_household_options() if args.env_options == "regime" else {}
    options.update(household_option(entry) for entry in entries)
    return options


def regime_household_options() -> dict[str, Any]:
    """Every ``HouseholdConfig`` knob of the household RL regime's environment (``HOUSEHOLD_OPTIONS`` over the short
    tasks, built as the regime builds it), as its records describe it."""
    from deltattg.envs.registry import env_factory
    from deltattg.regime.config import HOUSEHOLD_OPTIONS

    return env_factory("household", size="short", **HOUSEHOLD_OPTIONS)().describe()["options"]


def household_option(entry: str) -> tuple[str, Any]:
    """One ``--env-option KEY=VALUE`` as ``(KEY, VALUE read as YAML)``: a usage error naming the entry for a KEY that
    is no ``HouseholdConfig`` field (with the fields), a VALUE that is not YAML, or a single value for a list knob
    (a name would be read as a list of its letters). The values themselves are checked by the config."""
    import dataclasses

    import yaml

    from deltattg.envs.household import HouseholdConfig

    key, equals, text = entry.partition("=")
    key = key.strip()
    if not equals:
        raise UsageError(f"--env-option {entry}: write KEY=VALUE (receptacles=[3,4])")
    defaults = {f.name: f.default for f in dataclasses.fields(HouseholdConfig)}
    if key not in defaults:
        raise UsageError(f"--env-option {entry}: {key!r} is not a household option; choose from {', '.join(defaults)}")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or exc
        raise UsageError(f"--env-option {entry}: {key}: not a YAML value ({problem})") from None
    default = defaults[key]
    if isinstance(default, tuple) and not isinstance(value, list):
        raise UsageError(f"--env-option {entry}: {key} takes a list, e.g. {key}=[{', '.join(map(str, default[:2]))}]")
    return key, value


def command_line_environment(args: argparse.Namespace, data: str | None):
    """The constructor of the environment ``--env`` and its options name (``data``: the --data of the command); a
    value the household config rejects is a usage error naming its knob."""
    from deltattg.envs.registry import env_factory

    options = environment_options(args)
    try:
        return env_factory(args.env, data=data, size="short" if args.short else "full", **options)
    except InputError as exc:
        if args.env == "household" and options:
            raise UsageError(f"--env-option {exc}") from None
        raise


def add_rollout(parser: argparse.ArgumentParser, max_new_tokens: int, seed_help: str | None = None) -> None:
    """--max-turns, --temperature, --max-new-tokens and --seed: how the episodes are played."""
    from deltattg.rollout.policies import SamplingConfig

    parser.add_argument("--max-turns", type=number(int, low=1, high=10**5),
                        help="stop an episode after this many actions (default: the env's)")
    add_setting(parser, "--temperature", SamplingConfig, "temperature", type=number(float, low=0, high=100))
    parser.add_argument("--max-new-tokens", type=number(int, low=1, high=10**6), default=max_new_tokens,
                        help="lm actors: tokens per action, default %(default)s")
    parser.add_argument("--seed", type=seed_int, default=0, help=seed_help)
    add_setting(parser, "--prefix-cache", SamplingConfig, "prefix_cache", type=number(int, low=0, high=10**4),
                metavar="N")


def environment(args: argparse.Namespace, splits: Sequence[str]) -> tuple:
    """``(make_env, an instance, the tasks of splits)`` of the environment ``args`` name; ``ValueError`` when the
    splits hold no task (alfworld: no data at --data or $ALFWORLD_DATA)."""
    make_env = command_line_environment(args, args.data)
    probe = make_env()
    tasks = [task for split in splits for task in probe.tasks(split)]
    if not tasks:
        raise ValueError(f"--split {','.join(splits)}: the {args.env} environment has no tasks in it")
    return make_env, probe, tasks


def check_expert(kinds: Sequence[str], probe: Any, tasks: Sequence) -> None:
    """Refuse (``ValueError``), before any episode, an expert policy (one of ``kinds`` is ``expert``) on tasks the
    environment has no expert for, where it can tell (``probe.check_expert(tasks)``; AWM: tasks without gold calls)."""
    if "expert" in kinds and hasattr(probe, "check_expert"):
        probe.check_expert(tasks)


def add_skip_invalid(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip records that fail validation (their number is reported) instead of stopping at the first one",
    )


def read_records(path: str, skip_invalid: bool):
    from deltattg.data.sources import read_trajectory_file

    read = read_trajectory_file(path, skip_invalid=skip_invalid)
    if read.skipped:
        what = [f"{read.invalid} invalid record(s)"] if read.invalid else []
        what += [f"{read.duplicates} record(s) repeating an earlier id"] if read.duplicates else []
        print(f"deltattg: skipped {' and '.join(what)} of {path}", file=sys.stderr)
    return read.items


def tokenizer_of(spec: str | None):
    if spec is None:
        return None
    from deltattg.hf import load_tokenizer

    return load_tokenizer(spec)


def add_meter_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("--meter", required=True, help="a trained meter folder, a model spec (untrained generative "
                   "meter), an OpenAI-compatible endpoint URL (vLLM / SGLang: http://HOST:8000/v1; /v1 is added "
                   "when missing), 'oracle' (household rollouts only: the planner's exact reading of each "
                   "state, tokens counted with --tokenizer), 'belief' (household: the planner's reading averaged over the "
                   "worlds the history allows; docs/concepts/meter.md), or several folders joined by commas (a pessimistic "
                   "ensemble: p̃ = mean − spread of theirs)")
    p.add_argument("--meter-model", help="with an endpoint URL: the served model's name")
    p.add_argument("--meter-timeout", type=positive_float, default=60.0, metavar="SECONDS",
                   help="with an endpoint URL: the most one reading may take, retries and slow answers included; "
                   "a reading that runs out is null (default 60)")
    p.add_argument("--cache", help="SQLite file caching readings across runs (generative and endpoint meters)")
    p.add_argument("--per-prefix", action="store_true",
                   help="an in-process generative meter reads each decision prefix as its own prompt (for "
                   "comparison; default: all states of a trajectory on one shared key/value cache, same answers)")
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


def meter_of(args: argparse.Namespace):
    from deltattg.meter.loading import PLANNER_METERS, load_meter
    from deltattg.meter.oracle import ORACLE, OracleConfig

    dials = (args.oracle_noise, args.oracle_flip, args.oracle_false_negative, args.oracle_missed_failure)
    if args.meter != ORACLE and any(dials):
        raise UsageError("--oracle-noise, --oracle-flip, --oracle-false-negative and --oracle-missed-failure dial the "
                         "oracle meter: use them with --meter oracle")
    try:
        oracle = OracleConfig(noise=args.oracle_noise, flip=args.oracle_flip, seed=args.oracle_seed,
                              false_negative=args.oracle_false_negative, missed_failure=args.oracle_missed_failure)
        if args.meter in PLANNER_METERS and getattr(args, "tokenizer", None) is None:
            raise ValueError(f"--meter {args.meter} counts Token-to-Go with --tokenizer NAME_OR_PATH (the one `labels` "
                             "uses)")
        return load_meter(args.meter, endpoint_model=args.meter_model, cache=args.cache, per_prefix=args.per_prefix,
                          endpoint_timeout_s=getattr(args, "meter_timeout", 60.0),
                          tokenizer=getattr(args, "tokenizer", None), oracle=oracle)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


LABEL_DEFAULTS: dict[str, Any] = {"completions": 4, "label_seed": 0, "td_lambda": 0.0, "completer_temperature": 1.0,
                                  "completer_max_new_tokens": 64}
"""The label options' defaults (their flags default to None so that an option a source does not read is refused)."""

REPLAY_OPTIONS = ("completions", "label_seed", "completer_temperature", "completer_max_new_tokens", "env", "short",
                  "env_options", "env_option", "env_data", "corpus", "retriever", "topk",
                  "max_turns")  # read by --labels rollout and best-of-k only


def check_records_turn_limit(meter: Any, items: Sequence, option: str = "--meter") -> None:
    """Refuse (``InputError`` naming the first record's file and line) records played under another turn limit
    (``env.max_turns``) than the one a meter was trained with the turns left in its input: every reading of theirs
    would state the wrong turns left. Records that carry no limit are read as they are."""
    limit = getattr(meter, "turn_limit", None)
    if limit is None:
        return
    for item in items:
        env = item.trajectory.extra.get("env")
        theirs = env.get("max_turns") if isinstance(env, dict) else None
        if isinstance(theirs, int) and not isinstance(theirs, bool) and theirs != limit:
            raise InputError(f"the record was played with a {theirs}-turn limit, but {option} was trained on episodes "
                             f"of {limit} turns (its input states the turns left): read it with a meter trained for "
                             f"{theirs} turns", path=item.path, line=item.line, field="env.max_turns")


def add_label_source(parser: argparse.ArgumentParser) -> None:
    """--labels and what its sources read: the completer and its environment (``collect``'s options), the
    completions per state, the bootstrap meter of ``td``."""
    from deltattg.data.labels import LABEL_SOURCES

    group = parser.add_argument_group("label source (docs/concepts/labels.md)")
    group.add_argument("--labels", choices=LABEL_SOURCES, default="outcome",
                       help="what each decision state is taught: outcome = its own trajectory's outcome and "
                       "remaining tokens (Eq. 1-2, the paper's); rollout = --completions K completions by --completer "
                       "from the replayed state (b = their success rate, a soft target; v = mean remaining tokens of "
                       "the successful ones); best-of-k = the same and the record's own continuation (b = any "
                       "succeeded, v = the fewest remaining tokens among them); td = bootstrapped from "
                       "--bootstrap-meter's readings of the next state, no replays. Default: outcome. An option "
                       "below that the chosen source does not read is refused")
    group.add_argument("--completer", metavar="POLICY", help="rollout, best-of-k: the policy that completes each "
                       "state, as collect takes it (random, expert:EPS, lm:MODEL, lm:ACTOR_FOLDER)")
    group.add_argument("--completions", type=number(int, low=1, high=1024), metavar="K",
                       help=f"rollout, best-of-k: completions per decision state (default {LABEL_DEFAULTS['completions']})")
    group.add_argument("--until-success", action="store_true",
                       help="best-of-k: play the completions in rounds (1, 1, 2, 4, ... up to K) and none more for a "
                       "state once it is proven completable (by its own completion or a later state's): its label "
                       "is settled; tokens_to_go is then the fewest among the completions played (about half the "
                       "cost at K = 4)")
    group.add_argument("--bootstrap-meter", metavar="METER", help="td: the meter whose readings of s_t+1 make the "
                       "target of s_t (e.g. one trained with --labels outcome)")
    group.add_argument("--td-lambda", type=probability, metavar="LAMBDA",
                       help="td: λ of the TD(λ) target (0: one-step bootstrap, 1: the outcome labels; default 0)")
    group.add_argument("--label-seed", type=seed_int, help="rollout, best-of-k: seed of the completions (default 0)")
    add_environment(group, required=False, split=False, data_dest="env_data")
    group.add_argument("--max-turns", type=number(int, low=1, high=10**5),
                       help="rollout, best-of-k: the turn limit of records that do not carry theirs (env.max_turns)")
    group.add_argument("--completer-temperature", type=number(float, low=0, high=100),
                       help="lm completers: sampling temperature (default "
                       f"{LABEL_DEFAULTS['completer_temperature']:g})")
    group.add_argument("--completer-max-new-tokens", type=number(int, low=1, high=10**6),
                       help=f"lm completers: tokens per action (default {LABEL_DEFAULTS['completer_max_new_tokens']})")


def label_settings(args: argparse.Namespace):
    """The ``LabelSettings`` of :func:`add_label_source`'s options, with everything that shapes a label recorded (the
    environment, turn limit, tokenizer, completer sampling, the bootstrap meter's digest); a usage error when they do
    not fit together, or when an option is given that the source does not read."""
    from deltattg.meter.loading import meter_digest
    from deltattg.rollout.collect import parse_policy
    from deltattg.rollout.label_sources import LabelSettings

    unread = unread_label_options(args)
    if unread:
        raise UsageError(f"{', '.join(unread)}: not read by --labels {args.labels}")
    value = {name: LABEL_DEFAULTS[name] if getattr(args, name) is None else getattr(args, name)
             for name in LABEL_DEFAULTS}  # fmt: skip
    try:
        completer = parse_policy(args.completer).resolved() if args.completer else None
        if completer is not None and not completer.is_model:
            given = [flag for flag in ("--completer-temperature", "--completer-max-new-tokens")
                     if getattr(args, flag[2:].replace("-", "_")) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: read by lm completers only, not --completer {args.completer}")
        replayed = args.labels in ("rollout", "best-of-k")
        lm = completer is not None and completer.is_model
        return LabelSettings(
            source=args.labels, completer=completer.text if completer else None, completions=value["completions"],
            seed=value["label_seed"], bootstrap_meter=local_path(args.bootstrap_meter),
            td_lambda=value["td_lambda"], until_success=args.until_success,
            environment=labelling_environment_settings(args) if replayed else None,
            max_turns=args.max_turns if replayed else None,
            tokenizer=local_path(args.tokenizer) if replayed else None,
            completer_temperature=value["completer_temperature"] if lm else None,
            completer_max_new_tokens=value["completer_max_new_tokens"] if lm else None,
            bootstrap_meter_sha256=meter_digest(args.bootstrap_meter) if args.bootstrap_meter else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def unread_label_options(args: argparse.Namespace) -> list[str]:
    """The label options given (away from None, or set) that ``--labels`` does not read, as flags."""
    read = {"rollout": REPLAY_OPTIONS, "best-of-k": REPLAY_OPTIONS, "td": ("td_lambda",), "outcome": ()}[args.labels]
    names = [*REPLAY_OPTIONS, "td_lambda"]
    return [f"--{'data' if name == 'env_data' else name.replace('_', '-')}" for name in names
            if name not in read and getattr(args, name, None) is not None and getattr(args, name) is not False]


def local_path(spec: str | None) -> str | None:
    """A spec as given, or the absolute path of the file or folder it names where one exists (so that ``./x``,
    ``x`` and its absolute path are one setting)."""
    from pathlib import Path

    if spec is None or not Path(spec).expanduser().exists():
        return spec
    return str(Path(spec).expanduser().resolve())


def labelling_environment_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """The environment options the command line gives the completer (``--env`` and its options, paths absolute), or
    None where each record's own description is rebuilt."""
    if args.env is None:
        return None
    given = {"env": args.env, "short": args.short, "options": household_options(args) or None,
             "data": local_path(args.env_data), "corpus": local_path(args.corpus), "retriever": args.retriever,
             "topk": args.topk}
    return {key: value for key, value in given.items() if value is not None and value is not False}


def compute_labels(args: argparse.Namespace, items: Sequence, tokenizer: Any, path: str, *, cache: bool = False):
    """The labels of ``items`` from :func:`add_label_source`'s source, kept in the label file ``path`` (resumed where
    an earlier run left it; a ``cache`` may hold other trajectories' labels too); returns ``(labels by trajectory
    id, LabelReport)``."""
    from deltattg.data.tokens import ActionTokens, located_step_tokens
    from deltattg.rollout.collect import parse_policy
    from deltattg.rollout.label_sources import make_labels

    settings = label_settings(args)
    tokens = [located_step_tokens(item, tokenizer) for item in items]
    completer = count_action = bootstrap = make_env = None
    if settings.completer:
        if tokenizer is None:
            raise UsageError(f"--labels {settings.source} counts the completions' tokens: give --tokenizer "
                             "NAME_OR_PATH (the one the records' step_tokens were counted with)")
        count_action = ActionTokens(tokenizer)
        make_env = labelling_environment(args)
        if parse_policy(settings.completer).kind == "expert":
            check_expert_on_records(items, make_env)
        completer = _completer(settings, make_env)
    if settings.bootstrap_meter:
        bootstrap = _bootstrap(settings.bootstrap_meter, args.tokenizer, items)
    return make_labels(items, tokens, settings, path, completer=completer, count_action=count_action,
                       bootstrap=bootstrap, make_env=make_env, max_turns=args.max_turns, cache=cache,
                       progress=getattr(args, "progress", True))


def check_expert_on_records(items: Sequence, make_env: Any) -> None:
    """Refuse an expert completer, before any completion, on records whose environment has no expert for their tasks
    (an AWM release without gold calls): the environment ``--env`` names, else each record's own description."""
    from deltattg.envs.registry import rebuild
    from deltattg.envs.replay import recorded_task

    by_environment: dict[str, tuple[Any, list]] = {}
    for item in items:
        description = item.trajectory.extra.get("env")
        key = "--env" if make_env is not None else json.dumps(description, sort_keys=True, default=str)
        try:
            task = recorded_task(item.trajectory)
            if key not in by_environment:
                by_environment[key] = (make_env or rebuild(description), [])
        except (ValueError, TypeError, ImportError, OSError):
            continue  # the completion stage names what is wrong with such a record
        by_environment[key][1].append(task)
    for factory, tasks in by_environment.values():
        try:
            check_expert(["expert"], factory(), tasks)
        except ValueError as exc:
            raise UsageError(f"--completer expert: {exc}") from None


def labelling_environment(args: argparse.Namespace):
    """The constructor of the environment the command line names (``--env`` and its options), or ``None``: each
    record's own ``env`` description is rebuilt. Refused up front when it cannot be built here."""
    if args.env is None:
        if any(getattr(args, name, None) for name in ("short", "env_options", "env_option", "env_data", "corpus",
                                                      "retriever", "topk")):
            raise UsageError("--short, --env-option and --env-options, --data, --corpus, --retriever and --topk "
                             "describe the environment of --env")
        return None
    try:
        return command_line_environment(args, args.env_data)
    except (ValueError, ImportError, OSError) as exc:
        raise UsageError(str(exc)) from None


def _completer(settings: Any, make_env: Any):
    """A zero-argument builder of the completion policy (a model is loaded only when something is left to label)."""
    from deltattg.rollout.collect import build_policy, parse_policy
    from deltattg.rollout.policies import SamplingConfig
    from deltattg.rollout.prompts import PromptConfig

    spec = parse_policy(settings.completer)
    sampling = SamplingConfig() if settings.completer_temperature is None else SamplingConfig(  # an lm completer's
        temperature=settings.completer_temperature, max_new_tokens=settings.completer_max_new_tokens)

    def build():
        layout = getattr(make_env(), "prompt_layout", "window") if make_env is not None else "window"
        try:
            return build_policy(spec, settings.seed, sampling, PromptConfig(layout=layout))
        except (ValueError, ImportError, OSError) as exc:
            raise UsageError(f"--completer {settings.completer}: {exc}") from None

    return build


def _bootstrap(meter_path: str, tokenizer: str | None, items: Sequence):
    """td's reader of the meter at ``meter_path`` (``rollout.label_sources.meter_bootstrap``), refused where it was
    trained for another turn limit than ``items`` were played under."""
    from deltattg.meter.loading import load_meter, meter_bootstrap

    try:
        meter = load_meter(meter_path, tokenizer=tokenizer)
    except ValueError as exc:
        raise UsageError(f"--bootstrap-meter {meter_path}: {exc}") from None
    check_records_turn_limit(meter, items, "--bootstrap-meter")
    return meter_bootstrap(meter)
