"""Benchmark and demo summaries: what was measured, as JSON a documentation table can be generated from.

A summary holds its name, the command line, the code revision, the machine (CPU model, cores, load, torch, ATen CPU
capability, Python; or, for a report drawn from runs, the machines its runs' stamps name, with their seeds), the date,
its tables (``{"columns": [...], "rows": [[...], ...]}``, cells as printed) and the data of its figures.
``bench/summary.py`` turns the summaries committed under ``docs/results/`` into the docs' results tables and figures.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def run_deltattg(argv: Sequence[str], log: str | os.PathLike | None = None) -> float:
    """Run ``deltattg ARGV`` with this Python, as a benchmark runs the user's commands; returns its wall time in
    seconds. Its output is appended to ``log`` (after a ``$ deltattg ...`` line) or kept in memory; a command that
    fails stops the benchmark (``SystemExit`` naming it, with the end of its output or the log to read)."""
    command = [sys.executable, "-m", "deltattg", *argv]
    start = time.perf_counter()
    if log is None:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        code, tail = done.returncode, done.stderr[-2000:]
    else:
        with open(log, "a") as out:
            out.write("$ deltattg " + shlex.join(argv) + "\n")
            out.flush()
            code = subprocess.call(command, stdout=out, stderr=out)
            out.write(f"[{time.perf_counter() - start:.0f} s, exit {code}]\n")
        tail = f"see {log}"
    if code != 0:
        raise SystemExit(f"`deltattg {shlex.join(argv)}` exited {code}:\n{tail}")
    return time.perf_counter() - start


def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``), or what :mod:`platform` says where that cannot be read."""
    try:
        models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")]  # fmt: skip
    except OSError:
        models = []
    return models[0] if models else platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """What a measurement depends on: the CPU model and cores, how busy they were (the 1-minute load average when the
    summary was written), torch and its ATen CPU capability, Python."""
    import torch

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "load": round(os.getloadavg()[0], 1),
            "torch": torch.__version__, "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version()}  # fmt: skip


def seed_spans(seeds: Sequence[int]) -> str:
    """Seeds as runs of consecutive numbers: ``[200, 201, 202, 216]`` -> ``"seeds 200–202, 216"``."""
    spans: list[list[int]] = []
    for seed in sorted(seeds):
        if spans and seed == spans[-1][-1] + 1:
            spans[-1].append(seed)
        else:
            spans.append([seed])
    text = ", ".join(f"{span[0]}–{span[-1]}" if len(span) > 1 else str(span[0]) for span in spans)
    return ("seeds " if len(seeds) > 1 else "seed ") + text


def machine_text(box: dict[str, Any]) -> str:
    """Where a summary's figures were measured, in words: this machine (:func:`machine`), or, for a report drawn from
    runs (``{"runs": [{"cpu", "aten_capability", "torch", "seeds"}, ...]}``), which seeds ran on which machine."""
    if "runs" in box:
        return "; ".join(f"{seed_spans(run['seeds'])} on {run['cpu']} (torch {run['torch']}, {run['aten_capability']})"
                         for run in box["runs"])  # fmt: skip
    return (f"{box['cpu']}, {box['cores']} cores (load {box['load']}), torch {box['torch']} "
            f"({box['aten_capability']})")


Table = tuple[Sequence[str], Sequence[Sequence[Any]]]  # a benchmark's table: column names, rows of cells


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, list]:
    """A summary's table: its column names and rows of printed cells."""
    if any(len(row) != len(columns) for row in rows):
        raise ValueError(f"every row needs {len(columns)} cells")
    return {"columns": list(columns), "rows": [[str(cell) for cell in row] for row in rows]}


FIGURE_KINDS = {  # a summary figure's kind -> the function (module, name) that draws its data as PNG bytes
    "seed_curves": ("deltattg.regime.comparison", "seed_curves_png"),  # bench_train: success over steps and seeds
    "credit": ("deltattg.inspection", "credit_png"),  # inspect / the demo: per-step credit of a few trajectories
    "training_success": ("deltattg.demo.report", "success_png"),  # the demo: success over steps and tokens
}


def figure_png(figure: dict[str, Any]) -> bytes:
    """A summary's figure (``{"kind": K, **data}``) drawn by its kind's function (:data:`FIGURE_KINDS`)."""
    import importlib

    data = dict(figure)
    kind = data.pop("kind", None)
    if kind not in FIGURE_KINDS:
        raise ValueError(f"figure kind {kind!r}: expected one of {', '.join(FIGURE_KINDS)}")
    module, function = FIGURE_KINDS[kind]
    return getattr(importlib.import_module(module), function)(**data)


def finite(value: object) -> object:
    """``value`` with every non-finite number written as JSON can read it (NaN: null; ±∞: the strings "inf" and
    "-inf") and every other object as itself or its string."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def write_summary(path: str | os.PathLike, name: str, argv: Sequence[str], tables: dict[str, Table],
                  figures: dict[str, dict] | None = None, measured_on: dict[str, Any] | None = None,
                  records: dict[str, list[dict]] | None = None) -> None:
    """Write the summary of benchmark ``name`` run as ``argv`` (whole, or not at all): its tables (name → (columns,
    rows)), the data of its figures (each ``{"kind": K, **data}``, drawn by :func:`figure_png`), lists of records
    for programs to read (``records``: name → list, each a top-level key, e.g. ``meters``) and where they were
    measured: ``measured_on`` (see :func:`machine_text`) for figures read from runs made elsewhere, else this
    machine."""
    from deltattg.data.jsonl import atomic_output
    from deltattg.train.checkpoint import code_revision

    summary = {"name": name, "command": shlex.join(argv), "commit": code_revision(),
               "machine": measured_on or machine(),
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
               "tables": {name: table(*columns_rows) for name, columns_rows in tables.items()},
               "figures": figures or {}, **finite(records or {})}  # fmt: skip
    with atomic_output(path) as handle:
        json.dump(summary, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
