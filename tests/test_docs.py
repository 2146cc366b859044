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


# ---- pointers from the code, the scripts and the --help texts to the README's sections and the docs pages ----------
README_POINTER = re.compile(r"(?:\bsee\s+(?:the\s+)?|\()README\b(?!\.md)|\bREADME(?:'s|’s)\s|\bREADME\s+says\b")
NAMED_HEADING = re.compile(r"""^[^).;]*?(?:["“'‘]([^"”'’]+)["”'’]|(?:^|\s)(\w[\w ]*?)\s+section\b)""")
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/([\w/.-]+?\.md)(?:#([\w-]+))?")


def headings(page: Path) -> set[str]:
    """The texts of a Markdown page's headings, lower case (fenced code left out)."""
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
    return {m.group(1).strip().lower() for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)}


def unresolved_pointers(where: str, text: str) -> list[str]:
    """The pointers of ``text`` that point at nothing: a README pointer ("see the README", "(README)", "the README's
    X", "the README says so under X") that names no heading of README.md — a heading is named quoted or as "X
    section" — and a ``docs/PAGE.md[#anchor]`` path to no page or to no heading of it."""
    readme = headings(REPO / "README.md")
    broken = []
    for m in README_POINTER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        named = NAMED_HEADING.match(text[m.end():m.end() + 120])
        heading = named and (named.group(1) or named.group(2)).strip()
        if not heading:
            broken.append(f"{where}:{line}: {m.group(0).strip()!r} names no heading of README.md")
        elif heading.lower() not in readme:
            broken.append(f"{where}:{line}: README.md has no heading {heading!r}")
    for m in DOCS_PATH.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        page, anchor = REPO / "docs" / m.group(1), m.group(2)
        if not page.is_file():
            broken.append(f"{where}:{line}: {m.group(0)}: no such page")
        elif anchor and anchor not in anchors(page):
            broken.append(f"{where}:{line}: {m.group(0)}: {page.name} has no heading with that anchor")
    return broken


def pointing_texts() -> dict[str, str]:
    """What may point at the README or a docs page: the package's and the scripts' sources, the docs pages, the
    recipes, and every command's --help."""
    files = [*(REPO / "src" / "deltattg").rglob("*.py"), *(REPO / "bench").rglob("*.py"),
             *(REPO / "bench").rglob("*.md"), *(REPO / "docs").rglob("*.md"),
             *(path for path in (REPO / "recipes").rglob("*") if path.is_file())]
    texts = {str(path.relative_to(REPO)): path.read_text(encoding="utf-8") for path in sorted(files)}
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    return texts | {f"deltattg {name} --help": command.format_help() for name, command in commands.items()}


def test_every_pointer_at_a_readme_section_or_a_docs_page_resolves(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per help text: a path is never wrapped
    broken = [why for where, text in pointing_texts().items() for why in unresolved_pointers(where, text)]
    assert not broken, "\n".join(broken)


def test_a_pointer_at_nothing_is_caught():
    text = ('"""Its defaults (see the README); the README\'s "Results"; the README says so under "Progress meter";\n'
            "the README's Commands section; (README); docs/benchmarks.md#the-household-rl-regime; docs/gone.md;\n"
            'docs/verl.md#nowhere; bench/README.md; README.md."""')  # fmt: skip
    assert [why.split(": ", 1)[1] for why in unresolved_pointers("x.py", text)] == [
        "'see the README' names no heading of README.md",
        "README.md has no heading 'Progress meter'",
        "'(README' names no heading of README.md",
        "docs/gone.md: no such page",
        "docs/verl.md#nowhere: verl.md has no heading with that anchor",
    ]


# ---- the paper's models, named once in code (deltattg.train.config) and the same in the docs, recipe and --help ----
MODEL_ID = re.compile(r"(?:Qwen/)?Qwen3-4B-Instruct-2507|Qwen/[\w.-]*\w")
ROLE = re.compile(r"\b(actor|meter)\b")


def misnamed_models(where: str, text: str, role: str | None = None) -> list[str]:
    """Each Qwen model ``text`` names that is not the paper's model for the role it is named for: the last "actor" or
    "meter" in the 80 characters before it (else ``role``, the role of the whole text)."""
    from deltattg.train.config import PAPER_ACTOR_MODEL, PAPER_METER_MODEL

    paper = {"actor": PAPER_ACTOR_MODEL, "meter": PAPER_METER_MODEL}
    wrong = []
    for m in MODEL_ID.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        said = ROLE.findall(text[max(0, m.start() - 80):m.start()])
        named_for = said[-1] if said else role
        model = m.group(0) if m.group(0).startswith("Qwen/") else f"Qwen/{m.group(0)}"
        if named_for is None:
            wrong.append(f"{where}:{line}: {m.group(0)} is named for no role: say 'actor' or 'meter' before it")
        elif model != paper[named_for]:
            wrong.append(f"{where}:{line}: {m.group(0)} as the {named_for}; the paper's is {paper[named_for]}")
    return wrong


def test_the_docs_the_recipe_the_presets_and_the_help_name_the_papers_models():
    """The paper fine-tunes Qwen3-4B as the actor and starts each meter from Qwen3-4B-Instruct-2507."""
    from deltattg.train.config import PAPER_ACTOR_MODEL, PRESETS

    recipe = (REPO / "recipes" / "verl" / "train.sh").read_text()
    assert re.search(r"(?m)^MODEL=\$\{MODEL:-(.+)\}$", recipe).group(1) == PAPER_ACTOR_MODEL  # type: ignore[union-attr]
    actors = {name: preset["actor"]["model"] for name, preset in PRESETS.items()}
    gpu_presets = {name: model for name, model in actors.items() if model != "tiny"}
    assert gpu_presets == dict.fromkeys(("alfworld", "papersearchqa", "awm"), PAPER_ACTOR_MODEL)
    comments = "\n".join(line for line in recipe.splitlines() if line.startswith("#"))
    wrong = misnamed_models("recipes/verl/train.sh", comments)
    for page in documentation_pages():
        wrong += misnamed_models(str(page.relative_to(REPO)), page.read_text())
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, command in commands.items():
        role = ROLE.search(name)
        wrong += misnamed_models(f"deltattg {name} --help", command.format_help(), role and role.group(1))
    assert not wrong, "\n".join(wrong)
    assert misnamed_models("x.md", "the actor `Qwen/Qwen3-4B-Instruct-2507`; a meter from Qwen3-4B-Instruct-2507; "
                           "`Qwen/Qwen3-4B`") == [  # fmt: skip
        "x.md:1: Qwen/Qwen3-4B-Instruct-2507 as the actor; the paper's is Qwen/Qwen3-4B",
        "x.md:1: Qwen/Qwen3-4B as the meter; the paper's is Qwen/Qwen3-4B-Instruct-2507",
    ]


# ---- what robust DeltaTTG is recommended over ------------------------------------------------------------------------
RECOMMENDED = re.compile(r"(?<!-)\brecommended\b(?!\**\s+over\s)", re.IGNORECASE)  # an anchor is a name too


def test_recommended_always_says_over_what():
    """The evidence recommends ``deltattg_robust`` over the paper's ``deltattg`` with a learned meter, not over GRPO
    (docs/benchmarks.md): wherever it is called recommended — the pages' text (a heading is a name), ``deltattg
    methods`` — the next word is "over"."""
    from deltattg.credit import available_estimators, get_estimator

    texts = {str(page.relative_to(REPO)): re.sub(r"(?m)^#{1,6} .*$", "", page.read_text())
             for page in documentation_pages()}
    texts |= {f"deltattg methods: {name}": get_estimator(name).summary for name in available_estimators()}
    vague = [f"{where}: …{text[max(0, m.start() - 40):m.end() + 30]}…" for where, text in texts.items()
             for m in RECOMMENDED.finditer(text)]  # fmt: skip
    assert not vague, "\n".join(vague)
    assert "recommended over" in get_estimator("deltattg_robust").summary
