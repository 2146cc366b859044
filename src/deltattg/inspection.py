"""``deltattg inspect``: where each credit method puts a trajectory's advantage — per-step credit side by side and, on
household rollouts, **credit precision** against the planner's truth.

The planner knows the distance d_t (optimal remaining actions) of every state, so step t of a replayed trajectory is
*progress* (d_{t+1} < d_t), *neutral* (equal) or *regress* (d rises: a harmful action). A method's precision is

* the share of **positive** credit (trajectories with A > 0; |A·w_t|·n_t, token-weighted) that lands on progress
  steps, and
* the share of **negative** credit (A < 0) that lands on neutral and regress steps,

beside GRPO's, whose uniform weights give each step its token share — the baseline a step-level method must beat.

An *arm* is one method over one file of scored trajectories (so the same estimator can be compared across meters:
``deltattg`` on learned-meter readings and on oracle readings). Every file must hold the same trajectories in the
same order.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deltattg.credit import CreditConfig
from deltattg.credit.records import assign_credit, needs_meter
from deltattg.data.sources import Located
from deltattg.data.trajectory import Trajectory, action_texts
from deltattg.data.jsonl import finite_or_null
from deltattg.errors import InputError

STEP_CLASSES = ("progress", "neutral", "regress")
CLASS_COLORS = {"progress": "#55a868", "neutral": "#8c8c8c", "regress": "#c44e52", None: "#4c72b0"}


@dataclass(frozen=True)
class CreditArm:
    """One column of the comparison: ``method`` run over ``items`` (scored trajectories), shown as ``label``."""

    label: str
    method: str
    items: Sequence[Located]


def step_classes(distances: Sequence[int]) -> list[str]:
    """progress / neutral / regress of each step t = 0..T−1 from the distances d_0..d_T."""
    return ["progress" if b < a else "neutral" if b == a else "regress" for a, b in zip(distances, distances[1:])]


@dataclass(frozen=True)
class Precision:
    """Credit precision of one arm (module doc); shares in [0, 1], NaN where there is no credit of that sign."""

    positive_on_progress: float
    negative_off_progress: float
    positive_trajectories: int
    negative_trajectories: int


def credit_precision(records: Sequence[dict], classes: Sequence[Sequence[str]]) -> Precision:
    """Token-weighted shares of positive credit (Ã_t > 0) on progress steps and of negative credit (Ã_t < 0) on the
    others. For the estimators that scale A_i by w_t ≥ 0 a step's sign is its trajectory's; additive ones (GiGPO,
    HGPO, IGPO) can give a step of an A > 0 trajectory negative credit, and it is counted as such. The trajectory
    counts are by the sign of A_i."""
    hit = {1: 0.0, -1: 0.0}
    total = {1: 0.0, -1: 0.0}
    count = {1: 0, -1: 0}
    for record, steps in zip(records, classes):
        if record["advantage"] != 0:
            count[1 if record["advantage"] > 0 else -1] += 1
        for credit, tokens, kind in zip(record["step_advantages"], record["step_tokens"], steps):
            if credit == 0:
                continue
            sign = 1 if credit > 0 else -1
            total[sign] += abs(credit) * tokens
            hit[sign] += abs(credit) * tokens if (kind == "progress") == (sign > 0) else 0.0
    share = {s: hit[s] / total[s] if total[s] > 0 else float("nan") for s in (1, -1)}
    return Precision(share[1], share[-1], count[1], count[-1])


@dataclass(frozen=True)
class Concentration:
    """How concentrated an arm's credit is within a trajectory, over the trajectories that get any (A ≠ 0). A step's
    *share* is its |Ã_t|·n_t over the trajectory's Σ_s |Ã_s|·n_s.

    ``largest_share_mean`` / ``largest_share_p90``: the mean and 90th percentile of the largest step share (GRPO's is
    the longest action's token share); ``share_entropy``: the mean entropy (nats) of the step shares (GRPO's is the
    token shares' entropy; ln T for T equal steps); ``redistributed``: the mean total-variation distance between the
    step shares and the token shares, ½·Σ_t |share_t − n_t/N_i| — how much of the credit moved away from where GRPO
    puts it (0 for GRPO, 1 at most)."""

    largest_share_mean: float
    largest_share_p90: float
    share_entropy: float
    redistributed: float
    trajectories: int


def credit_concentration(records: Sequence[dict]) -> Concentration:
    """:class:`Concentration` of credit records (``assign_credit``'s: ``step_advantages``, ``step_tokens``), by
    :func:`deltattg.credit.batch.credit_shares`."""
    import numpy as np
    import torch

    from deltattg.credit.batch import credit_shares
    from deltattg.credit.layouts import pad_steps

    if not records:
        return Concentration(*[float("nan")] * 4, 0)  # type: ignore[arg-type]
    advantages, _ = pad_steps([r["step_advantages"] for r in records], torch.float64)
    tokens, _ = pad_steps([r["step_tokens"] for r in records])
    largest, entropy, moved, credited = (x.numpy() for x in credit_shares(advantages, tokens))
    if not credited.any():
        return Concentration(*[float("nan")] * 4, 0)  # type: ignore[arg-type]
    largest = largest[credited]
    return Concentration(float(largest.mean()), float(np.percentile(largest, 90)), float(entropy[credited].mean()),
                         float(moved[credited].mean()), int(credited.sum()))  # fmt: skip


@dataclass
class Inspection:
    """Every arm's credit records, the step classes (with a replaying environment) and each arm's precision."""

    arms: list[str]
    methods: dict[str, str]
    records: dict[str, list[dict]]  # arm -> credit records (``assign_credit``'s), one per trajectory
    classes: list[list[str]] | None = None
    distances: list[list[int]] | None = None
    precision: dict[str, Precision] = field(default_factory=dict)
    concentration: dict[str, Concentration] = field(default_factory=dict)

    def census(self) -> dict[str, int]:
        """How many steps of each class the trajectories hold."""
        return {c: sum(row.count(c) for row in self.classes or []) for c in STEP_CLASSES}


def check_same_trajectories(arms: Sequence[CreditArm]) -> None:
    """Every arm's file holds the same trajectories — ids, and the steps of each — in the same order; the first that
    differs, or has no counterpart, is an ``InputError`` at its file and line."""
    first = arms[0].items
    for arm in arms[1:]:
        for ours, theirs in zip(first, arm.items):
            _check_counterparts(ours, theirs)
        if len(first) != len(arm.items):
            longer, shorter = (first, arm.items) if len(first) > len(arm.items) else (arm.items, first)
            extra = longer[len(shorter)]
            raise InputError(f"has no counterpart: {shorter[-1].path} ends after {len(shorter)} records (the inputs "
                             "must hold the same trajectories in the same order)", path=extra.path, line=extra.line,
                             field="id")  # fmt: skip


def _check_counterparts(ours: Located, theirs: Located) -> None:
    """``theirs`` is the same trajectory as ``ours`` (in the first input): the same id and number of steps."""
    where = f"{ours.path}:{ours.line}"
    if theirs.trajectory.id != ours.trajectory.id:
        raise InputError(f"is {theirs.trajectory.id!r} where {where} holds {ours.trajectory.id!r} (the inputs must "
                         "hold the same trajectories in the same order)", path=theirs.path, line=theirs.line,
                         field="id")  # fmt: skip
    if theirs.trajectory.num_steps != ours.trajectory.num_steps:
        raise InputError(f"trajectory {theirs.trajectory.id!r} has {theirs.trajectory.num_steps} steps here and "
                         f"{ours.trajectory.num_steps} at {where} (the inputs must hold the same trajectories)",
                         path=theirs.path, line=theirs.line, field=_steps_field(theirs.trajectory))  # fmt: skip


def _steps_field(trajectory: Trajectory) -> str:
    """The field that gives the trajectory its steps (``Trajectory.num_steps``'s order)."""
    if trajectory.step_tokens is not None:
        return "step_tokens"
    return "messages" if trajectory.messages is not None else "steps"


def household_distances(items: Sequence[Located]) -> list[list[int]]:
    """d_0..d_T of every trajectory, by replaying it with the household planner."""
    from deltattg.envs.household.progress import replay

    out = []
    for item in items:
        try:
            out.append(replay(item.trajectory).distances())
        except InputError as exc:
            raise exc.located(path=item.path, line=item.line) from None
    return out


def inspect_credit(arms: Sequence[CreditArm], config: CreditConfig, *, env: str | None = None, tokenizer: Any = None) -> Inspection:
    """Credit of every arm; with ``env="household"`` the step classes and each arm's precision."""
    if not arms:
        raise ValueError("nothing to inspect: no arms")
    labels = [arm.label for arm in arms]
    if len(set(labels)) != len(labels):
        raise ValueError(f"the arms' labels must differ (each keys its own column), got {labels}")
    check_same_trajectories(arms)
    records = {arm.label: assign_credit(arm.items, arm.method, config, tokenizer) for arm in arms}
    result = Inspection([a.label for a in arms], {a.label: a.method for a in arms}, records)
    result.concentration = {label: credit_concentration(rows) for label, rows in records.items()}
    if env is not None:
        if env != "household":
            raise ValueError(f"credit precision needs a planner; only --env household has one, not {env!r}")
        result.distances = household_distances(arms[0].items)
        result.classes = [step_classes(d) for d in result.distances]
        result.precision = {label: credit_precision(rows, result.classes) for label, rows in records.items()}
    return result


# ---- the report ------------------------------------------------------------------------------------------------------
def shown_trajectories(records: Sequence[dict], count: int) -> list[int]:
    """Up to ``count`` trajectories to draw: from the first group with both outcomes, successes and failures in turn
    (longest first), then the longest remaining ones."""
    groups: dict[str, list[int]] = {}
    for k, r in enumerate(records):
        groups.setdefault(r["group"], []).append(k)
    mixed = next((ks for ks in groups.values() if len({records[k]["success"] for k in ks}) == 2), [])
    longest = lambda ks: sorted(ks, key=lambda k: (-len(records[k]["step_advantages"]), k))  # noqa: E731
    wins = longest(k for k in mixed if records[k]["success"])
    losses = longest(k for k in mixed if not records[k]["success"])
    picks = [k for pair in itertools.zip_longest(wins, losses) for k in pair if k is not None][:count]
    return (picks + longest(k for k in range(len(records)) if k not in picks))[:count]


def percent(value: float) -> str:
    return "-" if value != value else f"{100 * value:.1f}"


def arm_table(result: Inspection, header: Sequence[str], cells: Any) -> str:
    """A markdown table with one row per arm: its label, method and ``cells(label)``."""
    from deltattg.report import markdown_table

    rows = [[label, result.methods[label], *cells(label)] for label in result.arms]
    return markdown_table(["arm", "method", *header], rows)


def precision_table(result: Inspection) -> str:
    """The markdown precision table (one row per arm)."""
    def cells(label: str) -> list[str]:
        p = result.precision[label]
        return [percent(p.positive_on_progress), percent(p.negative_off_progress),
                f"{p.positive_trajectories} / {p.negative_trajectories}"]

    return arm_table(result, ("positive credit on progress steps %", "negative credit on neutral + regress steps %",
                              "trajectories A > 0 / A < 0"), cells)  # fmt: skip


def concentration_table(result: Inspection) -> str:
    """The markdown concentration table (one row per arm; :class:`Concentration`)."""
    def cells(label: str) -> list[str]:
        c = result.concentration[label]
        return [f"{c.largest_share_mean:.3f}", f"{c.largest_share_p90:.3f}", f"{c.share_entropy:.3f}",
                percent(c.redistributed), str(c.trajectories)]

    return arm_table(result, ("largest step share, mean", "largest step share, p90", "share entropy (nats)",
                              "credit moved from GRPO's places %", "trajectories"), cells)  # fmt: skip


def credit_panels(result: Inspection, shown: Sequence[int]) -> dict[str, Any]:
    """What :func:`credit_png` draws, as plain data (a summary can hold it): the arms, and per shown trajectory its
    outcome, advantage, step classes (None without an environment) and each arm's per-step credit A·w_t."""
    panels = []
    for k in shown:
        record = result.records[result.arms[0]][k]
        panels.append({"success": bool(record["success"]), "advantage": record["advantage"],
                       "classes": result.classes[k] if result.classes else None,
                       "credit": {label: result.records[label][k]["step_advantages"] for label in result.arms}})
    return {"arms": list(result.arms), "panels": panels}


def credit_png(arms: Sequence[str], panels: Sequence[dict]) -> bytes:
    """Per-step credit of the :func:`credit_panels` trajectories (rows) under every arm (columns), bars coloured by
    step class, as PNG bytes."""
    from deltattg.report import figure_png, pyplot

    plt = pyplot()
    rows, cols = len(panels), len(arms)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.2 * rows), squeeze=False, sharey="row")
    classified = any(panel["classes"] for panel in panels)
    for r, panel in enumerate(panels):
        for c, label in enumerate(arms):
            credit = panel["credit"][label]
            kinds = panel["classes"] or [None] * len(credit)
            ax = axes[r][c]
            ax.bar(range(len(credit)), credit, color=[CLASS_COLORS[kind] for kind in kinds])
            ax.axhline(0, color="black", linewidth=0.6)
            ax.set_xticks(range(len(credit)))
            if r == 0:
                ax.set_title(label, fontsize=10)
            if c == 0:
                outcome = "success" if panel["success"] else "failure"
                ax.set_ylabel(f"{outcome}\nA={panel['advantage']:+.2f}", fontsize=8)
            if r == rows - 1:
                ax.set_xlabel("step")
    if classified:
        handles = [plt.Rectangle((0, 0), 1, 1, color=CLASS_COLORS[c]) for c in STEP_CLASSES]
        fig.legend(handles, STEP_CLASSES, loc="upper right", fontsize=8)
    fig.suptitle("per-step credit A·w_t (bars coloured by the planner's step class)" if classified
                 else "per-step credit A·w_t", fontsize=10)  # fmt: skip
    fig.tight_layout()
    return figure_png(fig, dpi=100)


def step_rows(result: Inspection, k: int, actions: Sequence[str]) -> list[dict]:
    """One dict per step of trajectory ``k``: action (its text, "" where the record has no messages), class and
    distance (with an environment), credit per arm."""
    out = []
    for t in range(len(result.records[result.arms[0]][k]["step_advantages"])):
        row: dict[str, Any] = {"step": t, "action": actions[t] if t < len(actions) else ""}
        if result.classes is not None and result.distances is not None:
            row |= {"class": result.classes[k][t], "distance": result.distances[k][t]}
        row["credit"] = {label: result.records[label][k]["step_advantages"][t] for label in result.arms}
        out.append(row)
    return out


def step_table(result: Inspection, k: int, actions: Sequence[str]) -> str:
    """Trajectory ``k``'s id and outcome over its markdown per-step table: action, class and distance (with an
    environment), each arm's credit."""
    from deltattg.report import markdown_cell, markdown_table

    record = result.records[result.arms[0]][k]
    header = ["step", "action", *(["class", "d"] if result.classes else []), *result.arms]
    rows = [[row["step"], row["action"], *([row["class"], row["distance"]] if result.classes else []),
             *(f"{row['credit'][label]:+.3f}" for label in result.arms)] for row in step_rows(result, k, actions)]
    outcome = "success" if record["success"] else "failure"
    return f"**{markdown_cell(record['id'])}** ({outcome})\n\n" + markdown_table(header, rows)


def report_markdown(result: Inspection, shown: Sequence[int], actions: Sequence[Sequence[str]]) -> str:
    """``inspect.md``: the precision table (with an environment), the concentration table and the shown
    trajectories' per-step tables."""
    parts = ["# Credit inspection"]
    if result.precision:
        census = result.census()
        parts += ["## Credit precision (the household planner's step classes)", precision_table(result),
                  f"Steps: {census['progress']} progress, {census['neutral']} neutral, {census['regress']} regress. "
                  "GRPO's row is the uniform baseline: each step's token share."]  # fmt: skip
    parts += ["## Credit concentration", concentration_table(result),
              "A step's share is its |credit|·tokens over its trajectory's; trajectories with A ≠ 0 only."]
    parts += ["## Per-step credit", "![per-step credit](inspect.png)"]
    parts += [step_table(result, k, actions[k]) for k in shown]
    return "\n\n".join(parts) + "\n"


def report_figures(result: Inspection, shown: Sequence[int], actions: Sequence[Sequence[str]]) -> dict:
    """``inspect.json``: the arms, precision, concentration, census and the shown trajectories' steps; a number
    that is not finite (no credit of that sign) is ``null``."""
    figures = {
        "arms": [{"label": label, "method": result.methods[label]} for label in result.arms],
        "precision": {label: asdict(p) for label, p in result.precision.items()},
        "concentration": {label: asdict(c) for label, c in result.concentration.items()},
        "census": result.census() if result.classes else None,
        "shown": [{"id": result.records[result.arms[0]][k]["id"], "steps": step_rows(result, k, actions[k])}
                  for k in shown],  # fmt: skip
    }
    return finite_or_null(figures)


def write_together(files: dict[Path, str | bytes]) -> None:
    """Write every file (text or bytes) atomically and all together: each goes to a temporary file first, and only
    when all of them are written are they moved into place, so a failure anywhere leaves none of them."""
    from deltattg.data.jsonl import atomic_output

    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(atomic_output(path, binary=isinstance(content, bytes))) for path, content in
                   files.items()]  # fmt: skip
        for handle, content in zip(handles, files.values()):
            handle.write(content)


def write_report(result: Inspection, items: Sequence[Located], out: Path, *, show: int = 4) -> str:
    """``inspect.md``, ``inspect.json`` and ``inspect.png`` in folder ``out``; returns the markdown. All three are
    made in memory and then written together (:func:`write_together`): a failure leaves none of them."""
    shown = shown_trajectories(result.records[result.arms[0]], show)
    actions = [action_texts(item.trajectory) for item in items]
    text = report_markdown(result, shown, actions)
    figures = json.dumps(report_figures(result, shown, actions), indent=2, allow_nan=False, default=lambda v: None)
    write_together({out / "inspect.png": credit_png(**credit_panels(result, shown)), out / "inspect.json": figures,
                    out / "inspect.md": text})  # fmt: skip
    return text


def input_labels(paths: Sequence[str]) -> list[str]:
    """A short, distinct name of each input for the arm labels: its file's stem, with as many parent folders as it
    takes to tell it from every other input (``a/scored.jsonl``, ``b/scored.jsonl``: ``a/scored``, ``b/scored``),
    else its whole path; a file named twice is an ``InputError``."""
    options = [_label_options(path) for path in paths]
    labels = []
    for i, own in enumerate(options):
        others = {option for j, row in enumerate(options) if j != i for option in row}
        label = next((option for option in own if option not in others), None)
        if label is None:
            again = next(paths[j] for j, row in enumerate(options) if j != i and row[-1] == own[-1])
            raise InputError(f"is given twice (also as {again}): each input makes its own arms", path=paths[i])
        labels.append(label)
    return labels


def _label_options(path: str) -> list[str]:
    """The names of ``path`` from the shortest (its stem) to the longest (its absolute path)."""
    full = Path(os.path.abspath(path))
    folders = full.parent.parts[1:]  # without the root
    return ["/".join([*folders[len(folders) - depth:], full.stem]) for depth in range(len(folders) + 1)] + [str(full)]


def arms_of(inputs: Sequence[tuple[str, Sequence[Located]]], methods: Sequence[str]) -> list[CreditArm]:
    """One arm per (input, method); a method that reads no meter runs once (on the first input), and labels name the
    input only where there are several (by their names: :func:`input_labels`)."""
    arms = []
    for method in methods:
        sources = inputs if needs_meter(method) else inputs[:1]
        for name, items in sources:
            label = method if len(sources) == 1 else f"{method} [{name}]"
            arms.append(CreditArm(label, method, items))
    return arms
