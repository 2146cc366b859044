"""What the ``deltattg`` subcommands share: the output check every command runs before any work, reading a
trajectory file, a tokenizer by spec, and the environment and rollout options."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from deltattg.command import UsageError, number, positive_float, probability, seed_int
from deltattg.errors import InputError
from deltattg.settings import setting_default, setting_help


def check_out(out: str | None, *inputs: str | None, folder: bool = False) -> None:
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


def add_environment(parser: argparse.ArgumentParser, *, several_splits: bool = False) -> None:
    """--env, --split, --short, --data and the search environment's --corpus / --retriever / --topk: which
    environment and which of its tasks."""
    from deltattg.envs.registry import ENVIRONMENTS

    parser.add_argument("--env", required=True, choices=ENVIRONMENTS)
    parser.add_argument("--split", help=("task split, or several separated by commas " if several_splits
                                         else "task split ") + SPLITS)
    parser.add_argument("--short", action="store_true", help="household: short tasks for CPU demos")
    parser.add_argument("--data", help="alfworld: the json_2.1.1 folder (default: $ALFWORLD_DATA); search: a question "
                        "file (JSONL or Parquet) or a folder of them, one split per file; awm: an AWM release folder "
                        "(its gen_*.jsonl files; default: our example scenarios, as `deltattg awm-examples` writes "
                        "them)")
    search = parser.add_argument_group("search environment (one of --corpus and --retriever)")
    search.add_argument("--corpus", help="a passage corpus JSONL ({id, contents}), searched here with BM25")
    search.add_argument("--retriever", metavar="URL", help="a Search-R1 retrieval server (POST URL/retrieve), e.g. "
                        "`deltattg serve-retriever`")
    search.add_argument("--topk", type=number(int, low=1, high=100), help="passages per query (default 3)")


def environment_options(args: argparse.Namespace) -> dict[str, Any]:
    """The environment options the command line gives (the search environment's; refused for the others)."""
    given = {k: v for k, v in {"corpus": args.corpus, "retriever": args.retriever, "topk": args.topk}.items()
             if v is not None}
    if given and args.env != "search":
        raise UsageError(f"--{', --'.join(given)}: only for --env search")
    return given


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
    from deltattg.envs.registry import env_factory

    make_env = env_factory(args.env, data=args.data, size="short" if args.short else "full",
                           **environment_options(args))
    probe = make_env()
    tasks = [task for split in splits for task in probe.tasks(split)]
    if not tasks:
        raise ValueError(f"--split {','.join(splits)}: the {args.env} environment has no tasks in it")
    return make_env, probe, tasks


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
                   "state, tokens counted with --tokenizer), or several folders joined by commas (a pessimistic "
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
        return load_meter(args.meter, endpoint_model=args.meter_model, cache=args.cache, per_prefix=args.per_prefix,
                          endpoint_timeout_s=getattr(args, "meter_timeout", 60.0),
                          tokenizer=getattr(args, "tokenizer", None), oracle=oracle)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
