"""The package's layering, as docs/architecture.md writes it down: every import (module- or function-level) goes to
the importer's own room or to a room of a lower layer; rooms of one layer do not import each other, except the
foundation's modules (layer 1), which import nothing of the package but each other. No import cycle either."""

import ast
import graphlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "albert_dist"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


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


def written_layers(text: str) -> dict[str, int]:
    """Room → layer from the numbered list under docs/architecture.md's "## Layers" heading: `N. room room …`,
    bottom first, each room a package folder or a root module (the words in backticks)."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for number, rooms in re.findall(r"^(\d+)\. (.*)$", section, flags=re.M):
        for room in re.findall(r"`([\w.]+)`", rooms):
            layers[room] = int(number)
    return layers


def room(module: str) -> str:
    return module.split(".")[1]


def violations(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every import that goes up a layer or across rooms of one layer (above the foundation)."""
    found = []
    for importer, imported in graph.items():
        if importer == "albert_dist":  # the package's `__init__`: the API's names, above every layer
            continue
        for target in imported:
            here, there = room(importer), room(target)
            if here == there:
                continue
            if layers[there] > layers[here] or (layers[there] == layers[here] and layers[here] != 1):
                found.append(
                    f"{importer} (layer {layers[here]}, {here}) imports {target} (layer {layers[there]}, {there})"
                )
    return sorted(found)


def test_every_room_has_a_written_layer():
    layers = written_layers(ARCHITECTURE.read_text())
    rooms = {room(name) for name in modules() if name != "albert_dist"}
    assert rooms - set(layers) == set(), "rooms missing from docs/architecture.md's layers"
    assert set(layers) - rooms == set(), "layers naming rooms that do not exist"


def test_nothing_imports_upward_or_across_a_layer():
    graph = import_graph()
    assert len(graph) > 40 and sum(map(len, graph.values())) > 100  # the walk found the package's imports
    assert violations(graph, written_layers(ARCHITECTURE.read_text())) == []


def test_an_upward_import_is_caught():
    """The check sees an import the data layer makes of pretraining, and one of fine-tuning by its sibling."""
    graph = import_graph()
    graph["albert_dist.data.loading"].add("albert_dist.pretrain.job")
    graph["albert_dist.pretrain.job"].add("albert_dist.finetune.data")
    assert violations(graph, written_layers(ARCHITECTURE.read_text())) == [
        "albert_dist.data.loading (layer 5, data) imports albert_dist.pretrain.job (layer 8, pretrain)",
        "albert_dist.pretrain.job (layer 8, pretrain) imports albert_dist.finetune.data (layer 8, finetune)",
    ]


def test_the_package_has_no_import_cycle():
    try:
        tuple(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as err:
        raise AssertionError(f"import cycle: {' -> '.join(err.args[1])}") from None
