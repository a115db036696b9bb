"""The structure the architecture page promises: imports point one way, with no cycle.

Every import counts, function-local ones too: a cycle held together by an import inside a
function is still a cycle. Read from the source with ``ast``; nothing is imported.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gasloc_emu", "netem")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _targets(mod: str, is_pkg: bool, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level:
        base = base[: len(base) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [f"{prefix}.{a.name}" for a in node.names] + [prefix]


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(mod, path.name == "__init__.py", node):
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != mod and not mod.startswith(target + "."):
                    graph[mod].add(target)
    return graph


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph[node]):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_no_import_cycle():
    graph = import_graph()
    cycles = [c for m in graph if (c := _cycle_from(m, graph))]
    assert not cycles, "import cycle: " + " -> ".join(cycles[0])


@pytest.mark.parametrize("top, above", [("gasloc_emu.app", {"gasloc_emu.cli"}),
                                        ("gasloc_emu.cli", {"gasloc_emu.entry"}),
                                        ("gasloc_emu.entry", set())])
def test_only_the_layer_above_imports_the_command_layer(top, above):
    importers = {m for m, targets in import_graph().items() if top in targets}
    assert importers <= above, importers


def test_the_graph_sees_function_local_imports():
    # app imports launcher only inside run_command: the edge must still be there
    assert "gasloc_emu.launcher" in import_graph()["gasloc_emu.app"]


def test_test_files_have_unique_basenames():
    """pytest imports test modules by basename (no __init__.py under tests/): two files of one
    name in different folders stop the whole collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
