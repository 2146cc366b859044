"""Meter recipes side by side, judged by what credit reads (issue 47): on each prepared household seed (the regime's
actor and pool, as ``bench_train.py`` prepares them under the same ``--out``), every candidate recipe trains a
regression meter on the training pool tasks' states from each label source, and is read against the planner on the
held-out pool states, on its own training states (does it underfit?) and, where an arm has run, on the states the
RL-trained actor visits: b̂ balanced accuracy, v̂ Spearman, the step change Δ's Spearman and sign agreement, sibling
ranking (``eval-meter --reference``'s numbers), and the training's wall time on this machine.

    .venv/bin/python bench/bench_meter_candidates.py --seeds 200 --out runs/bench_train --labels planner best-of-k

Label sources: ``planner`` and ``belief`` train on the oracle's or the belief reference's own readings — a
learnability check (can the recipe learn a function of what it reads?), never a headline arm; ``best-of-k`` on the
regime's planner-free labels (the base actor completes each state K times). A candidate is ``NAME=FIELD=VALUE,...``
of ``RegimeConfig``'s meter fields; each meter is kept under ``SEED/candidates/LABELS-NAME-DIGEST`` (the digest of
its meter settings) and reused.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from deltattg.report import markdown_table, three_decimals

CANDIDATES = {
    "scratch 64×2, 6 epochs, batch 16 (before issue 47)": "meter_init=scratch,meter_epochs=6,meter_batch_size=16,"
                                                          "meter_lr=0.001,meter_delta_weight=0",
    "scratch, batch 4, 12 epochs, lr 3e-4": "meter_init=scratch,meter_delta_weight=0",
    "scratch + Δ loss ×3": "meter_init=scratch",
    "BC actor, no Δ loss": "meter_delta_weight=0",
    "regime: BC actor + Δ loss ×3": "",
    "BC actor + Δ loss ×10": "meter_delta_weight=10",
}
KEYS = ("b_balanced_accuracy", "ttg_spearman", "delta_spearman", "delta_sign_agreement", "sibling_ranking")


def candidate(text: str) -> tuple[str, str]:
    name, sep, settings = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=FIELD=VALUE,... (e.g. 'deep=meter_layers=4')")
    return name, settings


def overrides(settings: str) -> dict:
    """``FIELD=VALUE,...`` of ``RegimeConfig``'s meter fields, typed as the fields are."""
    from deltattg.regime.config import setting_type
    from deltattg.train.config import coerce

    out = {}
    for item in filter(None, settings.split(",")):
        name, _, value = item.partition("=")
        if not name.startswith("meter_") or setting_type(name) is None:
            raise ValueError(f"{item!r}: a candidate sets RegimeConfig's meter_* fields")
        out[name] = coerce(value, setting_type(name), name)
    return out


def candidate_folder(source: str, name: str, recipe) -> str:
    """Where a candidate's meter is kept: its labels, its name and a digest of every meter setting it trains with, so
    a candidate renamed or changed (or a regime default moved) trains anew instead of reusing another recipe's
    meter."""
    from deltattg.regime.seeds import settings_hash

    meter = {k: v for k, v in recipe.preparation().items() if k.startswith("meter_")}
    return f"{source}-{name.replace(' ', '_').replace('/', '_')}-{settings_hash(meter)[:10]}"


def reference_labels(meter, trajectories) -> dict:
    """A reference meter's readings of every state s_0..s_T as labels (a learnability check's exact targets)."""
    from deltattg.data.labels import StateLabel
    from deltattg.meter.loading import read_states

    rows = read_states(meter, trajectories, terminal=True)[0]
    return {t.id: [StateLabel(bool(r.can_complete), float(r.tokens_to_go), "reference", r.probability) for r in row]
            for t, row in zip(trajectories, rows)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[200])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_train"), help="bench_train.py's --out")
    parser.add_argument("--labels", nargs="+", default=["planner", "best-of-k"],
                        choices=("planner", "belief", "best-of-k"))
    parser.add_argument("--candidates", type=candidate, nargs="+", metavar="NAME=SETTINGS",
                        help="default: " + "; ".join(f"{k}: {v or 'the regime'}" for k, v in CANDIDATES.items()))
    parser.add_argument("--quick", action="store_true", help="the demo's --quick settings (a smoke test)")
    parser.add_argument("--allow-mixed", action="store_true", help="reuse seeds prepared by another revision")
    parser.add_argument("--summary", type=Path, help="also write the table as a summary (bench/summary.py)")
    args = parser.parse_args(argv)
    candidates = dict(args.candidates or CANDIDATES.items())
    try:
        settings = {name: overrides(text) for name, text in candidates.items()}
    except ValueError as exc:
        parser.error(str(exc))
    rows = run(args, settings)
    columns = ("candidate", "labels", "train s", "b bal. acc.", "v Spearman", "Δ Spearman", "Δ sign", "sibling",
               "Δ Spearman, training states", "Δ Spearman, current policy")  # fmt: skip
    table = [[r["candidate"], r["labels"], f"{r['train_seconds']:.0f}",
              *(three_decimals(r["held-out"][k]) for k in KEYS), three_decimals(r["training"]["delta_spearman"]),
              three_decimals(r.get("current policy", {}).get("delta_spearman"))] for r in rows]  # fmt: skip
    print(f"Against the planner, held-out pool states unless said, mean over seeds {args.seeds}:")
    print(markdown_table(columns, table))
    if args.summary:
        from deltattg.summaries import write_summary

        write_summary(args.summary, "bench_meter_candidates", ["bench/bench_meter_candidates.py", *(argv or sys.argv[1:])],
                      {"candidates": (columns, table)}, records={"candidates": rows})  # fmt: skip
    return 0


def run(args: argparse.Namespace, settings: dict[str, dict]) -> list[dict]:
    """Train and read every (labels, candidate) on every seed; the numbers averaged over seeds, one record each."""
    from deltattg.meter.fit import agreement_of
    from deltattg.meter.loading import load_meter, planner_meter, read_states
    from deltattg.regime.config import regime_config
    from deltattg.regime.seeds import Meters, meter_folder, prepare_seed
    from deltattg.regime.stages import label_settings, policy_states, pool_labels, process_settings, train_meter
    from deltattg.train.checkpoint import ACTOR, latest_checkpoint

    results: dict[tuple[str, str], list[dict]] = {}
    with process_settings(1):
        for seed in args.seeds:
            config = regime_config(quick=args.quick, seed=seed, threads=1, budget=False)
            folder = args.out / f"seed-{seed}"
            sources = ("best-of-k",) if "best-of-k" in args.labels else ()
            prepared = prepare_seed(config, folder, Meters(1, False, sources), allow_mixed=args.allow_mixed,
                                    need_pool=True)  # fmt: skip
            actor, oracle = prepared.actor, planner_meter("oracle", prepared.actor.tokenizer)
            sets = {"held-out": prepared.heldout_pool, "training": prepared.train_pool}
            checkpoint = latest_checkpoint(folder / "grpo")  # GRPO's actor, where it has run
            if checkpoint is not None:
                sets["current policy"] = policy_states(config, prepared.world, checkpoint / ACTOR, actor.tokenizer, 64)
            planner = {name: read_states(oracle, trajectories)[0] for name, trajectories in sets.items()}
            for source in args.labels:
                if source == "best-of-k":
                    labels = pool_labels(config, prepared.world, actor, prepared.pool,
                                         label_settings(config, source, folder / meter_folder(0)),
                                         folder / f"labels-{source}.jsonl", folder / meter_folder(0))[0]  # fmt: skip
                else:
                    labels = reference_labels(planner_meter(source, actor.tokenizer), prepared.pool)
                for name, fields in settings.items():
                    recipe = config.replace(**fields)
                    out = folder / "candidates" / candidate_folder(source, name, recipe)
                    timing = out / "train_seconds.json"
                    if not timing.is_file():
                        start = time.perf_counter()
                        train_meter(recipe, prepared.train_pool, actor, out, prepared.heldout_pool,
                                    labels=labels)  # fmt: skip
                        timing.write_text(json.dumps(time.perf_counter() - start) + "\n")
                    meter = load_meter(out)
                    record = {"seed": seed, "train_seconds": json.loads(timing.read_text())}
                    for state_set, trajectories in sets.items():
                        read = read_states(meter, trajectories)[0]
                        record[state_set] = agreement_of(trajectories, read, planner[state_set],
                                                         config.credit.failure_cost).as_dict()  # fmt: skip
                    results.setdefault((name, source), []).append(record)
                    print(f"[candidates] seed {seed}, {source}, {name}: Δ Spearman "
                          f"{record['held-out']['delta_spearman']:.3f}", file=sys.stderr, flush=True)
    return [{"candidate": name, "labels": source, "seeds": [r["seed"] for r in records],
             "train_seconds": mean([r["train_seconds"] for r in records]),
             **{state_set: {key: mean([r[state_set][key] for r in records]) for key in (*KEYS, "states", "steps")}
                for state_set in ("held-out", "training", "current policy") if state_set in records[0]}}
            for (name, source), records in results.items()]  # fmt: skip


def mean(values: Sequence[float]) -> float:
    kept = [v for v in values if v == v]
    return sum(kept) / len(kept) if kept else float("nan")


if __name__ == "__main__":
    raise SystemExit(main())
