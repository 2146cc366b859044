"""What the demo shows: PNG plots (matplotlib, Agg), ``report.md`` and the console summary table.

Every number in the report comes from the run's own files or the :class:`~deltattg.demo.pipeline.DemoResult`; the
RL numbers are read from each method's ``metrics.jsonl`` records (the same ones the trainer wrote).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import yaml

from deltattg.demo.pipeline import METHODS, CreditExample, DemoResult, GuidanceRow, MeterFit
from deltattg.train.config import to_dict
from deltattg.train.trainer import mean

LABELS = {"grpo": "GRPO", "deltattg": "DeltaTTG (learned meter)", "deltattg@oracle": "DeltaTTG (oracle meter)"}
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
COLORS = {"grpo": PALETTE[0], "deltattg": PALETTE[1], "deltattg@oracle": PALETTE[2]}


def label(arm: str) -> str:
    """How the report names an arm (``pipeline.Arm.name``)."""
    return LABELS.get(arm, arm)


def color(arm: str, index: int = 0) -> str:
    return COLORS.get(arm, PALETTE[index % len(PALETTE)])
SUCCESS_PLOT, CREDIT_PLOT, METER_PLOT = "success.png", "credit.png", "meter_fit.png"
TRAIN_WINDOW = 5  # steps averaged for the "training success at the end" column


def percent(rate: float) -> str:
    """A success rate as the report prints it (percent, one decimal)."""
    return f"{100 * rate:.1f}"


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
def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_success(runs: dict[str, list[dict]], path: Path) -> None:
    """Held-out success (greedy solid, sampled dashed) and training-rollout success (thin) against training steps
    and against cumulative actor response tokens (Fig. 3 a/b)."""
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def short(action: str, width: int = 22) -> str:
    return action if len(action) <= width else action[: width - 1] + "…"


def plot_credit(example: CreditExample, path: Path) -> None:
    """Per-step advantages Ã_{i,t} of the shown trajectories under GRPO (flat) and DeltaTTG (redistributed)."""
    plt = pyplot()
    shown = example.shown()
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 3.4 * len(shown)), squeeze=False)
    for ax, i in zip(axes[:, 0], shown):
        steps = len(example.actions[i])
        width = 0.4
        for k, method in enumerate(METHODS):
            values = example.records[method][i]["step_advantages"]
            ax.bar([t + (k - 0.5) * width for t in range(steps)], values, width, color=color(method),
                   label=label(method))  # fmt: skip
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xticks(range(steps))
        ax.set_xticklabels([f"{t}: {short(a)}" for t, a in enumerate(example.actions[i])], rotation=30, ha="right",
                           fontsize=7)  # fmt: skip
        record = example.records["deltattg"][i]
        outcome = "success" if record["success"] else "failure"
        ax.set_title(f"{record['id']}  ({outcome}, A = {record['advantage']:+.3f}, DeltaTTG: {record['credit']})",
                     fontsize=9)  # fmt: skip
        ax.set_ylabel("step advantage Ã")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_meter_fit(fit: MeterFit, failure_cost: float, path: Path) -> None:
    """Predicted vs true Token-to-Go on held-out successful trajectories; states the meter calls unsuccessful are
    drawn at the top (c = C would be off the chart)."""
    plt = pyplot()
    true, predicted = fit.successful_pairs()
    missed = [t for s, t, p in zip(fit.success, fit.true_ttg, fit.predicted_ttg) if s and p is None]
    top = max([*true, *predicted, *missed, 1.0]) * 1.08
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    ax.scatter(true, predicted, s=14, alpha=0.6, label="b̂ = 1: predicted v̂")
    if missed:
        ax.scatter(missed, [top] * len(missed), marker="x", color="crimson", s=18,
                   label=f"b̂ = 0 (cost C = {failure_cost:g})")  # fmt: skip
    ax.plot([0, top], [0, top], color="gray", lw=0.8, ls="--")
    ax.set_xlabel("true Token-to-Go (Eq. 1)")
    ax.set_ylabel("meter's predicted Token-to-Go")
    ax.set_title(f"held-out tasks: Spearman {fit.spearman:.2f}, completion acc. {percent(fit.completion_accuracy)}%",
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- tables ----------------------------------------------------------------------------------------------------------
def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table; ``|`` inside a cell is escaped."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in rows)])


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in [header, *rows])


RL_HEADER = ("method", "eval greedy % (start → final)", "eval sampled % (start → final)",
             f"train success % (last {TRAIN_WINDOW} steps)", "s / step", "meter share")  # fmt: skip


def rl_rows(summaries: Sequence[RunSummary]) -> list[list[str]]:
    return [[label(s.method), f"{percent(s.greedy_start)} → {percent(s.greedy_final)}",
             f"{percent(s.sampled_start)} → {percent(s.sampled_final)}", percent(s.train_final),
             f"{s.seconds_per_step:.2f}", f"{100 * s.meter_share:.1f}%"] for s in summaries]  # fmt: skip


def guidance_header(candidates: int) -> tuple[str, ...]:
    return ("actor", "split", "natural rollout (1) SR %", "Steps", f"random selection ({candidates}) SR %", "Steps",
            f"progress meter ({candidates}) SR %", "Steps")  # fmt: skip


def guidance_row(actor: str, split: str, rows: Sequence[GuidanceRow]) -> list[str]:
    return [actor, split, *(cell for row in rows for cell in (percent(row.success), f"{row.steps:.2f}"))]


def summary_table(result: DemoResult) -> str:
    """The console summary: GRPO vs DeltaTTG, then the guidance table."""
    config = result.config
    summaries = [RunSummary.of(arm, records) for arm, records in result.runs.items()]
    guidance = guidance_row("base", config.eval_split, result.guidance)
    return "\n".join([
        f"GRPO vs DeltaTTG, {config.steps} steps each, eval on {config.eval_tasks} {config.eval_split} tasks:",
        text_table(RL_HEADER, rl_rows(summaries)),
        "",
        f"test-time action selection, base actor, {config.guidance_tasks} {config.eval_split} tasks (Table 9 layout):",
        text_table(guidance_header(config.candidates), [guidance]),
    ])  # fmt: skip


def credit_markdown(example: CreditExample) -> str:
    """One table per shown trajectory: each step's action, meter reading, GRPO and DeltaTTG step advantages."""
    blocks = []
    for i in example.shown():
        grpo, ours = example.records["grpo"][i], example.records["deltattg"][i]
        rows = [[str(t), action, reading_text(ours["meter"][t]), f"{g:+.4f}", f"{d:+.4f}"]
                for t, (action, g, d) in enumerate(zip(example.actions[i], grpo["step_advantages"],
                                                       ours["step_advantages"]))]  # fmt: skip
        outcome = "success" if ours["success"] else "failure"
        blocks.append(f"**{ours['id']}** — {outcome}, A = {ours['advantage']:+.4f}, DeltaTTG credit: "
                      f"{ours['credit']}\n\n"
                      + markdown_table(("step", "action", "meter reading before the step", "Ã GRPO", "Ã DeltaTTG"),
                                       rows))  # fmt: skip
    return "\n\n".join(blocks)


def reading_text(reading: dict | None) -> str:
    if reading is None:
        return "invalid"
    return f"v̂ = {reading['tokens_to_go']:g}" if reading["can_complete"] else "b̂ = 0 (cost C)"


# ---- the report ------------------------------------------------------------------------------------------------------
def write_report(result: DemoResult) -> Path:
    """Draw the plots, write ``demo_config.yaml`` and ``report.md`` under ``result.out``; return the report's path."""
    out, config = result.out, result.config
    assert result.actor is not None and result.fit is not None and result.credit is not None
    plot_success(result.runs, out / SUCCESS_PLOT)
    plot_credit(result.credit, out / CREDIT_PLOT)
    plot_meter_fit(result.fit, config.failure_cost, out / METER_PLOT)
    (out / "demo_config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    summaries = [RunSummary.of(arm, records) for arm, records in result.runs.items()]
    grpo, ours = (RunSummary.of(arm, result.runs[arm]) for arm in METHODS)
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
    sections = [
        "# deltattg demo",
        f"Environment `{config.env}`, actor `{config.model}` ({parameters / 1e6:.2f} M parameters), seed "
        f"{config.seed}, {config.threads} torch thread(s). Every setting: `demo_config.yaml`; the trainer's: "
        f"`train.yaml` (rerun one method with `deltattg train --config train.yaml --method grpo --out DIR`).",
        markdown_table(("stage", "wall time (s)"), timing_rows),
        "## 1. Base actor",
        f"`{actor.spec}`: {clone}. The same weights start both RL runs.",
        "## 2. Trajectory pool",
        f"{sum(n for n, _, _ in result.pool.values())} episodes on the same training tasks (`pool.jsonl`); Token-to-Go "
        f"labels count each action in the actor's tokenizer.",
        markdown_table(("policy", "episodes", "success %", "mean steps"), pool_rows),
        "## 3. Progress meter",
        f"Regression meter (tiny Llama backbone h{config.meter_hidden} × {config.meter_layers} layer(s) + head, "
        f"trained end to end, `meter/`): {meter['examples']} decision states, {config.meter_epochs} epoch(s), "
        f"final batch loss {meter['final_loss']:.3f}. On the held-out pool tasks ({len(fit.success)} states): "
        f"completion accuracy {percent(fit.completion_accuracy)}%, Spearman ρ(true, predicted TTG) "
        f"{fit.spearman:.2f}, mean absolute error {fit.mean_absolute_error:.1f} tokens (successful trajectories, "
        f"states predicted completable).",
        f"![meter fit]({METER_PLOT})",
        "## 4. GRPO vs DeltaTTG",
        f"{config.steps} steps each, {config.batch_size} tasks × G = {config.group_size} rollouts per step, lr "
        f"{config.lr:g}, C = {config.failure_cost:g}, ρ = {config.rho:g}, M = {config.cap:g}; held-out evaluation on "
        f"{config.eval_tasks} `{config.eval_split}` tasks every {config.eval_every} steps (greedy and sampled). "
        f"Runs: `grpo/`, `deltattg/` (`metrics.jsonl`, `config.yaml`, final checkpoint).",
        markdown_table(RL_HEADER, rl_rows(summaries)),
        f"Training-step time DeltaTTG ÷ GRPO: {ours.seconds_per_step / max(grpo.seconds_per_step, 1e-12):.2f} "
        f"(meter scoring included; rollout length differs between the runs). Cumulative response tokens: GRPO "
        f"{grpo.response_tokens}, DeltaTTG {ours.response_tokens}.",
        f"![success curves]({SUCCESS_PLOT})",
        "## 5. Test-time action selection (E.5, Table 9 layout)",
        f"The base actor on {config.guidance_tasks} `{config.eval_split}` tasks, temperature 1: one sampled action "
        f"per step; one of {config.candidates} sampled candidates at random; the candidate whose successor state the "
        f"meter predicts cheapest (SR: success rate, Steps: average interaction length).",
        markdown_table(guidance_header(config.candidates), [guidance_row("base", config.eval_split, result.guidance)]),
        "## 6. One group's credit: GRPO vs DeltaTTG",
        f"{config.group_size} sampled base-actor rollouts of one training task, scored by the meter; GRPO gives every "
        f"step of a trajectory its advantage A, DeltaTTG redistributes it by the predicted progress of each step "
        f"(same sign, same token mean).",
        f"![per-step credit]({CREDIT_PLOT})",
        credit_markdown(result.credit),
    ]  # fmt: skip
    path = out / "report.md"
    path.write_text("\n\n".join(sections) + "\n")
    return path
