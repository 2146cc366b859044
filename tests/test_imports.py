"""No import circle among deltattg's modules: a module that needs another's code imports it, and never back.

A circle works only as long as one side's import stays inside a function, and breaks the day someone moves it to the
top (or a third module imports the two in the other order). The graph below counts every ``deltattg`` import of a
module, at its top or inside its functions, except those under ``if TYPE_CHECKING:`` (never run). Read from the
source with :mod:`ast`: nothing is imported to draw it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import deltattg

SOURCE = Path(deltattg.__file__).parent


def module_name(path: Path) -> str:
    """The dotted name of a source file under ``SOURCE`` (a package's ``__init__.py`` is the package)."""
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking(node: ast.If) -> bool:
    """Whether an ``if`` is ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): its imports never run."""
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def run_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module that can run: at its top, in functions and classes, not under
    ``if TYPE_CHECKING:``."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and is_type_checking(node):
            todo += node.orelse
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        todo += ast.iter_child_nodes(node)
    return found


def imported_modules(node: ast.Import | ast.ImportFrom, modules: set[str]) -> set[str]:
    """The ``deltattg`` modules an import statement loads: ``from package import submodule`` loads the submodule,
    ``from module import name`` the module."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules
    if node.level or node.module not in modules:
        assert not node.level, "deltattg imports are absolute"
        return set()
    return {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names}


def import_graph() -> dict[str, set[str]]:
    """``deltattg`` module → the ``deltattg`` modules it imports (itself left out)."""
    files = {module_name(p): p for p in SOURCE.rglob("*.py")}
    modules = set(files)
    return {
        name: {m for node in run_imports(ast.parse(path.read_text(), str(path))) for m in imported_modules(node, modules)}
        - {name}
        for name, path in files.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Circles of ``graph`` (``a → b → … → a``) met by a depth-first search: at least one wherever there is any, so
    the list is empty exactly when the graph has none."""
    found, done = [], set()

    def visit(name: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(name, ())):
            if nxt in path:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    return found


def test_deltattg_has_no_import_circle():
    assert circles(import_graph()) == []


def test_the_package_graph_is_read():
    """The walker sees imports at the top, inside functions, and of submodules by ``from package import``."""
    graph = import_graph()
    assert "deltattg.meter.regression" in graph["deltattg.meter.train_regression"]  # top of the module
    assert "deltattg.hf" in graph["deltattg.meter.regression"]  # inside methods only
    assert "deltattg.meter.train_regression" in graph["deltattg.cli.meter"]  # inside a function
    assert "deltattg.train.config" in graph["deltattg.train.trainer"]  # a submodule, from its package


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []
