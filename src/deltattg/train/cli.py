"""``deltattg train``: the trainer from the command line (``add_train_parser`` plugs it into ``deltattg``'s parser;
``python -m deltattg.train`` runs it on its own)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from deltattg.command import UsageError, run_parsed
from deltattg.train.config import PRESETS

EPILOG = """\
examples:
  deltattg train --preset household-tiny --out runs/grpo
  deltattg train --preset household-tiny --method deltattg --meter runs/meter --set optim.lr=3e-4 --set run.steps=50
  deltattg train --config my.yaml --set rollout.group_size=4
  deltattg train --out runs/grpo --resume              # continue a killed run from its latest checkpoint
  deltattg train --out runs/grpo --resume latest-valid # ... from its newest intact one (the latest is corrupt)
  deltattg train --preset household-tiny --out runs/grpo --overwrite   # start over: deletes the old run's files
  deltattg train --preset alfworld --meter METER_DIR --print-config

Settings (section.key): actor (model, tiny_*, lora_*, dtype, device), env (name, size, options, data_dir, train_split,
eval_split), rollout (batch_size, group_size, max_turns, max_new_tokens, temperature, top_p, ...), algo (method,
dynamic_sampling, min_group_std, max_gen_batches), credit (rho, cap, failure_cost, ...), loss (clip_low, clip_high,
dual_clip, kl_coef, kl_estimator, entropy_coef), optim (lr, weight_decay, max_grad_norm, mini_batch_size,
micro_batch_size, recompute_old_logprobs, target_kl), meter (path), eval (every, num_tasks, greedy, sampled,
at_start), run (out, steps, seed, save_every, tensorboard, progress, threads). Print a preset with --print-config to
see them all.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), help="named settings: Table 4's alfworld, papersearchqa, "
                        "awm (Qwen3-4B column) or the CPU preset household-tiny")  # fmt: skip
    parser.add_argument("--config", metavar="FILE", help="YAML file of settings (over the preset)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one setting (repeatable; last wins), e.g. --set optim.lr=1e-5")  # fmt: skip
    parser.add_argument(
        "--method", help="shortcut for --set algo.method=M: dapo or a registered estimator (`deltattg methods`)"
    )
    parser.add_argument("--meter", metavar="DIR", help="shortcut for --set meter.path=DIR (the frozen progress meter)")
    parser.add_argument(
        "--out", metavar="DIR", help="shortcut for --set run.out=DIR (config.yaml, metrics.jsonl, checkpoints/)"
    )
    parser.add_argument("--resume", nargs="?", const="latest", metavar="CHECKPOINT",
                        help="continue from a checkpoint folder of this run, or (no value) from the run's latest one, "
                        "or (latest-valid) from its newest intact one; without --preset/--config the run's own "
                        "config.yaml is used")  # fmt: skip
    parser.add_argument("--overwrite", action="store_true",
                        help="start a fresh run in an --out folder that holds another run, deleting that run's "
                        "config.yaml, run.json, metrics.jsonl, checkpoints/ and tb/ first (without it, such a "
                        "folder is refused)")  # fmt: skip
    parser.add_argument("--print-config", action="store_true", help="print the resolved configuration as YAML and exit")
    parser.set_defaults(func=cmd_train)


def add_train_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train",
        help="train an actor with GRPO, DAPO, DeltaTTG or any registered estimator (one machine, CPU or 1 GPU)",
        description="RL of a multi-turn agent: each step samples tasks, G rollouts per task, computes advantages with "
        "the chosen estimator (the DeltaTTG family reads a frozen progress meter on the decision states of A != 0 "
        "trajectories), and runs one PPO epoch (clip, dual clip, token-mean, KL to the initial actor, entropy). "
        "Writes run.json, config.yaml, metrics.jsonl and checkpoints under run.out; a killed run resumes exactly. "
        "Estimators that read the actor itself (IGPO / A2TGPO's answer log-probs, DelTA's hidden states, CrEST's "
        "self-teacher) get their extra pass here; `deltattg methods` says what each reads.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return parser


def overrides_of(args: argparse.Namespace) -> list[str]:
    shortcuts = {"algo.method": args.method, "meter.path": args.meter, "run.out": args.out}
    return [f"{key}={value}" for key, value in shortcuts.items() if value is not None] + list(args.set)


def run_config_path(args: argparse.Namespace) -> Path:
    """Where a resumed run's own ``config.yaml`` is: in ``--out``, or two levels above ``--resume CHECKPOINT``."""
    if args.out:
        return Path(args.out) / "config.yaml"
    if args.resume not in ("latest", "latest-valid"):
        return Path(args.resume).resolve().parent.parent / "config.yaml"
    raise ValueError("--resume without a checkpoint folder needs --out (the run to continue)")


def check_specs(config) -> None:
    """The actor model and the meter, where they name local paths, exist (and a meter folder's ``meter_config.json``
    is valid): ``InputError`` at once, never a Hub lookup or a half-started run."""
    from deltattg.hf import check_local
    from deltattg.meter.loading import PLANNER_METERS, meter_kind
    from deltattg.train.config import needs_meter

    if config.actor.model != "tiny":
        check_local(config.actor.model, "actor model")
    meter = config.meter.path
    if needs_meter(config) and meter and meter not in PLANNER_METERS and not meter.startswith(("http://", "https://")):
        check_local(meter, "meter")
        meter_kind(meter)


def cmd_train(args: argparse.Namespace) -> int:
    """Resolve the configuration, then train (bad settings, a missing meter or checkpoint: a usage error, exit 2)."""
    from deltattg.train.config import dump, load, needs_meter, resolve, with_absolute_paths
    from deltattg.train.rollouts import DynamicSamplingExhausted
    from deltattg.train.trainer import train

    overrides = overrides_of(args)
    if args.overwrite and args.resume:
        raise UsageError("--overwrite starts the run over: it cannot be combined with --resume")
    try:
        if args.resume and not (args.preset or args.config):
            config = load(run_config_path(args), overrides)
        else:
            config = resolve(args.preset, args.config, overrides, require_meter=not args.print_config)
        if args.print_config:
            print(dump(config), end="")
            if needs_meter(config) and not config.meter.path:
                print(f"deltattg train: note: algo.method {config.algo.method} reads a frozen progress meter: give "
                      "--meter DIR to train", file=sys.stderr)
            return 0
        check_specs(config)  # a mistyped actor or meter path: refused before the run folder is touched
        config = with_absolute_paths(config)  # the saved config.yaml resumes from any working folder
        records = train(config, resume=args.resume, overwrite=args.overwrite)
    except DynamicSamplingExhausted as exc:  # the run stops where its last checkpoint is; resume after a change
        print(f"deltattg train: error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    print(summary(records, config.run.out), file=sys.stderr)
    return 0


def summary(records: Sequence[dict], out: str) -> str:
    """The last step's numbers and the mean time split, in a few lines."""
    steps = [r for r in records if r.get("step", 0) > 0]
    if not steps:
        return f"no training steps run; outputs in {out}"
    last = steps[-1]
    evals = [r for r in records if any(k.startswith("eval/") for k in r)]
    lines = [f"trained {last['step']} steps; outputs in {out}",
             f"  last step: success {last['rollout/success']:.3f}, reward {last['rollout/reward']:.3f}, "
             f"cumulative response tokens {last['cumulative_response_tokens']}"]  # fmt: skip
    if evals:
        lines.append(
            "  last eval: " + ", ".join(f"{k[5:]} {v:.3f}" for k, v in evals[-1].items() if k.startswith("eval/"))
        )
    from deltattg.train.trainer import PHASES

    phases = [p for p in PHASES if all(f"time/{p}" in r for r in steps)]  # older runs lack time/answer
    means = {p: sum(r[f"time/{p}"] for r in steps) / len(steps) for p in phases}
    lines.append("  seconds per step: " + ", ".join(f"{p} {means[p]:.2f}" for p in phases)
                 + f"; meter share {means['meter'] / max(sum(means.values()), 1e-12):.1%}")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="deltattg train", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run_parsed(parser, argv)
