"""Benchmark summaries, and the results tables of the docs generated from them.

A benchmark given ``--summary FILE`` (and the demo, always) writes what it measured as JSON
(:mod:`deltattg.summaries`: the command, commit, machine, date, tables and figures' data). The summaries the docs cite
are committed under ``docs/results/``; in README.md and docs/, a table between ``<!-- results: NAME/TABLE -->`` and
``<!-- /results -->`` is generated from ``docs/results/NAME.json``, with a line saying where it was measured, and
figure FIGURE of that summary is drawn to ``docs/images/NAME-FIGURE.png``:

    .venv/bin/python bench/summary.py            # rewrite every generated table and figure from the summaries
    .venv/bin/python bench/summary.py --check    # exit 1, naming them, when a table differs or a figure is missing
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deltattg.summaries import figure_png, machine_text

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"
IMAGES = REPO / "docs" / "images"
BLOCK = re.compile(r"(<!-- results: ([\w-]+)/([\w-]+) -->\n)(.*?)(<!-- /results -->)", re.S)


def render(summary: dict[str, Any], name: str) -> str:
    """Table ``name`` of a summary as Markdown, and where it was measured."""
    data = summary["tables"][name]
    lines = ["| " + " | ".join(data["columns"]) + " |", "|" + "---|" * len(data["columns"])]
    lines += ["| " + " | ".join(row) + " |" for row in data["rows"]]
    commit = str(summary["commit"] or "unknown revision")
    commit = commit[:12] + ("+dirty" if "+dirty" in commit else "")  # uncommitted changes: said, not hidden
    where = machine_text(summary["machine"])
    lines += ["", f"<sub>`{summary['command']}` at {commit}, {summary['date']}; {where}.</sub>", ""]
    return "\n".join(lines)


def regenerated(text: str, results: Path = RESULTS) -> str:
    """``text`` with every generated table rewritten from its summary (``KeyError`` / ``OSError`` naming a missing
    one)."""

    def fill(match: re.Match) -> str:
        summary = json.loads((results / f"{match.group(2)}.json").read_text())
        return match.group(1) + "\n" + render(summary, match.group(3)) + match.group(5)

    return BLOCK.sub(fill, text)


def figure_files(results: Path = RESULTS, images: Path = IMAGES) -> dict[Path, dict[str, Any]]:
    """Every figure of the summaries under ``results``, by the file it is drawn to."""
    files = {}
    for path in sorted(results.glob("*.json")):
        for name, figure in json.loads(path.read_text()).get("figures", {}).items():
            files[images / f"{path.stem}-{name}.png"] = figure
    return files


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
    for path, figure in figure_files().items():
        if args.check:
            stale += [] if path.is_file() else [str(path.relative_to(REPO))]
        else:
            path.write_bytes(figure_png(figure))
    verb = "differ from their summaries (or are missing)" if args.check else "rewritten"
    print(f"{', '.join(stale)}: {verb}" if stale else "every generated table matches its summary", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
