"""The progress meter's commands: ``train-meter``, ``score`` (add readings to records), ``eval-meter`` (completion
accuracy, Spearman, agreement) and ``eval-steps`` (step quality against step labels)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from deltattg.cli.common import (
    add_label_source,
    add_meter_source,
    add_setting,
    add_skip_invalid,
    add_tokenizer,
    check_out,
    check_records_turn_limit,
    compute_labels,
    label_settings,
    meter_of,
    read_records,
    tokenizer_of,
)
from deltattg.command import (
    EXIT_NO_READING,
    UsageError,
    failure_cost,
    number,
    positive_float,
    positive_int,
    seed_int,
    turn_limit,
)
from deltattg.errors import InputError

GENERATIVE_STAGE = "sft+grpo"  # train-meter --stage's default


def _kind_options() -> dict[str, tuple[str, str, object]]:
    """``--option -> (the kind it trains, its attribute, its default)`` for ``train-meter``'s one-kind options."""
    from deltattg.meter.regression import RegressionConfig
    from deltattg.meter.train_regression import RegressionTrainConfig

    regression = {"--target": ("target", RegressionConfig.target),
                  "--ensemble": ("ensemble", RegressionConfig.ensemble), "--layer": ("layer", RegressionConfig.layer),
                  "--pooling": ("pooling", RegressionConfig.pooling),
                  "--max-message-chars": ("max_message_chars", RegressionConfig.max_message_chars),
                  "--head-epochs": ("head_epochs", RegressionTrainConfig.head_epochs), "--full": ("full", False),
                  "--delta-weight": ("delta_weight", RegressionTrainConfig.delta_weight)}
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
    from deltattg.meter.commands import (
        RELIABILITY_FIGURE,
        check_meter_output,
        select_split,
        train_generative,
        train_regression,
    )

    check_out(args.out, args.data, args.split, args.bootstrap_meter, folder=True)
    _check_kind_options(args)
    if args.delta_weight and (not args.full or args.target != "ttg"):
        raise UsageError("--delta-weight trains the step change of Token-to-Go with the backbone: it needs --full and "
                         "--target ttg")
    labelling = label_settings(args)
    check_meter_output(args.out, model=args.model, tokenizer=args.tokenizer)
    items = select_split(read_records(args.data, args.skip_invalid), args.split, args.subset)
    if not items:
        raise UsageError("no trajectories left to train on (check --split / --subset)")
    limit = records_turn_limit(items) if args.turn_limit == "auto" else args.turn_limit
    tokenizer = tokenizer_of(args.tokenizer)
    labels = label_report = None
    if labelling.source != "outcome":  # kept beside the pool: computed once, resumed if interrupted
        from deltattg.rollout.label_sources import label_cache_path

        cache = label_cache_path(args.data, labelling)
        print(f"labels ({labelling.source}): {cache}", file=sys.stderr)
        labels, label_report = compute_labels(args, items, tokenizer, str(cache), cache=True)
        print(f"labels: {label_report.summary()}", file=sys.stderr)
    heldout: list = []
    if args.calibration_fraction:
        from deltattg.data.sources import split_by_task

        items, heldout = split_by_task(items, args.calibration_fraction, args.seed)
        if not items or not heldout:
            raise UsageError(f"--calibration-fraction {args.calibration_fraction} leaves no tasks to train on or none "
                             "to calibrate on")
    if args.kind == "regression":
        meter_settings = {"max_length": args.max_length, "max_message_chars": args.max_message_chars,
                          "pooling": args.pooling, "target": args.target, "ensemble": args.ensemble, "layer": args.layer,
                          "turn_limit": limit, "labels": labelling.to_json()}  # fmt: skip
        train_settings = {"freeze_backbone": not args.full, "head_epochs": args.head_epochs, "epochs": args.epochs,
                          "batch_size": args.batch_size, "seed": args.seed, "progress": args.progress,
                          "delta_weight": args.delta_weight}
        if args.lr is not None:
            train_settings["lr_head_frozen" if not args.full else "lr_backbone"] = args.lr
        report = train_regression(items, args.model, args.out, count_tokenizer=tokenizer, meter_settings=meter_settings,
                                  train_settings=train_settings, calibration=heldout, labels=labels,
                                  label_report=label_report)  # fmt: skip
        print(f"{report['examples']} decision states; final loss {report['final_loss']:.4f}", file=sys.stderr)
    else:
        settings = {"num_train_epochs": args.epochs, "per_device_train_batch_size": args.batch_size, "seed": args.seed,
                    "disable_tqdm": not args.progress}
        if args.lr is not None:
            settings["learning_rate"] = args.lr
        report = train_generative(items, args.model, args.out, stage=args.stage, count_tokenizer=tokenizer,
                                  max_prompt_tokens=args.max_length, lora=args.lora, train_settings=settings,
                                  turn_limit=limit, calibration=heldout, labels=labels, labelling=labelling,
                                  label_report=label_report)  # fmt: skip
    if "calibration" in report:
        fit = report["calibration"]
        print(f"completion temperature {fit['temperature']:.3f} on {fit['states']} held-out states (ECE "
              f"{fit['ece_before']:.3f} -> {fit['ece_after']:.3f} there, {fit['ece_unseen']:.3f} on states it was not "
              f"fitted on; reliability diagram: "
              f"{os.path.join(args.out, RELIABILITY_FIGURE)})", file=sys.stderr)
    print(f"saved the meter to {args.out}", file=sys.stderr)
    return 0


def records_turn_limit(items: Sequence) -> int | None:
    """The turn limit every record's ``env.max_turns`` agrees on (``collect`` and ``train`` write it), else ``None``."""
    limits = {(item.trajectory.extra.get("env") or {}).get("max_turns") if isinstance(item.trajectory.extra.get("env"), dict)
              else None for item in items}  # fmt: skip
    limit = limits.pop() if len(limits) == 1 else None
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1 else None


def cmd_score(args: argparse.Namespace) -> int:
    """Add the meter's reading of every decision state to each trajectory (what ``credit`` consumes)."""
    from deltattg.data.jsonl import write_jsonl
    from deltattg.credit.records import queried
    from deltattg.meter.commands import score_records

    check_out(args.out, args.input, args.cache, args.meter)
    items = read_records(args.input, args.skip_invalid)
    meter = meter_of(args)
    check_records_turn_limit(meter, items)
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

    check_out(args.json, args.data, args.split, args.cache, args.meter, flag="--json")
    items = select_split(read_records(args.data, args.skip_invalid), args.split, args.subset)
    meter = meter_of(args)
    check_records_turn_limit(meter, items)
    results = evaluate_steps(items, meter, args.failure_cost, readouts=args.readout, progress=args.progress)
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
    from deltattg.report import three_decimals

    check_out(args.json, args.data, args.cache, args.meter, args.reference, flag="--json")
    items = read_records(args.data, args.skip_invalid)
    tokenizer = tokenizer_of(args.tokenizer)
    for item in items:
        try:
            item.trajectory.step_tokens = resolve_step_tokens(item.trajectory, tokenizer)
        except InputError as exc:
            raise exc.located(path=item.path, line=item.line) from None
    meter = meter_of(args)
    try:  # refused up front
        reference = load_meter(args.reference, tokenizer=args.tokenizer) if args.reference else None
    except ValueError as exc:
        raise UsageError(f"--reference {args.reference}: {exc}") from None
    check_records_turn_limit(meter, items)
    if reference is not None:
        check_records_turn_limit(reference, items, "--reference")
    if args.failure_cost is not None and reference is None:
        raise UsageError("--failure-cost sets C of the step changes Δ read against --reference: give a --reference")
    fit, agree = evaluate_meter(items, meter, reference, args.failure_cost)
    if not fit.success:  # nothing to measure: refuse to print NaN
        last = _last_meter_error(meter)
        print(f"deltattg: error: no valid reading: the meter read every state of {args.data} as null"
              f"{f' (last error: {last})' if last else ''}; nothing measured", file=sys.stderr)
        return EXIT_NO_READING
    results = {"meter": args.meter, "data": args.data, "trajectories": len(items), **fit.as_dict()}
    print(f"{args.meter} on {len(items)} trajectories of {args.data}: {fit.completion_accuracy:.1%} completion "
          f"accuracy, Spearman {three_decimals(fit.spearman, 'n/a')} of predicted vs true TTG ({len(fit.success)} "
          "states)")
    if agree is not None:
        results["reference"] = {"meter": args.reference, **agree.as_dict()}
        print(f"against {args.reference}: b agrees on {agree.completion_agreement:.1%} of {agree.states} states "
              f"(balanced accuracy {three_decimals(agree.b_balanced_accuracy, 'n/a')} against its b, "
              f"{agree.reference_completable} completable), Spearman {three_decimals(agree.ttg_spearman, 'n/a')} of "
              "the two meters' TTG")
        changes = agree.changes
        print(f"step changes Δ (C = {changes.failure_cost:g}) on {changes.steps} steps: Spearman "
              f"{three_decimals(changes.delta_spearman, 'n/a')}, sign agrees on "
              f"{three_decimals(changes.delta_sign_agreement, 'n/a')}; {changes.sibling_pairs} sibling pairs ordered "
              f"alike: {three_decimals(changes.sibling_ranking, 'n/a')}")
        kinds = changes.sign_confusion.items()
        print(f"steps by {args.reference}'s kind, read by {args.meter} as progress / none / regress: "
              + "; ".join(f"{kind} ({sum(row.values())}) {kinds_share(row)}" for kind, row in kinds))
    if args.json:
        write_json(args.json, results)
    return 0


def kinds_share(row: dict[str, int]) -> str:
    """``a / b / c %``: the shares of one kind of step that a meter reads as progress, none and regress."""
    total = sum(row.values())
    return " / ".join(f"{100 * n / total:.0f}" for n in row.values()) + " %" if total else "-"


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to ``sub``."""
    from deltattg.meter.regression import RegressionConfig
    from deltattg.meter.train_regression import RegressionTrainConfig
    from deltattg.train.config import PAPER_METER_MODEL

    train_meter = sub.add_parser(
        "train-meter",
        help="train a progress meter (regression head, or generative SFT + GRPO)",
        description="Train a Token-to-Go progress meter on recorded trajectories (ours or AgentProcessBench records). "
        "Labels come from trajectory outcomes and token counts (Eq. 1-2, --labels outcome) or from completions of the "
        "replayed states (--labels rollout / best-of-k, computed once and kept beside DATA in DATA.labels/, resumed "
        "if interrupted) or bootstrapped (--labels td); meter_config.json names the source. Step labels never enter "
        "training. "
        "regression: backbone + head predicting the completion logit and log1p(TTG), every decision state of a "
        "trajectory read in one pass; by default the backbone is frozen and its features cached, so only the head "
        "trains (fast on CPU). generative: the paper's meter, SFT on the JSON answer (Eq. 3) then GRPO refinement "
        "with our reconstructed reward (docs/concepts/meter.md; deltattg.meter.train_generative.progress_reward).",
    )
    train_meter.add_argument("data", help="trajectory JSONL (or AgentProcessBench records)")
    train_meter.add_argument("--out", required=True, help="folder to save the meter to (save_pretrained layout)")
    train_meter.add_argument("--kind", choices=["regression", "generative"], default="regression")
    train_meter.add_argument("--model", default="smollm2",
                             help="backbone / base model: HF id or path, 'smollm2' (offline CPU default) or DIR::FILE.gguf; "
                             f"GPU recipe: {PAPER_METER_MODEL} (the paper's meter base)")
    train_meter.add_argument("--split", help="split file ({\"train\": [ids], ...}); train on one subset of it")
    train_meter.add_argument("--subset", default="train", help="subset of --split to train on (default: train)")
    add_setting(train_meter, "--max-length", RegressionConfig, "max_length", type=positive_int)
    add_setting(train_meter, "--max-message-chars", RegressionConfig, "max_message_chars", type=positive_int)
    add_setting(train_meter, "--pooling", RegressionConfig, "pooling", choices=["last", "last+mean"])
    add_setting(train_meter, "--target", RegressionConfig, "target", choices=["ttg", "score"])
    add_setting(train_meter, "--ensemble", RegressionConfig, "ensemble", type=positive_int)
    add_setting(train_meter, "--layer", RegressionConfig, "layer", type=positive_int)
    train_meter.add_argument("--full", action="store_true", help="regression: train the backbone too (default: frozen)")
    add_setting(train_meter, "--head-epochs", RegressionTrainConfig, "head_epochs", type=positive_int)
    add_setting(train_meter, "--delta-weight", RegressionTrainConfig, "delta_weight", type=number(float, low=0))
    add_setting(train_meter, "--epochs", RegressionTrainConfig, "epochs", type=positive_int)
    add_setting(train_meter, "--batch-size", RegressionTrainConfig, "batch_size", type=positive_int)
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
                             help="hold out this fraction of the tasks (groups) from training and fit the "
                             "completion temperature on their states, p̃ = σ(logit / T) (generative: logit = "
                             "log p(true) - log p(false) after {\"can_complete\":), stored with the meter and read by "
                             "deltattg_robust's soft readout; train_report.json and reliability.png show the fit; "
                             "default 0: T = 1")
    add_setting(train_meter, "--seed", RegressionTrainConfig, "seed", type=seed_int)
    train_meter.add_argument("--no-progress", dest="progress", action="store_false",
                             help="no progress bars (labels, features, training)")
    add_label_source(train_meter)
    add_tokenizer(train_meter)
    add_skip_invalid(train_meter)
    train_meter.set_defaults(func=cmd_train_meter)

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
    add_tokenizer(score)
    add_skip_invalid(score)
    score.set_defaults(func=cmd_score)
    eval_meter = sub.add_parser(
        "eval-meter",
        help="completion accuracy and TTG rank correlation of a meter on held-out trajectories",
        description="Read every nonterminal decision state of DATA's trajectories with --meter and compare with the "
        "labels (Eq. 1-2): completion accuracy (b against the trajectory's outcome) and Spearman's rho of predicted "
        "against true Token-to-Go on the successful trajectories' states. With --reference (a meter folder, e.g. one "
        "trained in DATA's own domain, or oracle): how often the two meters' b agree, the balanced accuracy of "
        "--meter's b against the reference's (the mean over the reference's completable and hopeless states of the "
        "share read alike) and the Spearman of their TTG, state by state (cross-domain transfer, paper 5.3; a "
        "learned meter against the planner); and what credit reads: the per-step change of remaining cost, "
        "delta_t = c_t - c_(t+1) (Eq. 7-8; the terminal state anchored at 0 on success, C otherwise), its Spearman "
        "and sign agreement with the reference's, and the share of sibling pairs (recorded trajectories that share "
        "a decision state and take different actions from it) both order alike by delta (docs/concepts/meter.md). Input without "
        "a decision state is refused (exit 2); exits 3 when not one reading is valid.",
    )
    eval_meter.add_argument("data", help="trajectory JSONL with outcomes (collect's output)")
    eval_meter.add_argument("--reference", help="a second meter read on the same states, taken as the reference: a "
                            "meter folder, 'oracle' (household rollouts: the planner, tokens counted with "
                            "--tokenizer) or 'belief' (household: the planner over the worlds the history allows)")
    eval_meter.add_argument("--failure-cost", type=positive_float, metavar="C",
                            help="with --reference: the failure cost C of the step changes (Eq. 7; default: the "
                            "smallest power of two at least twice every Token-to-Go the reference or the data reads)")
    eval_meter.add_argument("--json", help="also write the numbers as JSON here")
    add_meter_source(eval_meter)
    add_tokenizer(eval_meter)
    add_skip_invalid(eval_meter)
    eval_meter.set_defaults(func=cmd_eval_meter)
    eval_steps = sub.add_parser(
        "eval-steps",
        help="step-quality accuracy of a meter against step labels (§5.1)",
        description="Predicted progress of each labelled step, Δ = c(h_t) - c(h_t+1) with c = v if b else C (terminal "
        "prefix included), against AgentProcessBench step labels; neutral steps excluded; ties and invalid readings "
        "count as wrong. Prints accuracy and balanced accuracy per dataset and pooled, beside always-beneficial and "
        "random baselines.",
    )
    eval_steps.add_argument("--data", required=True, help="records with step_labels: AgentProcessBench JSONL, or "
                            "`collect` records of noisy experts (+1 the expert's action, -1 a deliberate mistake)")
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
    add_tokenizer(eval_steps)
    add_skip_invalid(eval_steps)
    eval_steps.set_defaults(func=cmd_eval_steps)
