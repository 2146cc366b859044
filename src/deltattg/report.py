"""Human-readable views: the per-step credit table (``deltattg credit --table``), markdown and console tables,
success rates as printed, and PNG figures (matplotlib, Agg, drawn in memory and written atomically) — what
``inspect``, ``guide``, the demo's report and the benchmarks print and draw."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path


def _reading(entry: dict | None) -> str:
    if entry is None:
        return "invalid"
    if "can_complete" in entry:
        return f"ttg {entry['tokens_to_go']:g}" if entry["can_complete"] else "fail"
    if "logit" in entry:
        return f"logit {entry['logit']:+.2f}"
    return f"score {entry['score']:+.2f}"


def credit_table(records: Sequence[dict], max_trajectories: int = 20) -> str:
    """One block per trajectory: its outcome and advantage, then one row per step (tokens, reading, w, Ã; w is "-"
    for additive estimators such as GiGPO, which have no weights)."""
    lines = []
    for record in records[:max_trajectories]:
        outcome = "success" if record["success"] else "failure"
        lines.append(
            f"{record['id']}  group={record['group']}  R={record['reward']:g} ({outcome})  "
            f"A={record['advantage']:+.4f}  credit={record['credit']}"
        )
        lines.append(f"  {'step':>4}  {'tokens':>6}  {'meter reading':>14}  {'weight w':>9}  {'step adv.':>10}")
        steps = len(record["step_advantages"])
        meter = record.get("meter") or [None] * steps
        weights = record.get("step_weights") or [None] * steps
        for t, (n, w, a) in enumerate(zip(record["step_tokens"], weights, record["step_advantages"])):
            reading = _reading(meter[t]) if record.get("meter") is not None else "-"
            weight = "-" if w is None else f"{w:.4f}"
            lines.append(f"  {t:>4}  {n:>6}  {reading:>14}  {weight:>9}  {a:>+10.4f}")
    if len(records) > max_trajectories:
        lines.append(f"... {len(records) - max_trajectories} more trajectories")
    return "\n".join(lines)


def percent(rate: float) -> str:
    """A success rate as the report prints it (percent, one decimal; "-" for none)."""
    return "-" if math.isnan(rate) else f"{100 * rate:.1f}"


def three_decimals(value: float | None, missing: str = "-") -> str:
    """A score (an accuracy, a correlation, a calibration error) as a table prints it: three decimals; ``missing``
    for none (NaN or None: a correlation of constant readings, too few states)."""
    return missing if value is None or math.isnan(value) else f"{value:.3f}"


def spread(value: float, seeds: int, text: str) -> str:
    """A statistic of the spread between seeds (a standard deviation, a power) as ``text``, or what it is without
    one: "n/a (1 seed)" for a single seed, "-" for none otherwise."""
    if not math.isnan(value):
        return text
    return "n/a (1 seed)" if seeds < 2 else "-"


# ---- tables ----------------------------------------------------------------------------------------------------------
def markdown_cell(value: object) -> str:
    """``value`` as the text of one markdown table cell: backslashes and ``|`` escaped (an unescaped ``|`` would
    split the cell) and each line break (``str.splitlines``'s) written ``<br>`` (a raw one would end the row)."""
    text = str(value).replace("\\", "\\\\").replace("|", "\\|")
    return "<br>".join(text.splitlines())


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; every cell through :func:`markdown_cell`."""

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(markdown_cell(c) for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in rows)])


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A console table: columns left-aligned to their widest cell, two spaces apart."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in [header, *rows])


# ---- figures ---------------------------------------------------------------------------------------------------------
def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig, dpi: int) -> bytes:
    """``fig`` drawn as PNG bytes (in memory, so a failed drawing leaves no file); the figure is closed either way."""
    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi)
        return buffer.getvalue()
    finally:
        pyplot().close(fig)


def save_figure(fig, path: Path, dpi: int) -> None:
    """``fig`` as a PNG at ``path``, written atomically (never a half-written picture)."""
    from deltattg.data.jsonl import atomic_output

    picture = figure_png(fig, dpi)
    with atomic_output(path, binary=True) as handle:
        handle.write(picture)


def save_reliability_diagram(calibration: dict, path: Path, title: str = "completion probability") -> None:
    """The reliability diagram of a fitted temperature (``Calibration.as_dict()``): each probability bin's outcome
    rate against its mean p̃, before (σ(logit)) and after (σ(logit / T)) calibration, point size by states, with the
    diagonal of a calibrated meter and both ECEs in the legend."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 4.2))
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1)
    t = calibration["temperature"]
    for key, label, color in (("before", "σ(logit)", "tab:red"), ("after", f"σ(logit / {t:.2f})", "tab:blue")):
        points = calibration[f"bins_{key}"]
        if points:
            ax.plot([b["mean_probability"] for b in points], [b["outcome_rate"] for b in points], color=color,
                    marker="o", linewidth=1, label=f"{label}: ECE {calibration[f'ece_{key}']:.3f}")  # fmt: skip
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="mean predicted p̃ in bin", ylabel="share of states that completed",
           title=f"{title} ({calibration['states']} held-out states)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
