"""The package's layering: no import cycle (module- or function-level imports alike), and the bottom modules import
nothing of the package but each other."""

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "albert_dist"
BOTTOM = {"albert_dist.errors", "albert_dist.console", "albert_dist.storage", "albert_dist.redaction"}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of other modules of the package (a package's `__init__` is transparent: importing
    `albert_dist.model` counts as importing what it names)."""
    mods = modules()
    graph = {name: set() for name in mods}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                parts = name.split(".")[: len(name.split(".")) - node.level + is_package] if node.level else []
                base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name and mods[target].name != "__init__.py":
                    graph[name].add(target)
    return graph


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 40 and sum(map(len, graph.values())) > 100  # the walk found the package's imports
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        raise AssertionError(f"import cycle: {' -> '.join(err.args[1])}") from None


def test_the_bottom_modules_import_nothing_above_them():
    graph = import_graph()
    assert {name: graph[name] - BOTTOM for name in BOTTOM} == {name: set() for name in BOTTOM}
