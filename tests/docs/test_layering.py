"""The package's layering: its imports, read from the source, form no circle, between files or
between the groups of the layout (a top-level file, or a top-level folder with all it holds)."""

import ast
import graphlib
import os

from tests.support import ROOT

PACKAGE = os.path.join(ROOT, "specjax")


def _modules() -> dict[str, str]:
    """Every module of the package by dotted name, to its file."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: str, modules: dict[str, str]) -> set[str]:
    """The package's modules a file imports anywhere in it (at the top, inside a function,
    under TYPE_CHECKING): an import deferred to a call is still a dependency."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # a submodule taken from its package, or a name
                submodule = f"{node.module}.{alias.name}"
                named.add(submodule if submodule in modules else node.module)
    return {name for name in named if name in modules and name != "specjax"}


def _group(module: str) -> str:
    """The layout's group of a module: specjax.decoding.shapes.chain -> specjax.decoding."""
    return ".".join(module.split(".")[:2])


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        return error.args[1]
    return None


def test_no_import_circle_between_files_or_groups():
    """Catches an import circle, even one hidden in an import deferred to a call (ModelConfig
    checking layer kinds against `nn.layer_kinds`, whose modules take ModelConfig; the exit
    report drawing itself with `plots`), and an upward import between groups (the CPU kernels
    importing the offline tools for a timer; checkpoints importing the entry points' error)."""
    modules = _modules()
    files = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert _cycle(files) is None, f"import circle: {' -> '.join(_cycle(files))}"
    groups: dict[str, set[str]] = {}
    for name, imported in files.items():
        groups.setdefault(_group(name), set()).update(
            _group(other) for other in imported if _group(other) != _group(name))
    assert _cycle(groups) is None, f"groups import each other: {' -> '.join(_cycle(groups))}"


def _group_graph() -> dict[str, set[str]]:
    """Each group's short name (`decoding`, `model`) to the groups it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        short = _group(name).removeprefix("specjax").lstrip(".")
        graph.setdefault(short, set()).update(
            _group(other).split(".")[-1] for other in _imports(path, modules)
            if _group(other) != _group(name))
    return graph


def _design_picture() -> tuple[list[tuple[str, set[str]]], set[str]]:
    """docs/design.md's picture of the layers: its rows top to bottom (group, the groups it
    shows that group importing) and the shared pieces named below them."""
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        text = f.read()
    block = text.split("## The package's layers", 1)[1].split("```")[1]
    _, rows, shared = block.split("─" * 94)
    picture = []
    for line in rows.strip().splitlines():
        name, _, imported = line.partition("→")
        picture.append((name.split()[0].removesuffix("/").removesuffix(".py"),
                        set(imported.split())))
    names = shared.split(":", 1)[1].split("(", 1)[0].split()
    return picture, set(names)


def test_design_picture_of_the_layers_matches_the_imports():
    """Catches docs/design.md's picture of the layers drifting from the code: a group that
    imports a group the picture does not show it importing, or no longer imports one it
    shows, a row importing a row above it, a group missing from the picture, or a shared
    piece importing anything but shared pieces."""
    graph = _group_graph()
    picture, shared = _design_picture()
    shown = [name for name, _ in picture]
    assert set(graph) - {""} == set(shown) | shared, "groups missing from or extra in design.md"
    for row, (name, imported) in enumerate(picture):
        assert imported == graph[name] - shared, f"design.md: {name} imports {graph[name] - shared}"
        assert imported <= set(shown[row + 1:]), f"design.md: {name} is drawn below an import"
    for name in shared:
        assert graph[name] <= shared, f"{name} imports {graph[name] - shared}: not a shared piece"
