"""The fenced ``bash`` blocks of README.md and docs/: each is either run by a test or marked as not run, with the
reason, on the line right above it:

    <!-- run by: tests/FILE.py::TEST (what of it, where not all) -->
    <!-- not run: REASON -->

A test that runs a block reads its commands from here (:func:`marked_block`), so the page and the test cannot drift
apart."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARK = re.compile(r"^<!-- (run by: (tests/[\w/]+\.py)::(\w+)|not run: .+?)( \(.*\))? -->$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    mark: str  # the marker line above it ("" when there is none)
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def commands(self, program: str = "deltattg") -> list[list[str]]:
        """Each ``program ...`` command of the block as the arguments after the program (continuation lines joined,
        shell comments dropped)."""
        joined = re.sub(r"\\\n\s*", " ", self.text)
        return [words[1:] for line in joined.splitlines() if (words := shlex.split(line, comments=True))
                and words[0] == program]  # fmt: skip


def documentation_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def bash_blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks, k = [], 0
    while k < len(lines):
        if lines[k].startswith("```bash"):
            end = next(j for j in range(k + 1, len(lines)) if lines[j].startswith("```"))
            mark = lines[k - 1].strip() if k and lines[k - 1].startswith("<!--") else ""
            blocks.append(Block(page, k + 1, mark, "\n".join(lines[k + 1 : end])))
            k = end
        k += 1
    return blocks


def marked_block(page: str, test: str) -> Block:
    """The one block of ``page`` (relative to the repository) marked as run by ``test``."""
    found = [b for b in bash_blocks(REPO / page) if (m := MARK.match(b.mark)) and m.group(3) == test]
    assert len(found) == 1, f"{page}: {len(found)} blocks marked as run by {test}"
    return found[0]
