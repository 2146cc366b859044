"""The documentation: the site builds with --strict (a broken link or anchor fails), README stays short and its links
resolve, every command's --help names a page that exists, every bash block is run by a test or says why not
(``pytest tests/test_docs.py -v -k bash_block`` lists them)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import bench_script
from docblocks import MARK, bash_blocks, documentation_pages

from deltattg.cli import DOC_PAGES, build_parser

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, as the site (and GitHub) make them."""
    from pymdownx.slugs import slugify

    slug = slugify(case="lower")
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
    return {slug(m.group(1), "-") for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)}


def check_link(source: Path, target: str) -> str | None:
    """Why a relative link of ``source`` does not resolve (None when it does)."""
    if re.match(r"^[a-z]+:", target):
        return None
    path, _, anchor = target.partition("#")
    page = (source.parent / path).resolve() if path else source
    if not page.exists():
        return f"{target}: no such file"
    if anchor and page.suffix == ".md" and anchor not in anchors(page):
        return f"{target}: {page.name} has no heading with that anchor"
    return None


def test_the_readme_is_short_and_its_links_resolve():
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) <= README_MAX_LINES
    broken = [why for target in LINK.findall(readme.read_text()) if (why := check_link(readme, target))]
    assert not broken


def test_every_commands_help_names_a_page_of_the_docs():
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) == set(DOC_PAGES)
    docs = REPO / "docs"
    broken = [f"{name}: {why}" for name, page in DOC_PAGES.items() if (why := check_link(docs / "index.md", page))]
    assert not broken
    assert all(f"docs/{DOC_PAGES[name]}" in command.format_help() for name, command in commands.items())


@pytest.mark.slow  # ~10 s: the whole site with the API reference
def test_the_site_builds_with_strict_checks(tmp_path):
    pytest.importorskip("mkdocs", reason="the documentation needs the [docs] extra")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "credit" / "index.html").is_file()


BLOCKS = [block for page in documentation_pages() for block in bash_blocks(page)]


def block_id(block) -> str:
    kind = "run" if block.mark.startswith("<!-- run by:") else "not-run" if block.mark else "unmarked"
    return f"{block.where}:{kind}"


@pytest.mark.parametrize("block", BLOCKS, ids=block_id)
def test_every_bash_block_is_run_by_a_test_or_marked(block):
    mark = MARK.match(block.mark)
    assert mark, f"{block.where}: put '<!-- run by: tests/FILE.py::TEST -->' or '<!-- not run: REASON -->' above it"
    if mark.group(2):  # run by: the test exists and reads this very block
        source = (REPO / mark.group(2)).read_text()
        assert re.search(rf"(?m)^def {mark.group(3)}\(", source), f"{block.where}: no test {mark.group(3)}"
        assert f'marked_block("{block.page.relative_to(REPO)}"' in source, f"{block.where}: {mark.group(2)} does not read it"


@functools.cache
def summary_module():
    """bench/summary.py (the results tables' generator), imported once as the benchmarks import it."""
    return bench_script("summary")


def test_every_generated_results_table_matches_its_committed_summary():
    summary = summary_module()
    stale = [str(page.relative_to(REPO)) for page in summary.pages()
             if summary.regenerated(page.read_text(encoding="utf-8")) != page.read_text(encoding="utf-8")]  # fmt: skip
    assert not stale, f"regenerate them: .venv/bin/python bench/summary.py ({', '.join(stale)})"


def test_a_changed_number_in_a_generated_table_is_caught(tmp_path):
    summary = summary_module()
    (tmp_path / "bench_x.json").write_text(json.dumps({
        "name": "bench_x", "command": "bench/bench_x.py", "commit": "0123456789abcdef", "date": "2026-12-03",
        "machine": {"cpu": "CPU", "cores": 2, "load": 0.5, "torch": "2.13.0", "aten_capability": "AVX2"},
        "tables": {"t": {"columns": ["arm", "final"], "rows": [["grpo", "41.0"]]}}}))  # fmt: skip
    page = summary.regenerated("x\n<!-- results: bench_x/t -->\n<!-- /results -->\ny\n", tmp_path)
    assert "| grpo | 41.0 |" in page and "`bench/bench_x.py` at 0123456789ab" in page
    assert summary.regenerated(page, tmp_path) == page  # regeneration is stable ...
    tampered = page.replace("41.0", "44.0")
    assert summary.regenerated(tampered, tmp_path) == page != tampered  # ... and undoes a hand-edited number


def test_every_summary_figure_is_committed_and_drawn_from_its_summary():
    """Each figure a committed summary holds is an image under docs/images/ (bench/summary.py draws it there), and
    its data still draw: a PNG from the function its kind names."""
    from deltattg.summaries import figure_png

    summary = summary_module()
    files = summary.figure_files()
    kinds = {figure["kind"] for figure in files.values()}
    assert {"seed_curves", "credit", "training_success"} <= kinds, kinds
    for path, figure in files.items():
        assert path.is_file(), f"{path.relative_to(REPO)} missing: .venv/bin/python bench/summary.py"
        assert figure_png(figure).startswith(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ValueError, match="figure kind 'pie'"):
        figure_png({"kind": "pie"})


# Tables of settings (not measurements) that a test checks against the code they describe, by page and test.
CHECKED_AGAINST_CODE = {
    "docs/verl.md": "tests/verl_plugin/test_verl_plugin.py::test_the_launch_recipe_composes_with_verls_config",
}
MEASURED_CELL = re.compile(r"\|\s*\**[-+−]?\d+\.\d+")  # a cell that starts with a decimal number


def hand_typed_measured_rows(text: str) -> list[str]:
    """Table rows outside the generated blocks with a cell that starts with a decimal number (a measurement or a
    setting; descriptions that mention numbers, versions or sections do not start with one)."""
    summary = summary_module()
    outside = summary.BLOCK.sub("", text)
    return [line for line in outside.splitlines() if line.startswith("|") and MEASURED_CELL.search(line)]


def test_every_measured_table_is_generated_from_a_summary():
    """A table of measured numbers is generated (a results block), so a changed number fails the test above."""
    summary = summary_module()
    typed = {}
    for page in summary.pages():
        name = str(page.relative_to(REPO))
        rows = hand_typed_measured_rows(page.read_text(encoding="utf-8"))
        if rows and name not in CHECKED_AGAINST_CODE:
            typed[name] = rows[:2]
    assert not typed, f"measured tables typed by hand (generate them from a summary): {typed}"
    for name, test in CHECKED_AGAINST_CODE.items():
        path, function = test.split("::")
        assert f"def {function}(" in (REPO / path).read_text(), f"{name}: its checking test {test} is gone"
    table = "| arm | final |\n|---|---|\n| grpo | **41.0** [35.2, 47.1] |\n| `pos` | Eq. 21, ρ = 0.2, torch 2.13.0 |\n"
    assert hand_typed_measured_rows(table) == ["| grpo | **41.0** [35.2, 47.1] |"]


def test_the_equations_page_names_functions_that_exist():
    """docs/concepts/equations.md points at the code of each equation: every dotted name there resolves."""
    import importlib

    names = re.findall(r"`(deltattg(?:\.\w+)+)", (REPO / "docs" / "concepts" / "equations.md").read_text())
    assert len(names) > 15
    for name in names:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                target = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attribute in parts[cut:]:
                target = getattr(target, attribute)
            break
        else:
            pytest.fail(f"{name}: no such module")
