"""No import cycles among gearshift's modules: the library (libs/gearshift), the services
(gearshift.services) and the training jobs (gearshift.jobs), read statically with ast.

Every import statement counts, at module level, under `if TYPE_CHECKING:` and inside functions
alike: an import moved into a function still means the two modules need each other, it only
defers the failure to the call (orchestration.publishing reached back into its caller that way).
`from a.b import c` depends on a.b.c when that is a module, else on a.b (c is defined there). A
package is not counted as a dependency of the modules under it: Python imports it first in any
case, and a package whose __init__ imports its own modules (a registry) is no cycle unless one
of them takes a name from that __init__. Imports of anything outside gearshift are left out."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

PACKAGES = ("gearshift", "gearshift.services", "gearshift.jobs")  # one import tree, three folders (setup.py)


def modules_under(prefix: str, root: Path) -> dict[str, Path]:
    """Module name -> file for every .py file under root, named as importing it names it."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join((prefix, *parts)).removesuffix(".__init__")] = path
    return modules


def gearshift_modules() -> dict[str, Path]:
    modules = {}
    for prefix in PACKAGES:
        (root,) = importlib.import_module(prefix).__path__
        modules |= modules_under(prefix, Path(root))
    return modules


def import_statements(source: str, package: str) -> list[tuple[str, list[str]]]:
    """(module, names) of each import statement in source: `import a.b` is ("a.b", []),
    `from .x import y` is (package.x, ["y"]), relative ones resolved against package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}".rstrip(".")
            found.append((base, [alias.name for alias in node.names]))
    return found


def dependencies(source: str, package: str, modules: dict[str, Path]) -> set[str]:
    """The modules among `modules` that the import statements in source need."""
    found = set()
    for base, names in import_statements(source, package):
        found.update([f"{base}.{name}" if f"{base}.{name}" in modules else base for name in names] or [base])
    return found & modules.keys()


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules among `modules` it imports (itself left out)."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = dependencies(path.read_text(), package, modules) - {name}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (each one holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def shortest_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, start repeated at the end."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for other in sorted(graph[node] & members):
                if other == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if other not in came_from:
                    came_from[other] = node
                    following.append(other)
        frontier = following
    raise AssertionError(f"{component} holds no cycle through {start}")


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """One line per cycle found, naming it: 'a -> b -> a'."""
    return [" -> ".join(shortest_cycle(graph, component)) for component in strongly_connected(graph)]


def test_no_module_imports_itself_through_others():
    modules = gearshift_modules()
    assert {"gearshift.settings", "gearshift.services.executor.episode", "gearshift.jobs.apo.trainer"} <= modules.keys()
    assert cycles(import_graph(modules)) == []


def planted(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    """The import graph of a package `planted` made of files (name -> source) under tmp_path."""
    package = tmp_path / "planted"
    package.mkdir(exist_ok=True)
    for name, source in ({"__init__.py": ""} | files).items():
        (package / name).write_text(source)
    return import_graph(modules_under("planted", package))


def test_a_planted_cycle_is_found_and_named(tmp_path):
    graph = planted(tmp_path, {
        "first.py": "from planted.second import helper\n",
        "second.py": "def helper():\n    from . import third\n",  # inside a function: still a cycle
        "third.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import planted.first\n",
        "alone.py": "import planted.first\nimport json\n",
    })
    assert cycles(graph) == ["planted.first -> planted.second -> planted.third -> planted.first"]
    assert cycles(planted(tmp_path, {"third.py": "import json\n"})) == []


def test_a_package_that_imports_its_modules_is_a_cycle_only_when_they_take_from_it(tmp_path):
    registry = {"__init__.py": "from planted import one\nfrom planted.base import REGISTRY\n",
                "base.py": "REGISTRY = {}\n"}
    assert cycles(planted(tmp_path, registry | {"one.py": "from . import base\nfrom .base import REGISTRY\n"})) == []
    # The command-group pattern: the package defines a name its own modules import back.
    assert cycles(planted(tmp_path, registry | {"one.py": "from planted import base, REGISTRY\n"})) == [
        "planted -> planted.one -> planted"]
