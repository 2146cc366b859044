"""Commands that play episodes: ``collect`` (a pool of policies), ``guide`` (test-time action selection, Table 9),
``evaluate`` (an actor on a split, resumable) and ``verl-tasks`` (verl's training data)."""

from __future__ import annotations

import argparse
import sys

from deltattg.cli.common import (
    add_environment,
    add_meter_source,
    add_setting,
    add_rollout,
    add_tokenizer,
    check_expert,
    check_out,
    environment,
    environment_options,
    local_path,
    meter_of,
    tokenizer_of,
)
from deltattg.command import UsageError, number, positive_int

def cmd_collect(args: argparse.Namespace) -> int:
    """Roll out a pool of policies in an environment and write their trajectories."""
    from contextlib import nullcontext

    from deltattg.data.jsonl import write_jsonl
    from deltattg.data.tokens import count_step_tokens
    from deltattg.envs.awm.sandbox import sigterm_as_interrupt
    from deltattg.envs.registry import DEFAULT_SPLIT
    from deltattg.rollout.collect import choose_tasks, collect, parse_policy
    from deltattg.rollout.engine import failed_steps, service_warning
    from deltattg.rollout.policies import SamplingConfig

    check_out(args.out)
    split = args.split or DEFAULT_SPLIT[args.env]
    try:
        specs = [parse_policy(p) for p in args.policy]
        names = [spec.name for spec in specs]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"--policy {', '.join(repeated)} given more than once (trajectory ids would repeat)")
        make_env, probe, tasks = environment(args, [split])
        chosen = choose_tasks(tasks, args.episodes, args.group_size, args.seed)  # enough distinct tasks, up front
        check_expert([spec.kind for spec in specs], probe, chosen)
        sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                                  prefix_cache=args.prefix_cache)
    except (ValueError, ImportError, OSError) as exc:
        raise UsageError(str(exc)) from None
    tokenizer = tokenizer_of(args.tokenizer)
    with sigterm_as_interrupt() if args.env == "awm" else nullcontext():  # its folders go as on Ctrl-C
        trajectories = collect(make_env, split, specs, episodes=args.episodes, group_size=args.group_size,
                               seed=args.seed, sampling=sampling, max_turns=args.max_turns, progress=args.progress)
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
    failed = [failed_steps(t) for t in trajectories]
    if warning := service_warning(sum(failed), sum(n > 0 for n in failed), len(trajectories)):
        print(warning, file=sys.stderr)
    print(f"wrote {len(trajectories)} trajectories to {args.out}", file=sys.stderr)
    return 0


def cmd_verl_tasks(args: argparse.Namespace) -> int:
    """verl's training data for the deltattg_env agent loop: one parquet row per task."""
    from deltattg.envs.registry import DEFAULT_SPLIT
    from deltattg.verl.tasks import task_rows, write_parquet

    check_out(args.out)
    split = args.split or DEFAULT_SPLIT[args.env]
    try:
        make_env, _, _ = environment(args, [split])
        rows = task_rows(make_env, split, args.limit, progress=args.progress)
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
    from deltattg.meter.loading import check_meter_turn_limit
    from deltattg.meter.loading import PLANNER_METERS
    from deltattg.rollout.collect import build_policy, check_episodes, choose_tasks, parse_policy
    from deltattg.rollout.policies import SamplingConfig
    from deltattg.rollout.prompts import PromptConfig

    if args.meter in PLANNER_METERS and args.env != "household":
        raise UsageError(f"--meter {args.meter} reads the household planner: use it with --env household")
    check_out(args.json, args.cache, args.meter, flag="--json")
    split = args.split or DEFAULT_SPLIT[args.env]
    try:
        spec = parse_policy(args.actor)
        make_env, probe, tasks = environment(args, [split])
        check_episodes(args.episodes, tasks)  # each task once, as evaluate plays them
        tasks = choose_tasks(tasks, args.episodes, 1, args.seed)
        check_expert([spec.kind], probe, tasks)
    except (ValueError, ImportError, OSError) as exc:
        raise UsageError(str(exc)) from None
    meter = meter_of(args)
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
    try:
        check_meter_turn_limit(meter, args.max_turns if args.max_turns is not None else probe.max_steps, "--meter",
                               "--max-turns (or the environment's limit)")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = compare_guidance(make_env, tasks, make_actor, meter, candidates=args.candidates, seed=args.seed,
                              max_turns=args.max_turns, progress=args.progress)  # fmt: skip
    print(f"test-time action selection, {len(tasks)} {args.env} {split} tasks, meter {args.meter} (Table 9 layout):")
    print(text_table(guidance_header(args.candidates), [guidance_row(spec.name, split, result.rows)]))
    wall = sum(row.seconds for row in result.rows)
    print(f"meter: {result.meter_seconds:.2f} s of the meter-guided arm's {result.rows[-1].seconds:.2f} s "
          f"({100 * result.meter_share:.1f}%); all arms {wall:.2f} s")
    if args.json:
        report = {"env": args.env, "short": args.short, "env_options": environment_options(args) or None,
                  "data": local_path(args.data), "split": split, "actor": args.actor, "meter": args.meter,
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
    from deltattg.rollout.evaluate import (PerEpisodePolicy, EvalSettings, failed_steps_warning, results_markdown,
                                           run_evaluation, select_tasks)
    from deltattg.rollout.policies import SamplingConfig
    from deltattg.rollout.prompts import PromptConfig

    check_out(args.out, folder=True)
    splits = [s.strip() for s in (args.split or DEFAULT_SPLIT[args.env]).split(",")]
    if not all(splits) or len(set(splits)) != len(splits):
        raise UsageError(f"--split {args.split}: name each split once, several separated by commas")
    try:
        spec = parse_policy(args.actor, trials=True).resolved()  # DIR, DIR/ and ./DIR: one actor, one run
        make_env, probe, tasks = environment(args, splits)
        tasks = select_tasks(tasks, args.episodes, args.seed)
        check_expert([spec.kind], probe, tasks)
    except (ValueError, ImportError, OSError) as exc:
        raise UsageError(str(exc)) from None
    model = spec.is_model
    from deltattg.envs.base import Describable

    settings = EvalSettings(env=args.env, short=args.short, split=",".join(splits), actor=spec.name, seed=args.seed,
                            max_turns=args.max_turns, temperature=args.temperature if model else None,
                            max_new_tokens=args.max_new_tokens if model else None,
                            environment=json_safe(probe.describe()) if isinstance(probe, Describable) else None)  # fmt: skip
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
    if warning := failed_steps_warning(results):
        print(warning, file=sys.stderr)
    print(f"wrote {results['played']} episodes to {Path(args.out) / 'episodes.jsonl'} ({results['episodes']} in all), "
          f"results.json and results.md", file=sys.stderr)
    return 0


def json_safe(value):
    """``value`` as it reads back from JSON (tuples become lists), so a stored copy compares equal to a fresh one."""
    import json

    return json.loads(json.dumps(value))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to ``sub``."""
    from deltattg.rollout.policies import SamplingConfig
    from deltattg.train.config import RunConfig

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
    add_environment(collect_p)
    collect_p.add_argument("--policy", action="append", required=True, help="a policy spec; repeat to pool several")
    collect_p.add_argument("--episodes", type=number(int, low=1, high=10**6), required=True, help="episodes per policy")
    collect_p.add_argument("--out", required=True, help="trajectory JSONL to write")
    collect_p.add_argument("--group-size", type=number(int, low=1, high=10**4), default=1, help="episodes per task (a GRPO group)")
    add_rollout(collect_p, max_new_tokens=256)
    collect_p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_tokenizer(collect_p)
    collect_p.set_defaults(func=cmd_collect)
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
    add_environment(guide)
    guide.add_argument("--actor", required=True,
                       help="policy spec: expert:EPS, random, lm:MODEL (HF id, path or smollm2), react:MODEL")
    guide.add_argument("--candidates", type=number(int, low=1, high=64), default=4, metavar="K",
                       help="proposals per step in the guided arms (default 4)")
    guide.add_argument("--episodes", type=number(int, low=1, high=10**5), required=True, metavar="N",
                       help="distinct tasks (one episode each per arm), drawn from --split with --seed; at most "
                       "the split's task count")
    add_rollout(guide, max_new_tokens=64)
    guide.add_argument("--json", help="also write the numbers as JSON here")
    add_meter_source(guide)
    add_tokenizer(guide)
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
    add_environment(evaluate, several_splits=True)
    evaluate.add_argument("--actor", required=True,
                          help="policy spec: expert, expert:EPS, random, lm:MODEL, vllm:MODEL, react:MODEL, "
                          "reflexion:MODEL")
    evaluate.add_argument("--episodes", type=number(int, low=1, high=10**6), metavar="N",
                          help="evaluate the first N tasks of the split shuffled with --seed (default: every task)")
    add_rollout(evaluate, max_new_tokens=SamplingConfig.max_new_tokens,
                 seed_help="task order and the actor's randomness, default %(default)s")
    add_setting(evaluate, "--threads", RunConfig, "threads", type=number(int, low=0, high=1024))
    evaluate.add_argument("--out", required=True, help="folder for episodes.jsonl, results.json and results.md "
                          "(a folder holding this run's episodes.jsonl is resumed)")
    evaluate.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    evaluate.set_defaults(func=cmd_evaluate)

    verl_tasks = sub.add_parser(
        "verl-tasks",
        help="verl training data for the deltattg_env agent loop: one parquet row per environment task",
        description="Write --split's tasks as the parquet file verl's data.train_files / data.val_files read with "
        "the deltattg_env agent loop (agent_name column; the task in extra_info.deltattg_task). See docs/verl.md.",
    )
    add_environment(verl_tasks)
    verl_tasks.add_argument("--limit", type=positive_int, metavar="N", help="only the first N tasks of the split")
    verl_tasks.add_argument("--out", required=True, help="parquet file to write")
    verl_tasks.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    verl_tasks.set_defaults(func=cmd_verl_tasks)
