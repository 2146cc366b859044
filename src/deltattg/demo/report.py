"""What the demo shows: PNG plots (matplotlib, Agg), ``report.md`` and the console summary table.

Every number in the report comes from the run's own files or the :class:`~deltattg.demo.pipeline.DemoResult`; the
RL numbers are read from each method's ``metrics.jsonl`` records (the same ones the trainer wrote).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

import yaml

from deltattg.demo.pipeline import DemoResult
from deltattg.regime.config import RegimeConfig
from deltattg.guidance import guidance_header, guidance_row
from deltattg.meter.fit import Agreement, MeterFit
from deltattg.data.jsonl import atomic_output
from deltattg.report import figure_png, markdown_table, percent, pyplot, save_figure, text_table, three_decimals
from deltattg.train.config import to_dict
from deltattg.train.trainer import mean

LABELS = {"grpo": "GRPO", "deltattg": "DeltaTTG (learned meter)", "deltattg@oracle": "DeltaTTG (oracle meter)",
          "deltattg_robust": "robust DeltaTTG (learned meter)", "deltattg_robust@oracle": "robust DeltaTTG (oracle meter)",
          "deltattg@best-of-k": "DeltaTTG (best-of-k meter)",
          "deltattg_robust@best-of-k": "robust DeltaTTG (best-of-k meter)", "deltattg@belief": "DeltaTTG (belief meter)"}
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
COLORS = {"grpo": PALETTE[0], "deltattg": PALETTE[1], "deltattg@oracle": PALETTE[2], "deltattg_robust": PALETTE[3],
          "deltattg_robust@best-of-k": PALETTE[3], "deltattg@belief": PALETTE[4]}


def label(arm: str) -> str:
    """How the report names an arm (``pipeline.Arm.name``)."""
    return LABELS.get(arm, arm)


def color(arm: str, index: int = 0) -> str:
    return COLORS.get(arm, PALETTE[index % len(PALETTE)])
SUCCESS_PLOT, METER_PLOT = "success.png", "meter_fit.png"
SUMMARY_FILE = "summary.json"  # the run's tables, stamped (deltattg.summaries): what the docs' demo tables come from
CREDIT_SHOWN = 4  # trajectories in the per-step credit picture
CREDIT_DIR = "credit"  # deltattg inspect's report of the demo's credit: inspect.md, inspect.json, inspect.png
TRAIN_WINDOW = 5  # steps averaged for the "training success at the end" column


# ---- reading the metrics records -------------------------------------------------------------------------------------
def eval_records(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if "eval/greedy_success" in r]


def step_records(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if r.get("step", 0) > 0 and "rollout/success" in r]


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """One method's headline numbers, all read from its metrics records."""

    method: str
    greedy_start: float
    greedy_final: float
    sampled_start: float
    sampled_final: float
    train_final: float  # rollout success, mean of the last TRAIN_WINDOW steps
    seconds_per_step: float
    meter_share: float
    response_tokens: int

    @classmethod
    def of(cls, method: str, records: Sequence[dict]) -> RunSummary:
        evals, steps = eval_records(records), step_records(records)
        first, last = evals[0], evals[-1]
        return cls(
            method,
            first["eval/greedy_success"], last["eval/greedy_success"],
            first.get("eval/sampled_success", math.nan), last.get("eval/sampled_success", math.nan),
            mean([r["rollout/success"] for r in steps[-TRAIN_WINDOW:]]),
            mean([r["time/step"] for r in steps]),
            mean([r["time/meter"] for r in steps]) / max(mean([r["time/step"] for r in steps]), 1e-12),
            steps[-1]["cumulative_response_tokens"] if steps else 0,
        )  # fmt: skip


# ---- plots -----------------------------------------------------------------------------------------------------------
SUCCESS_KEYS = ("step", "cumulative_response_tokens", "eval/greedy_success", "eval/sampled_success", "rollout/success")


def success_records(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Each arm's records cut to what :func:`success_png` draws (a summary holds them)."""
    return {arm: [{k: r[k] for k in SUCCESS_KEYS if k in r} for r in records
                  if "eval/greedy_success" in r or "rollout/success" in r] for arm, records in runs.items()}


def success_png(runs: dict[str, list[dict]]) -> bytes:
    """Held-out success (greedy solid, sampled dashed) and training-rollout success (thin) against training steps
    and against cumulative actor response tokens (Fig. 3 a/b), as PNG bytes."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for index, (arm, records) in enumerate(runs.items()):
        tint, name = color(arm, index), label(arm)
        evals, steps = eval_records(records), step_records(records)
        for ax, x_key in zip(axes, ("step", "cumulative_response_tokens")):
            x = [r[x_key] for r in evals]
            ax.plot(x, [r["eval/greedy_success"] for r in evals], "o-", color=tint, label=f"{name} eval greedy")
            if evals and "eval/sampled_success" in evals[0]:
                ax.plot(x, [r["eval/sampled_success"] for r in evals], "s--", color=tint, alpha=0.8,
                        label=f"{name} eval sampled")  # fmt: skip
            ax.plot([r[x_key] for r in steps], [r["rollout/success"] for r in steps], "-", color=tint, alpha=0.35,
                    lw=1, label=f"{name} training rollouts")  # fmt: skip
    axes[0].set_xlabel("training step")
    axes[1].set_xlabel("cumulative actor response tokens")
    axes[0].set_ylabel("success rate")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].legend(fontsize=7, loc="best")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle("GRPO vs DeltaTTG: same initial actor, seed and budget")
    fig.tight_layout()
    return figure_png(fig, dpi=110)


def plot_meter_fit(fit: MeterFit, path: Path) -> None:
    """Predicted vs true Token-to-Go on the held-out successful trajectories' states, marked by the meter's b̂ (a
    state read as b̂ = 0 costs C in Eq. 7 whatever v̂ says)."""
    plt = pyplot()
    points = [(t, p, c) for s, t, p, c in zip(fit.success, fit.true_ttg, fit.predicted_ttg, fit.predicted_can)
              if s and p is not None]  # fmt: skip
    top = max([v for t, p, _ in points for v in (t, p)] + [1.0]) * 1.05
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    for can, marker, tint, name in ((True, "o", "#4c72b0", "b̂ = 1"), (False, "x", "crimson", "b̂ = 0 (cost C)")):
        chosen = [(t, p) for t, p, c in points if c is can]
        if chosen:
            ax.scatter(*zip(*chosen), marker=marker, s=16, alpha=0.6, color=tint, label=f"{name}: {len(chosen)}")
    ax.plot([0, top], [0, top], color="gray", lw=0.8, ls="--")
    ax.set_xlabel("true Token-to-Go (Eq. 1)")
    ax.set_ylabel("meter's predicted Token-to-Go v̂")
    ax.set_title(f"held-out tasks: Spearman {fit.spearman:.2f}, completion acc. {percent(fit.completion_accuracy)}%",
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


# ---- tables ----------------------------------------------------------------------------------------------------------
RL_HEADER = ("method", "eval greedy % (start → final)", "eval sampled % (start → final)",
             f"train success % (last {TRAIN_WINDOW} steps)", "s / step", "meter share")  # fmt: skip


def rl_rows(summaries: Sequence[RunSummary]) -> list[list[str]]:
    return [[label(s.method), f"{percent(s.greedy_start)} → {percent(s.greedy_final)}",
             f"{percent(s.sampled_start)} → {percent(s.sampled_final)}", percent(s.train_final),
             f"{s.seconds_per_step:.2f}", f"{100 * s.meter_share:.1f}%"] for s in summaries]  # fmt: skip


METER_HEADER = ("held-out pool states", "b balanced acc. vs planner", "Spearman v̂ vs planner's v",
                "Δ Spearman vs planner's", "Δ sign agreement", "sibling ranking (pairs)")  # fmt: skip


def meter_row(agreement: Agreement) -> list[str]:
    """The shown meter against the planner (``eval-meter --reference``'s numbers)."""
    changes = agreement.changes
    assert changes is not None
    return [str(agreement.states), three_decimals(agreement.b_balanced_accuracy), three_decimals(agreement.ttg_spearman),
            three_decimals(changes.delta_spearman), three_decimals(changes.delta_sign_agreement),
            f"{three_decimals(changes.sibling_ranking)} ({changes.sibling_pairs})"]  # fmt: skip


def summary_tables(result: DemoResult) -> dict[str, tuple]:
    """The run's numbers as summary tables, (columns, rows) by name (``deltattg.summaries``; ``summary.json``, what
    the docs' demo tables are generated from): stage times, the meter against the planner, credit precision, the RL
    arms and test-time selection."""
    config = result.config
    summaries = [RunSummary.of(arm, records) for arm, records in result.runs.items()]
    timings = [[name, f"{seconds:.1f}"] for name, seconds in result.timings.items()]
    timings.append(["total", f"{sum(result.timings.values()):.1f}"])
    tables = {"stages": (("stage", "wall time (s)"), timings), "rl": (RL_HEADER, rl_rows(summaries)),
              "guidance": (guidance_header(config.candidates),
                           [guidance_row("base", config.eval_split, result.guidance)])}  # fmt: skip
    if result.oracle_agreement is not None and result.oracle_agreement.changes is not None:
        tables["meter"] = (METER_HEADER, [meter_row(result.oracle_agreement)])
    if result.credit is not None and result.credit.precision:
        tables["credit"] = (("arm", "positive credit on progress steps %", "negative credit elsewhere %"),
                            [[arm, percent(p.positive_on_progress), percent(p.negative_off_progress)]
                             for arm, p in result.credit.precision.items()])  # fmt: skip
    return tables


def summary_figures(result: DemoResult) -> dict[str, dict]:
    """The data of the run's success curves and (with a credit inspection) of its per-step credit picture, as summary
    figures (``deltattg.summaries.figure_png`` draws them as the report does)."""
    from deltattg.inspection import credit_panels, shown_trajectories

    figures = {"success": {"kind": "training_success", "runs": success_records(result.runs)}}
    if result.credit is not None:
        shown = shown_trajectories(result.credit.records[result.credit.arms[0]], CREDIT_SHOWN)
        figures["credit"] = {"kind": "credit", **credit_panels(result.credit, shown)}
    return figures


def summary_table(result: DemoResult) -> str:
    """The console summary: credit precision, the meter's step change against the planner, the RL arms beside the
    paired-seed benchmark, then the guidance table."""
    config = result.config
    summaries = [RunSummary.of(arm, records) for arm, records in result.runs.items()]
    guidance = guidance_row("base", config.eval_split, result.guidance)
    precision = []
    if result.credit is not None and result.credit.precision:
        rows = [[arm, percent(p.positive_on_progress), percent(p.negative_off_progress)]
                for arm, p in result.credit.precision.items()]  # fmt: skip
        precision = ["credit precision on base-actor rollouts (% of positive credit on progress steps, % of negative "
                     "credit on the others):", text_table(("arm", "positive on progress", "negative elsewhere"), rows),
                     ""]  # fmt: skip
    changes = result.oracle_agreement.changes if result.oracle_agreement is not None else None
    delta = [f"the meter's step change Δ (what credit reads) against the planner's, held-out pool states: Spearman "
             f"{three_decimals(changes.delta_spearman)}, sign agreement {three_decimals(changes.delta_sign_agreement)}, "
             f"sibling ranking {three_decimals(changes.sibling_ranking)} ({changes.sibling_pairs} pairs)",
             ""] if changes else []  # fmt: skip
    return "\n".join([
        *precision,
        *delta,
        f"RL arms, {config.steps} steps each, eval on {config.eval_tasks} {config.eval_split} tasks (one seed):",
        text_table(RL_HEADER, rl_rows(summaries)),
        "",
        benchmark_note(bench := benchmark()),
        text_table(bench["table"]["columns"], bench["table"]["rows"]),
        "",
        f"test-time action selection, base actor, {config.guidance_tasks} {config.eval_split} tasks (Table 9 layout):",
        text_table(guidance_header(config.candidates), [guidance]),
    ])  # fmt: skip


def confusion_table(fit: MeterFit) -> str:
    """States of the held-out trajectories by outcome (rows) and the meter's b̂ (columns)."""
    counts = fit.confusion()
    rows = []
    for outcome, name in ((True, "successful trajectories"), (False, "failed trajectories")):
        total = max(counts[outcome, True] + counts[outcome, False], 1)
        rows.append([name, *(f"{counts[outcome, b]} ({percent(counts[outcome, b] / total)}%)" for b in (True, False))])
    return markdown_table(("states of", "read b̂ = 1", "read b̂ = 0"), rows)


def planner_agreement(agreement: Agreement, fit: MeterFit) -> str:
    """The meter's accuracy against its labels next to its agreement with the planner on the same states, and how its
    per-step change Δ — what credit reads — follows the planner's."""
    text = (f"Against the planner on the same states (the oracle: the optimal plan fits in the turns left; the "
            f"expert's remaining tokens), what a meter that reads progress should match: b̂ balanced accuracy "
            f"{agreement.b_balanced_accuracy:.3f} over its {agreement.reference_completable} completable and "
            f"{agreement.states - agreement.reference_completable} hopeless states (against the outcome labels: "
            f"{percent(fit.completion_accuracy)}% accuracy), Spearman of v̂ against its v {agreement.ttg_spearman:.2f}.")
    changes = agreement.changes
    if changes is None:
        return text
    return text + (f" What credit reads, the step change Δ_t = c_t − c_{{t+1}} (Eq. 7–8, C = {changes.failure_cost:g}): "
                   f"its Spearman against the planner's {three_decimals(changes.delta_spearman)} and its sign "
                   f"(progress / none / regress) alike on {percent(changes.delta_sign_agreement)}% of "
                   f"{changes.steps} steps; of {changes.sibling_pairs} pairs of steps taken from one shared state, "
                   f"{three_decimals(changes.sibling_ranking)} ordered as the planner orders them "
                   "(what these numbers mean: docs/concepts/meter.md).")


def meter_recipe(config: RegimeConfig, meter_name: str) -> str:
    """What the shown meter is: its backbone, its labels and its training (``RegimeConfig.meter_*``)."""
    backbone = ("the behaviour-cloned actor's decoder (its weights) + a regression head" if config.meter_init == "actor"
                else f"a tiny Llama backbone h{config.meter_hidden} × {config.meter_layers} layer(s) from scratch + a "
                "regression head")  # fmt: skip
    labels = meter_name.removeprefix("meter-") if meter_name != "meter" else "outcome"
    delta = f", the step-change loss weighted {config.meter_delta_weight:g}" if config.meter_delta_weight else ""
    return (f"Regression meter on {labels} labels ({backbone}, trained end to end{delta}, `{meter_name}/`)")


BENCHMARK = "benchmark.json"  # package data: docs/results/bench_train_new.json's test table


def benchmark() -> dict:
    """The household benchmark's paired-seed table on the test split (``bench/bench_train.py``, docs/benchmarks.md):
    the evidence the demo's one seed is shown beside."""
    from importlib.resources import files

    return json.loads(files("deltattg.demo").joinpath(BENCHMARK).read_text(encoding="utf-8"))


def benchmark_note(bench: dict) -> str:
    seeds = len(bench["command"].split("--seeds ", 1)[1].split(" --", 1)[0].split())
    return (f"The benchmark's {seeds} paired seeds, final greedy success on 1,000 test-split tasks (95 % t intervals, "
            f"paired differences to GRPO with a permutation p; `{bench['command']}` at {bench['commit'][:12]}, "
            f"{bench['date']}, with that commit's settings, which may differ from this run's, its meter recipe "
            f"among them; docs/benchmarks.md) — the evidence; this run's one seed is not:")


# ---- the report ------------------------------------------------------------------------------------------------------
def write_report(result: DemoResult) -> Path:
    """Draw the plots, write ``demo_config.yaml``, the credit inspection (``credit/``) and ``report.md`` under
    ``result.out``; return the report's path."""
    from deltattg.inspection import concentration_table, precision_table
    from deltattg.inspection import write_report as write_inspection

    out, config = result.out, result.config
    assert result.actor is not None and result.fit is not None and result.credit is not None
    with atomic_output(out / SUCCESS_PLOT, binary=True) as handle:
        handle.write(success_png(result.runs))
    plot_meter_fit(result.fit, out / METER_PLOT)
    write_inspection(result.credit, result.credit_items, out / CREDIT_DIR, show=CREDIT_SHOWN)
    (out / "demo_config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    summaries = [RunSummary.of(arm, records) for arm, records in result.runs.items()]
    actor = result.actor
    parameters = sum(p.numel() for p in actor.model.parameters())
    pool_rows = [[name, str(n), percent(rate), f"{steps:.2f}"] for name, (n, rate, steps) in result.pool.items()]
    timing_rows = [[name, f"{seconds:.1f}"] for name, seconds in result.timings.items()]
    timing_rows.append(["total", f"{sum(result.timings.values()):.1f}"])
    meter = result.meter_report
    fit = result.fit
    clone = (f"behaviour-cloned on {actor.demonstrations} successful ε = {config.clone_epsilon:g} noisy-expert "
             f"episodes for {config.clone_epochs} epoch(s) ({len(actor.clone_losses)} steps, final batch loss "
             f"{actor.clone_losses[-1]:.3f})" if actor.clone_losses else "used as it is (no cloning)")  # fmt: skip
    grpo = next((s for s in summaries if s.method == "grpo"), summaries[0])
    times = ", ".join(f"{label(s.method)} {s.seconds_per_step / max(grpo.seconds_per_step, 1e-12):.2f}"
                      for s in summaries if s is not grpo)  # fmt: skip
    census = result.credit.census() if result.credit.classes else None
    sections = [
        "# deltattg demo",
        f"Environment `{config.env}`, actor `{config.model}` ({parameters / 1e6:.2f} M parameters), seed "
        f"{config.seed}, {config.threads} torch thread(s). Every setting: `demo_config.yaml`; the trainer's: "
        f"`train.yaml` (rerun one arm with `deltattg train --config train.yaml --method grpo --out DIR`). The numbers "
        "below come from this run on this machine; the same machine and packages give the same numbers, another CPU "
        "may round differently and sample other rollouts.",
        markdown_table(("stage", "wall time (s)"), timing_rows),
        "## 1. Base actor",
        f"`{actor.spec}`: {clone}. The same weights start every RL run.",
        "## 2. Trajectory pool",
        f"{sum(n for n, _, _ in result.pool.values())} episodes on the same training tasks (`pool.jsonl`); Token-to-Go "
        f"labels count each action in the actor's tokenizer.",
        markdown_table(("policy", "episodes", "success %", "mean steps"), pool_rows),
        "## 3. Progress meter",
        f"{meter_recipe(config, result.meter_name)}: {meter['examples']} decision states, {config.meter_epochs} epoch(s), "
        f"final batch loss {meter['final_loss']:.3f}. On the held-out pool tasks ({len(fit.success)} states): "
        f"completion accuracy {percent(fit.completion_accuracy)}%, Spearman ρ(true, predicted TTG) "
        f"{fit.spearman:.2f}, mean absolute error {fit.mean_absolute_error:.1f} tokens (the successful "
        f"trajectories' states). Each decision state is marked with the turns left (the meter can see a time-out "
        f"coming); its completion probability p̃ = σ(logit / T) has T = {meter.get('calibration', {}).get('temperature', 1.0):.2f} "
        "fitted on those held-out states (what robust DeltaTTG's soft readout reads). How the meter reads b̂ on the "
        "states of successful and of failed trajectories:",
        confusion_table(fit),
        *([planner_agreement(result.oracle_agreement, fit)] if result.oracle_agreement is not None else []),
        f"![meter fit]({METER_PLOT})",
        "## 4. Where the credit goes",
        f"{config.group_size} sampled base-actor rollouts of each of {config.credit_tasks} training tasks, credited by "
        "GRPO (the trajectory's advantage on every step), by the paper's DeltaTTG and by robust DeltaTTG (ours, at its "
        "defaults) reading the learned meter"
        + (" and the oracle meter (the household planner's exact readings). The planner also says which steps made "
           "progress (the distance to the goal drops), which were neutral and which regressed; the table gives the "
           "share of positive credit (A > 0, token-weighted) on progress steps and of negative credit (A < 0) on "
           f"neutral and regress steps ({census['progress']} progress, {census['neutral']} neutral, "
           f"{census['regress']} regress steps)." if census else ".")
        + f" Per-step tables of the drawn trajectories: `{CREDIT_DIR}/inspect.md`.",
        precision_table(result.credit) if census else "",
        "How concentrated each method's credit is within a trajectory (a step's share: its |credit|·tokens over the "
        "trajectory's; one misread b̂ sends most of the paper's credit to one step):",
        concentration_table(result.credit),
        f"![per-step credit]({CREDIT_DIR}/inspect.png)",
        "## 5. RL: " + ", ".join(label(arm) for arm in result.runs),
        f"{config.steps} steps each, {config.batch_size} tasks × G = {config.group_size} rollouts per step, lr "
        f"{config.optim.lr:g}, C = {config.credit.failure_cost:g}, ρ = {config.credit.rho:g}, M = "
        f"{config.credit.cap:g}; held-out evaluation on "
        f"{config.eval_tasks} `{config.eval_split}` tasks every {config.eval_every} steps. One seed: the gap between "
        "arms in one run is mostly noise; `bench/bench_train.py` runs the same arms over paired seeds with "
        "confidence intervals (docs/benchmarks.md#the-household-rl-regime). Runs: " + ", ".join(f"`{a}/`" for a in result.runs) + ".",
        markdown_table(RL_HEADER, rl_rows(summaries)),
        f"Training-step time ÷ GRPO's (meter scoring included; rollout lengths differ between runs): {times}.",
        f"![success curves]({SUCCESS_PLOT})",
        benchmark_note(bench := benchmark()),
        markdown_table(bench["table"]["columns"], bench["table"]["rows"]),
        "## 6. Test-time action selection (E.5, Table 9 layout)",
        f"The base actor on {config.guidance_tasks} `{config.eval_split}` tasks, temperature 1: one sampled action "
        f"per step; one of {config.candidates} sampled candidates at random; the candidate whose successor state the "
        f"meter predicts cheapest (SR: success rate, Steps: average interaction length).",
        markdown_table(guidance_header(config.candidates), [guidance_row("base", config.eval_split, result.guidance)]),
    ]  # fmt: skip
    path = out / "report.md"
    path.write_text("\n\n".join(part for part in sections if part) + "\n")
    return path
