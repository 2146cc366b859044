"""Benchmark and demo summaries: what was measured, as JSON a documentation table can be generated from.

A summary holds its name, the command line, the code revision, the machine (CPU model, cores, load, torch, ATen CPU
capability, Python), the date and its tables (``{"columns": [...], "rows": [[...], ...]}``, cells as printed).
``bench/summary.py`` turns the summaries committed under ``docs/results/`` into the docs' results tables.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """What a measurement depends on: the CPU model and cores, how busy they were (the 1-minute load average when the
    summary was written), torch and its ATen CPU capability, Python."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")]  # fmt: skip
        cpu = models[0] if models else cpu
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load": round(os.getloadavg()[0], 1), "torch": torch.__version__,
            "aten_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version()}  # fmt: skip


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, list]:
    """A summary's table: its column names and rows of printed cells."""
    if any(len(row) != len(columns) for row in rows):
        raise ValueError(f"every row needs {len(columns)} cells")
    return {"columns": list(columns), "rows": [[str(cell) for cell in row] for row in rows]}


def write_summary(path: str | os.PathLike, name: str, argv: Sequence[str], tables: dict[str, dict]) -> None:
    """Write the summary of benchmark ``name`` run as ``argv`` (whole, or not at all)."""
    from deltattg.data.jsonl import atomic_output
    from deltattg.train.checkpoint import code_revision

    summary = {"name": name, "command": shlex.join(argv), "commit": code_revision(), "machine": machine(),
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "tables": tables}  # fmt: skip
    with atomic_output(path) as handle:
        json.dump(summary, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
