"""The package's layering: arrows point down.

Every import statement of every module under src/gradcomp is read with `ast`: at module level, inside
functions and methods (lazy imports) and under `if TYPE_CHECKING:` alike, with relative forms resolved. An
edge A -> B means module A names module B in an import (`from P import name` is an edge to the module
P.name where that is a module of the package, else to P). Not edges: the parent packages that Python imports
on the way (importing gradcomp.ops.stats runs gradcomp/ops/__init__.py), and `importlib.import_module` with a
computed name (the registry's stage lookups in gradcomp.experiments.base, the PEP 562 exports of
gradcomp/__init__.py).

The rules: kernels never import ops (what a kernel shares with its op lives in a module below both, as
`block_format`, `luq_format`, `nm_format` and `lognormal`'s `Calibration` do); the theory depends only on
formats, specs and the fit, never on the policies or what applies them; and no import cycle anywhere.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SOURCE / "gradcomp"

# (importing package, imported module or package it must not reach, why)
THEORY = "the theory depends only on formats, specs and the fit"
FORBIDDEN = [
    ("gradcomp.kernels", "gradcomp.ops", "kernels sit below their ops"),
    (
        "gradcomp.theory",
        "gradcomp.training.compress",
        THEORY,
    ),
    (
        "gradcomp.theory",
        "gradcomp.training.policies",
        THEORY,
    ),
    ("gradcomp.theory", "gradcomp.ops", THEORY),
    (
        "gradcomp.theory",
        "gradcomp.training.attachment",
        THEORY,
    ),
    (
        "gradcomp.theory",
        "gradcomp.training.noise_monitor",
        THEORY,
    ),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, source: str, is_package: bool, modules: set[str]) -> Iterator[tuple[str, int]]:
    """(imported gradcomp module, line) of every import statement in `source`, the module `name`."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "gradcomp" or alias.name.startswith("gradcomp."):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level > len(parts):
                    raise ValueError(f"{name}:{node.lineno}: relative import beyond the top package")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target != "gradcomp" and not target.startswith("gradcomp."):
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                yield (submodule if submodule in modules else target), node.lineno


def _edges() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, gradcomp's modules only, no self-edges."""
    names = set(MODULES)
    graph: dict[str, dict[str, int]] = {}
    for name, path in MODULES.items():
        edges: dict[str, int] = {}
        for target, line in _imports(name, path.read_text(), path.name == "__init__.py", names):
            if target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


EDGES = _edges()


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(SOURCE.parent)}:{line}"


def test_the_import_reader_sees_lazy_relative_and_type_checking_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import formats\n"
        "from .. import lognormal\n"
        "from .stats import fit\n"
        "if TYPE_CHECKING:\n"
        "    import gradcomp.training.policies\n"
        "def f():\n"
        "    from gradcomp.kernels.luq import quantize_luq_triton\n"
    )
    modules = {"gradcomp.lognormal", "gradcomp.ops.formats", "gradcomp.ops.stats", "gradcomp.kernels.luq"}
    found = sorted(_imports("gradcomp.ops.luq", source, False, modules))
    assert found == [
        ("gradcomp.kernels.luq", 8),
        ("gradcomp.lognormal", 3),
        ("gradcomp.ops.formats", 2),
        ("gradcomp.ops.stats", 4),
        ("gradcomp.training.policies", 6),
    ]
    # and on the package itself: the ops' kernel imports are lazy, inside their functions
    assert "gradcomp.kernels.luq" in EDGES["gradcomp.ops.luq"]
    assert len(MODULES) > 50 and "gradcomp.theory.noise" in MODULES


@pytest.mark.parametrize(("importer", "imported", "why"), FORBIDDEN)
def test_forbidden_imports(importer, imported, why):
    offending = [
        f"{source} -> {target} ({_where(source, line)})"
        for source, edges in EDGES.items()
        if _within(source, importer)
        for target, line in edges.items()
        if _within(target, imported)
    ]
    assert not offending, f"{importer} must not import {imported} ({why}): " + "; ".join(offending)


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c in graph), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _cycle_path(component: list[str], graph: dict[str, dict[str, int]]) -> list[tuple[str, str]]:
    """One shortest cycle through the component's first module, as its edges."""
    start = component[0]
    parents: dict[str, str | None] = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in graph[node]:
            if target == start:
                path = [node]
                while (parent := parents[path[-1]]) is not None:
                    path.append(parent)
                return list(itertools.pairwise([*reversed(path), start]))
            if target in component and target not in parents:
                parents[target] = node
                queue.append(target)
    raise AssertionError(f"no cycle through {start}")


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {"d": 1}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycle_path(["a", "b", "c"], graph) == [("a", "b"), ("b", "c"), ("c", "a")]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_cycles():
    cycles = [_cycle_path(component, EDGES) for component in _cycles(EDGES)]
    assert not cycles, "import cycles: " + " | ".join(
        "; ".join(f"{a} -> {b} ({_where(a, EDGES[a][b])})" for a, b in cycle) for cycle in cycles
    )


def test_the_top_level_holds_a_few_modules():
    """The training side, the formats, the ops and kernels, the theory and the pipeline's stages each live in
    a package of their own; what is left at the top is what they all share."""
    modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(modules) <= 14, modules
