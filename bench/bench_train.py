"""DeltaTTG vs GRPO on the built-in household environment: several seeds, the same budget (issue 5, item 6).

Per seed, the demo's pipeline (``deltattg.demo.pipeline.run_demo`` without its guidance stage, the demo's defaults
with that seed): a tiny actor behaviour-cloned from that seed, a trajectory pool, a regression meter, then GRPO and
DeltaTTG from the same actor and seed for ``--steps`` steps each (same tasks, batch, group size, learning rate).
Outputs under ``--out``: one folder per seed (the runs' ``metrics.jsonl`` and configs) and ``bench_train.md`` /
``bench_train.png`` / ``bench_train.json`` with:

  * success curves, mean ± std over seeds: held-out success (greedy and sampled, every ``--eval-every`` steps) and
    training-rollout success (EMA-smoothed, as the paper's Fig. 3 curves);
  * steps to match: the first step at which DeltaTTG's seed-mean curve reaches GRPO's final seed-mean value, divided
    by the number of steps (the paper: ~0.6 on ALFWorld, "40% fewer steps"; the issue's goal ≤ 0.6), for each curve,
    and per seed;
  * training-step time DeltaTTG ÷ GRPO with meter scoring included (goal ≤ 1.10): medians over all steps of all
    seeds, per step and per training row (episodes of a better policy are shorter, so raw step times also measure
    the policy), with the rollout / meter / credit / update split.

Nothing here asserts anything: on a shared 2-core machine the timings are noisy and a few seeds of a tiny actor
leave wide error bars; read the spread next to the means. It takes tens of minutes (about 9 per seed at 40 steps on
a quiet machine); ``--report-only`` redraws the tables and plot from the runs already under ``--out``.

    .venv/bin/python bench/bench_train.py                          # seeds 0 1 2, 40 steps
    .venv/bin/python bench/bench_train.py --seeds 0 1 2 3 4 --steps 60 --out runs/bench_train_60
    .venv/bin/python bench/bench_train.py --report-only --out runs/bench_train
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from deltattg.demo.config import DemoConfig, demo_config
from deltattg.demo.pipeline import METHODS, run_demo
from deltattg.demo.report import LABELS, COLORS, eval_records, markdown_table, pyplot, step_records
from deltattg.train import read_metrics

CURVES = {  # name -> (which records, metric)
    "eval greedy": ("eval", "eval/greedy_success"),
    "eval sampled": ("eval", "eval/sampled_success"),
    "training rollouts (EMA)": ("step", "rollout/success"),
}
EMA_ALPHA = 0.3
PHASES = ("rollout", "meter", "credit", "update")


# ---- curves ----------------------------------------------------------------------------------------------------------
def ema(values: Sequence[float], alpha: float = EMA_ALPHA) -> list[float]:
    out: list[float] = []
    for v in values:
        out.append(v if not out else alpha * v + (1 - alpha) * out[-1])
    return out


def curve(records: Sequence[dict], curve_name: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one curve of one run."""
    which, key = CURVES[curve_name]
    chosen = eval_records(records) if which == "eval" else step_records(records)
    values = [r[key] for r in chosen]
    return [r["step"] for r in chosen], ema(values) if which == "step" else values


def seed_mean(runs: Sequence[Sequence[dict]], curve_name: str) -> tuple[list[int], list[float], list[float]]:
    """Steps, mean and standard deviation over seeds (the runs share one evaluation schedule)."""
    curves = [curve(records, curve_name) for records in runs]
    steps = curves[0][0]
    columns = list(zip(*(values for _, values in curves)))
    means = [statistics.fmean(c) for c in columns]
    stds = [statistics.stdev(c) if len(c) > 1 else 0.0 for c in columns]
    return steps, means, stds


def steps_to_reach(steps: Sequence[int], values: Sequence[float], target: float) -> int | None:
    """The first step whose value is at least ``target`` (None: never)."""
    return next((s for s, v in zip(steps, values) if v >= target - 1e-12), None)


def match_ratio(ours: Sequence[Sequence[dict]], grpo: Sequence[Sequence[dict]], curve_name: str, total: int) -> dict:
    """Steps DeltaTTG needs to reach GRPO's final value, ÷ ``total`` steps: on the seed means, and per seed. Only
    defined where GRPO ended above where it started (else any curve "reaches" it at once)."""
    steps, ours_mean, _ = seed_mean(ours, curve_name)
    _, grpo_mean, _ = seed_mean(grpo, curve_name)
    reached = steps_to_reach(steps, ours_mean, grpo_mean[-1]) if grpo_mean[-1] > grpo_mean[0] else None
    per_seed = []
    for mine, theirs in zip(ours, grpo):
        my_steps, my_values = curve(mine, curve_name)
        their_values = curve(theirs, curve_name)[1]
        step = steps_to_reach(my_steps, my_values, their_values[-1]) if their_values[-1] > their_values[0] else None
        per_seed.append(None if step is None else step / total)
    return {"grpo_start": grpo_mean[0], "grpo_final": grpo_mean[-1], "deltattg_final": ours_mean[-1],
            "step": reached, "ratio": None if reached is None else reached / total, "per_seed": per_seed}  # fmt: skip


# ---- time ------------------------------------------------------------------------------------------------------------
def time_split(runs: Sequence[Sequence[dict]]) -> dict[str, float]:
    """Median seconds per step of each phase and in all, and median seconds per training row, over every step of
    every seed (medians: one step slowed by a busy shared machine does not move them)."""
    steps = [r for records in runs for r in step_records(records)]
    out = {phase: statistics.median(r[f"time/{phase}"] for r in steps) for phase in PHASES}
    out["step"] = statistics.median(r["time/step"] for r in steps)
    out["per_row"] = statistics.median(r["time/step"] / max(r.get("train/rows", 0), 1) for r in steps)
    return out


# ---- running and reporting -------------------------------------------------------------------------------------------
def run_seeds(args: argparse.Namespace) -> None:
    """The demo's pipeline up to RL, once per seed, into ``--out/seed-N``."""
    for seed in args.seeds:
        config = demo_config(quick=args.quick, seed=seed, threads=args.threads)
        config = config.replace(steps=args.steps, eval_every=args.eval_every, eval_tasks=args.eval_tasks,
                                **dict(args.set))
        start = time.perf_counter()
        run_demo(config, args.out / f"seed-{seed}", guidance=False)
        print(f"[bench] seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)


def load_runs(seeds: Sequence[int], out: Path) -> dict[str, list[list[dict]]]:
    return {method: [read_metrics(out / f"seed-{seed}" / method) for seed in seeds] for method in METHODS}


def plot(runs: dict[str, list[list[dict]]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(CURVES), figsize=(5 * len(CURVES), 4), sharey=True)
    for ax, name in zip(axes, CURVES):
        for method in METHODS:
            steps, means, stds = seed_mean(runs[method], name)
            ax.plot(steps, means, "-", color=COLORS[method], label=LABELS[method])
            ax.fill_between(steps, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                            color=COLORS[method], alpha=0.2)  # fmt: skip
        ax.set_title(name)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"success rate (mean ± std over {len(runs['grpo'])} seeds)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(runs: dict[str, list[list[dict]]], seeds: Sequence[int], command: str) -> tuple[str, dict]:
    """The markdown report and the JSON figures."""
    total = step_records(runs["grpo"][0])[-1]["step"]
    ratios = {name: match_ratio(runs["deltattg"], runs["grpo"], name, total) for name in CURVES}
    times = {method: time_split(runs[method]) for method in METHODS}
    step_ratio = times["deltattg"]["step"] / times["grpo"]["step"]
    row_ratio = times["deltattg"]["per_row"] / times["grpo"]["per_row"]
    curve_rows = []
    for name in CURVES:
        for method in METHODS:
            steps, means, stds = seed_mean(runs[method], name)
            picks = (0, len(steps) // 2, len(steps) - 1)
            curve_rows.append([name, LABELS[method], *(f"{100 * means[k]:.1f} ± {100 * stds[k]:.1f} (step {steps[k]})"
                                                       for k in picks)])  # fmt: skip
    match_rows = [[name, f"{100 * r['grpo_start']:.1f} → {100 * r['grpo_final']:.1f}",
                   f"{100 * r['deltattg_final']:.1f}", "-" if r["step"] is None else str(r["step"]),
                   ratio_text(r["ratio"]), ", ".join(ratio_text(v) for v in r["per_seed"])]
                  for name, r in ratios.items()]  # fmt: skip
    time_rows = [[LABELS[m], *(f"{times[m][p]:.2f}" for p in (*PHASES, "step")), f"{1000 * times[m]['per_row']:.1f}"]
                 for m in METHODS]  # fmt: skip
    text = "\n\n".join([
        "# bench_train: DeltaTTG vs GRPO on the household environment",
        f"`{command}` — seeds {list(seeds)}, {total} steps per run; the demo's defaults otherwise "
        "(each seed folder's `train.yaml`; each run's resolved `config.yaml`).",
        "## Success curves (%, mean ± std over seeds)",
        markdown_table(("curve", "method", "start", "middle", "end"), curve_rows),
        "![curves](bench_train.png)",
        "## Steps for DeltaTTG to reach GRPO's final success (÷ steps; paper ~0.6, goal ≤ 0.6)",
        markdown_table(("curve", "GRPO start → final %", "DeltaTTG final %", "DeltaTTG reaches GRPO's final at step",
                        "ratio (seed means)", "ratio per seed"), match_rows),  # fmt: skip
        "A ratio is the step ÷ the steps per run; '-': DeltaTTG never reached GRPO's final value, or GRPO did not end "
        "above its start (then there is nothing to reach). The seed-mean ratio compares the seed-mean curves.",
        "## Training-step time (s, median over all steps and seeds; meter scoring included)",
        markdown_table(("method", *PHASES, "step", "ms per training row"), time_rows),
        f"DeltaTTG ÷ GRPO step time: **{step_ratio:.2f}** (goal ≤ 1.10); per training row: {row_ratio:.2f}.",
    ])  # fmt: skip
    figures = {"seeds": list(seeds), "steps": total, "match": ratios, "time": times,
               "step_time_ratio": step_ratio, "row_time_ratio": row_ratio}  # fmt: skip
    return text + "\n", figures


def demo_setting(text: str) -> tuple[str, object]:
    """``FIELD=VALUE`` → (field, YAML-parsed value, a float where the default is one); the field must be one of
    :class:`DemoConfig`'s."""
    name, sep, value = text.partition("=")
    if not sep or name not in {f.name for f in dataclasses.fields(DemoConfig)}:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=VALUE with FIELD a DemoConfig field")
    default = getattr(DemoConfig(), name)
    parsed = yaml.safe_load(value)
    return name, float(parsed) if isinstance(default, float) else parsed  # YAML reads 1e-4 as a string


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-tasks", type=int, default=40, help="held-out tasks per evaluation (default 40)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_train"))
    parser.add_argument("--set", type=demo_setting, action="append", default=[], metavar="FIELD=VALUE",
                        help="change one DemoConfig field (YAML value), e.g. --set lr=1e-4; repeatable")
    parser.add_argument("--report-only", action="store_true", help="only redraw from the runs under --out")
    parser.add_argument("--quick", action="store_true", help="the demo's --quick settings (a smoke test of this "
                        "script: --quick --steps 2 --eval-every 1 --eval-tasks 3 --seeds 0 1)")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.report_only:
        run_seeds(args)
    runs = load_runs(args.seeds, args.out)
    command = "bench/bench_train.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text, figures = report(runs, args.seeds, command.strip())
    plot(runs, args.out / "bench_train.png")
    (args.out / "bench_train.md").write_text(text)
    (args.out / "bench_train.json").write_text(json.dumps(figures, indent=2, default=lambda v: None) + "\n")
    print(text)


if __name__ == "__main__":
    main()
