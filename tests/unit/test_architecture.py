"""The package-level import graph: acyclic, the hardware below the algorithms, the CLI on top.

Every import of the sources counts, function-level ones included (a deferred import still makes
one package depend on another). Packages are ``insitu.<name>`` (a subpackage or a top-level
module); ``insitu.rtl`` is the RTL. See README.md's map and ../shared/ARCHITECTURE.md's layers.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = {"insitu": ROOT / "host" / "insitu", "insitu.rtl": ROOT / "rtl"}

#: What the accelerator contract and the hardware may import: nothing of the algorithms, the
#: platforms' drivers and twins, the run harness or the CLI. The RTL reads the board files
#: (``insitu.boards``: each FPGA board's clock and accelerator parameters), a description of the
#: hardware that itself imports only the contract and the base (checked below).
HARDWARE_MAY_IMPORT = {
    "accel": {"numerics", "errors"},
    "boards": {"accel", "errors", "io", "resources", "insitu"},
    "rtl": {"accel", "boards", "numerics", "errors", "io", "resources", "insitu"},
}
#: The base every layer may import, which imports no layer above it.
BASE = {"insitu", "errors", "io", "numerics", "resources", "checks"}


def _modules() -> dict[str, Path]:
    out = {}
    for package, root in SOURCE_ROOTS.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if package == "insitu" and parts[0] == "rtl":      # host/insitu/rtl links to rtl/
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")
            if MODULES[module].name != "__init__.py":
                base = base[:-1]
            base = base[:len(base) - node.level + 1]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in MODULES else stem for a in node.names]
    return [n for n in names if n == "insitu" or n.startswith("insitu.")]


def package_of(module: str) -> str:
    parts = module.split(".")
    if parts[:2] == ["insitu", "rtl"]:
        return "rtl"
    return parts[1] if len(parts) > 1 else "insitu"


def _imports() -> list[tuple[str, str, int, ast.ImportFrom | ast.Import]]:
    """(importing module, imported module, line, node) for every insitu import of the sources."""
    out = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.extend((module, target, node.lineno, node) for target in _imported(module, node))
    return out


IMPORTS = _imports()


def package_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the imports (``module:line -> module``) behind the edge."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for module, target, line, _ in IMPORTS:
        a, b = package_of(module), package_of(target)
        if a != b:
            graph[a][b].append(f"{module}:{line} -> {target}")
    return graph


def _cycle(graph) -> list[str] | None:
    """One cycle of the graph as a list of packages, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_package_graph_has_no_cycle():
    graph = package_graph()
    cycle = _cycle(graph)
    if cycle:
        why = [f"{a} -> {b}: {graph[a][b][:3]}" for a, b in zip(cycle, cycle[1:])]
        pytest.fail("import cycle " + " -> ".join(cycle) + "\n" + "\n".join(why))


@pytest.mark.parametrize("package", sorted(HARDWARE_MAY_IMPORT))
def test_the_contract_and_the_hardware_import_no_algorithm_driver_or_cli(package):
    graph = package_graph()
    extra = {b: graph[package][b][:3] for b in graph.get(package, {})
             if b not in HARDWARE_MAY_IMPORT[package]}
    assert not extra, f"insitu.{package} imports {extra}"


def test_the_base_imports_no_layer_above_it():
    graph = package_graph()
    for package in BASE:
        extra = {b: edges[:3] for b, edges in graph.get(package, {}).items() if b not in BASE}
        assert not extra, f"insitu.{package} is a base module but imports {extra}"


def test_only_the_entry_points_import_the_cli():
    users = {module for module, target, _, _ in IMPORTS
             if package_of(target) == "cli" and package_of(module) not in ("cli", "__main__")}
    assert not users, f"the CLI is imported by {sorted(users)}"


def test_no_private_name_is_imported_across_packages():
    reach_ins = set()
    for module, target, line, node in IMPORTS:
        if isinstance(node, ast.ImportFrom) and package_of(module) != package_of(target):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    reach_ins.add(f"{module}:{line} imports {alias.name} from {node.module}")
    assert not reach_ins, "\n".join(sorted(reach_ins))


def test_the_checker_sees_the_sources():
    """A premise of the tests above: the walk finds the packages and their imports."""
    graph = package_graph()
    assert {"accel", "rtl", "tt", "lrt", "cli"} <= set(graph)
    assert "accel" in graph["rtl"] and "numerics" in graph["accel"]


def test_every_package_folder_ships_in_the_wheel():
    """pyproject.toml lists the packages explicitly: a new subpackage must be listed, or the
    installed command fails to import it (the source checkout would not notice)."""
    from insitu.io import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"insitu." + p.parent.name for p in SOURCE_ROOTS["insitu"].glob("*/__init__.py")}
    assert folders - {"insitu.rtl"} <= listed, f"not in pyproject.toml's packages: {sorted(folders - listed)}"
