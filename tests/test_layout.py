"""The kit's import graph: no cycle between its packages, and every arrow points down.

A short AST scan of every module of the kit (imports anywhere in a file, lazy ones too, and the modules the
``kvkit`` command reaches by name). A unit is a top-level package, or one of ``grader``'s folders. The child's
package imports nothing of the kit at all (``tests/test_attacks.py`` checks it too, by its files).
"""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("kvkit", "grader", "catalogue", "solutions", "benchmarks", "exercises")

# Each unit, and the units it may import (directly); anything else is an arrow pointing up or sideways.
ALLOWED = {
    "grader.__main__": {"grader.batch"},  # ``python -m grader``: a face, as kvkit is
    "kvkit": {"grader.batch", "grader.shipped", "grader.stages", "benchmarks", "solutions", "catalogue"},
    "benchmarks": {"grader.batch", "grader.stages", "grader.sandbox", "grader.child", "grader.inprocess",
                   "grader.shipped", "solutions", "catalogue"},
    "grader.batch": {"grader", "grader.stages", "grader.sandbox", "grader.shipped", "catalogue"},
    "grader.stages": {"grader", "grader.sandbox", "grader.child", "grader.shipped", "catalogue", "solutions"},
    "grader.inprocess": {"grader", "grader.stages", "grader.child", "catalogue", "exercises"},  # the op recorder
    "grader.sandbox": {"grader.child"},
    "grader.shipped": {"grader", "solutions", "catalogue"},
    "grader.child": set(),
    "grader": set(),
    "catalogue": set(),
    "solutions": set(),
    "exercises": {"catalogue"},  # the learner's files: their tests read the planted mutants
}


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if module == "grader.__main__":
        return module
    if parts[0] not in PACKAGES:
        return None
    if parts[0] == "grader" and len(parts) > 1 and os.path.isdir(os.path.join(ROOT, "grader", parts[1])):
        return f"grader.{parts[1]}"
    return parts[0]


def _modules():
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__"))]
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    yield rel.removesuffix(".__init__"), path


def imports_of(path: str, module: str) -> set[str]:
    """Every kit module ``path`` imports, at any depth of its code, relative imports resolved."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[:-node.level] if not path.endswith("__init__.py") else \
                    module.split(".")[:len(module.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {f"{base}.{a.name}" for a in node.names} | {base}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and module == "kvkit.cli":
            if node.value.split(".")[0] in PACKAGES and " " not in node.value:
                found.add(node.value)  # the modules the kvkit command imports by name
    return {m for m in found if _unit(m)}


def graph() -> dict[str, set[str]]:
    """``{unit: units it imports}`` over the whole kit."""
    edges: dict[str, set[str]] = {}
    for module, path in _modules():
        unit = _unit(module)
        edges.setdefault(unit, set())
        edges[unit] |= {_unit(m) for m in imports_of(path, module)} - {unit}
    return edges


def _cycle(edges: dict) -> list[str]:
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        stack.pop()
        return []

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_the_kits_packages_import_without_a_cycle():
    edges = graph()
    assert set(edges) <= set(ALLOWED), f"a unit the layout does not name: {sorted(set(edges) - set(ALLOWED))}"
    assert not _cycle(edges), " -> ".join(_cycle(edges))


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_every_arrow_points_down(unit):
    up = graph().get(unit, set()) - ALLOWED[unit]
    assert not up, f"{unit} imports {sorted(up)}, which the layout puts above it or beside it"


def test_nothing_below_the_face_imports_it():
    edges = graph()
    assert not [u for u, to in edges.items() if "kvkit" in to and u != "kvkit"]


def test_the_scan_sees_a_cycle_and_an_upward_arrow():
    """The check can fail: a made-up graph with a cycle is found, and so is a lazy import inside a function."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert not _cycle({"a": {"b"}, "b": {"c"}})
    source = "def f():\n    from kvkit import cli\n    from .criteria import Criterion\n"
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "kvkit_layout_probe.py")
    with open(path, "w") as f:
        f.write(source)
    try:
        assert imports_of(path, "grader.stages.probe") >= {"kvkit.cli", "grader.stages.criteria.Criterion"}
    finally:
        os.remove(path)
