"""Benchmark summaries, and the results tables of the docs generated from them.

A benchmark given ``--summary FILE`` writes what it measured as JSON (:func:`write_summary`): its name, the command
line, the code revision, the machine (CPU model, cores, torch version, ATen CPU capability), the date and its
tables (``{"columns": [...], "rows": [[...], ...]}``, cells as printed). The summaries the docs cite are committed under
``docs/results/``; in README.md and docs/, a table between ``<!-- results: NAME/TABLE -->`` and
``<!-- /results -->`` is generated from ``docs/results/NAME.json``, with a line saying where it was measured:

    .venv/bin/python bench/summary.py            # rewrite every generated table from the committed summaries
    .venv/bin/python bench/summary.py --check    # exit 1, naming them, when a table differs (tests/test_docs.py)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"
BLOCK = re.compile(r"(<!-- results: ([\w-]+)/([\w-]+) -->\n)(.*?)(<!-- /results -->)", re.S)


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


def render(summary: dict[str, Any], name: str) -> str:
    """Table ``name`` of a summary as Markdown, and where it was measured."""
    data = summary["tables"][name]
    lines = ["| " + " | ".join(data["columns"]) + " |", "|" + "---|" * len(data["columns"])]
    lines += ["| " + " | ".join(row) + " |" for row in data["rows"]]
    box = summary["machine"]
    commit = str(summary["commit"] or "unknown revision")[:12]
    lines += ["", f"<sub>`{summary['command']}` at {commit}, {summary['date']}; {box['cpu']}, {box['cores']} cores "
                  f"(load {box['load']}), torch {box['torch']} ({box['aten_capability']}).</sub>", ""]  # fmt: skip
    return "\n".join(lines)


def regenerated(text: str, results: Path = RESULTS) -> str:
    """``text`` with every generated table rewritten from its summary (``KeyError`` / ``OSError`` naming a missing
    one)."""

    def fill(match: re.Match) -> str:
        summary = json.loads((results / f"{match.group(2)}.json").read_text())
        return match.group(1) + "\n" + render(summary, match.group(3)) + match.group(5)

    return BLOCK.sub(fill, text)


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which tables differ from their summaries")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = regenerated(text)
        if new != text:
            stale.append(str(page.relative_to(REPO)))
            if not args.check:
                page.write_text(new, encoding="utf-8")
    verb = "differ from their summaries" if args.check else "rewritten"
    print(f"{', '.join(stale)}: {verb}" if stale else "every generated table matches its summary", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
