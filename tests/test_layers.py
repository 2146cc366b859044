"""The house's layout as a test: the import graph of ``deltattg``'s packages (every import, the lazy ones inside
functions included) has no cycle, and the low layers (data, credit, meter, envs, rollout, inspection, report) never
import the drivers above them (train, regime, demo, cli); ``bench/`` uses the regime's public modules, not the demo's."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src"
DRIVERS = ("deltattg.train", "deltattg.regime", "deltattg.demo", "deltattg.cli", "deltattg.verl")
LOW = ("deltattg.data", "deltattg.credit", "deltattg.meter", "deltattg.envs", "deltattg.rollout", "deltattg.inspection",
       "deltattg.report", "deltattg.ranks", "deltattg.guidance")


def imported(path: Path) -> set[str]:
    """The ``deltattg`` modules a file imports, anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name == "deltattg" or name.startswith("deltattg.")}


def unit(module: str) -> str:
    """The package (or top-level module) a module belongs to: ``deltattg.meter.fit`` -> ``deltattg.meter``."""
    return ".".join(module.split(".")[:2])


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(SOURCE).with_suffix("").parts).removesuffix(".__init__")


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in (SOURCE / "deltattg").rglob("*.py"):
        source = unit(module_of(path))
        graph[source].update(unit(m) for m in imported(path) if unit(m) not in (source, "deltattg"))
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its nodes in order), or ``None``."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    return next(filter(None, (visit(n) for n in sorted(graph) if n not in state)), None)


def test_the_package_import_graph_has_no_cycle():
    assert cycle(package_graph()) is None


def test_a_cycle_is_found_where_there_is_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_low_layers_never_import_the_drivers_above_them():
    upward = sorted((source, target) for source, targets in package_graph().items() if source.startswith(LOW)
                    for target in targets if target.startswith(DRIVERS))  # fmt: skip
    assert upward == []


def test_the_benchmarks_import_no_demo_internals():
    reached = {(path.name, m) for path in (ROOT / "bench").glob("*.py") for m in imported(path)
               if m.startswith("deltattg.demo")}  # fmt: skip
    assert reached == set()
