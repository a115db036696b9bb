"""The structure the architecture page promises: imports point one way, with no cycle.

Every import counts, function-local ones too: a cycle held together by an import inside a
function is still a cycle. Read from the source with ``ast``; nothing is imported.
"""
from __future__ import annotations

import ast
import functools
import re
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


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once per session: each rule walks every module, and the
    trees are only read."""
    return ast.parse(path.read_text())


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(_tree(path)):
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


@pytest.mark.parametrize("top, above", [("gasloc_emu.commands.app", {"gasloc_emu.commands.cli"}),
                                        ("gasloc_emu.commands.cli", {"gasloc_emu.commands.entry"}),
                                        ("gasloc_emu.commands.entry", {"gasloc_emu.__main__"})])
def test_only_the_layer_above_imports_the_command_layer(top, above):
    importers = {m for m, targets in import_graph().items() if top in targets}
    assert importers <= above, importers


def test_the_graph_sees_function_local_imports():
    # app imports launcher only inside run_command: the edge must still be there
    assert "gasloc_emu.emulator.launcher" in import_graph()["gasloc_emu.commands.app"]


# The layers of docs/ARCHITECTURE.md, top first: a subpackage (or top-level module) may import
# only those below it, so data flows one way between concerns, not just between modules.
LAYERS = ("__main__", "commands", "experiments", "testing", "cluster", "emulator", "simulator",
          "report", "plan", "netplan", "training", "algorithms", "comm", "scenario", "transport",
          "topology", "plugins", "config", "netem", "params", "exitcodes")


def _layer(module: str) -> str:
    parts = module.split(".")
    return "netem" if parts[0] == "netem" else parts[1]


def test_every_module_has_a_layer():
    assert {_layer(m) for m in import_graph() if m != "gasloc_emu"} <= set(LAYERS)


def test_concerns_import_only_the_layers_below():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = [(m, t) for m, targets in import_graph().items() for t in targets
              if m != "gasloc_emu" and rank[_layer(m)] > rank[_layer(t)]]
    assert upward == []


def test_the_layer_check_sees_an_upward_import(monkeypatch):
    graph = import_graph()
    graph["gasloc_emu.training.worker"].add("gasloc_emu.simulator.simulate")
    monkeypatch.setitem(globals(), "import_graph", lambda: graph)
    with pytest.raises(AssertionError):
        test_concerns_import_only_the_layers_below()


def _sizes():
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            yield f, len(f.read_text().splitlines()), _tree(f)


# Names of a registry's members are compared only inside the registry: elsewhere code asks
# the member what it can do. (module -> the registry it may name members of)
NAME_BRANCH = re.compile(r"\.delay\s*[!=]=\s*[\"']")
REGISTRIES = {"netem/delay.py"}
# a shaper's name compared, or looked up in a literal: `shaper == "tc"`, `shaper in ("auto",`,
# `{"tc": ...}[shaper]`, and the names a request may take
SHAPER_NAMES = "(?:auto|tc|userspace|none)"
SHAPER_BRANCH = re.compile(
    r"shaper\w*\s*(?:[!=]=|(?:not\s+)?in)\s*[(\[{]?\s*[\"']"
    rf"|[\"']{SHAPER_NAMES}[\"']\s*(?:[!=]=|(?:not\s+)?in)\s*[\w.]*shaper"
    rf"|\{{\s*[\"']{SHAPER_NAMES}[\"']\s*:")
SHAPER_REGISTRY = {"netem/shapers.py"}


def _branches(rule: re.Pattern, registry: set[str]) -> list[str]:
    return [f"{f.relative_to(ROOT)}:{i}" for pkg in PACKAGES
            for f in sorted((ROOT / pkg).rglob("*.py"))
            if str(f.relative_to(ROOT)) not in registry
            for i, line in enumerate(f.read_text().splitlines(), 1) if rule.search(line)]


def test_no_delay_mode_name_branches_outside_its_registry():
    hits = _branches(NAME_BRANCH, REGISTRIES)
    assert hits == [], "compare delay modes by what they can do (netem.delay): " + ", ".join(hits)


def test_no_shaper_name_branches_outside_its_registry():
    hits = _branches(SHAPER_BRANCH, SHAPER_REGISTRY)
    assert hits == [], "ask a shaper what it does (netem.shapers): " + ", ".join(hits)


def test_the_name_branch_rule_sees_a_branch():
    assert NAME_BRANCH.search('if decision.delay == "netem":')
    assert not NAME_BRANCH.search("out += decision.delay_mode.port_commands(plan, topo, k)")


@pytest.mark.parametrize("line", ['if decision.shaper == "tc":', "if cfg.net.shaper != 'none':",
                                  'cfg.net.shaper in ("auto", "tc")',
                                  'if "userspace" == network.shaper:',
                                  'return {"tc": "the launcher", "none": "nobody"}[shaper]'])
def test_the_shaper_rule_sees_a_branch(line):
    assert SHAPER_BRANCH.search(line)


@pytest.mark.parametrize("line", ["if decision.shaper_kind.kernel_classes:",
                                  "return network.kind.shapes",
                                  'Decision("tc", "release-queue", why)',
                                  'out = {"shaper": self.shaper, "links": rows}'])
def test_the_shaper_rule_passes_asking_the_shaper(line):
    assert not SHAPER_BRANCH.search(line)


# What a shaper does is its methods (netem.shapers.Shaper): no call site reads the kind traits
# they replaced, and none imports a shaper's own module (the registry loads them by name).
KIND_TRAITS = re.compile(r"\.(?:kernel_classes|paces_in_workers|launcher_changes_links)\b"
                         r"|(?:kind|shaper_kind)\.(?:namespaces|ports_per_sender)\b")


def test_no_call_site_reads_a_shapers_kind_traits():
    hits = _code_lines(KIND_TRAITS, set())
    assert hits == [], "call the shaper's methods (netem.shapers.Shaper): " + ", ".join(hits)


@pytest.mark.parametrize("line", ["if decision.shaper_kind.kernel_classes:",
                                  "    if self.kind.paces_in_workers:",
                                  "return self.kind is not None and self.kind.ports_per_sender",
                                  "if shaping_decision(cfg).shaper_kind.namespaces:"])
def test_the_trait_rule_sees_a_trait(line):
    assert KIND_TRAITS.search(line)


def test_the_trait_rule_passes_a_method_call():
    assert not KIND_TRAITS.search("shaping_decision(cfg).shaper_kind.before_launch(argv)")
    assert not KIND_TRAITS.search("return self.host.ports_per_sender")


def test_only_the_registry_names_a_shapers_module():
    mods = {"netem.shaper_tc", "netem.shaper_userspace", "netem.shaper_none"}
    assert mods <= set(import_graph())
    importers = {m for m, targets in import_graph().items() if targets & mods}
    assert importers == set(), importers


def test_the_config_offers_the_shaper_requests_of_the_registry_not_a_copy():
    from gasloc_emu import config
    from netem import shapers
    assert config.SHAPERS is shapers.REQUESTS


def test_test_files_have_unique_basenames():
    """pytest imports test modules by basename (no __init__.py under tests/): two files of one
    name in different folders stop the whole collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


# The round protocol is written once (training/rounds.py) and an algorithm's kind is read in
# one place (training/drivers.py): the runners host the protocol and ask the drive.
ROUND_PROTOCOL = re.compile(r"\.run_round\(|\.donate\(")
KIND_QUESTION = re.compile(r"\bhas_rounds\b|\.driver\b\s*(?:[!=]=|(?:not\s+)?in)|DRIVES\[")


def _code_lines(rule: re.Pattern, allowed: set[str]) -> list[str]:
    hits = []
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(f.relative_to(ROOT))
            if rel in allowed:
                continue
            for i, line in enumerate(f.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if rule.search(code) and not code.lstrip().startswith(('"', "'")):
                    hits.append(f"{rel}:{i}")
    return hits


def test_the_round_protocol_is_driven_from_one_place():
    hits = _code_lines(ROUND_PROTOCOL, {"gasloc_emu/training/rounds.py",
                                        "gasloc_emu/training/worker.py"})
    assert hits == [], "drive rounds with training.rounds.RoundDriver: " + ", ".join(hits)


def test_only_the_drive_registry_asks_which_kind_an_algorithm_is():
    hits = _code_lines(KIND_QUESTION, {"gasloc_emu/training/drivers.py"})
    assert hits == [], "ask the algorithm's drive (training.drivers): " + ", ".join(hits)


@pytest.mark.parametrize("line", ["if plan.algo.has_rounds:", "    stats = w.run_round(t)",
                                  'if algo.driver == "pairwise":', "d = DRIVES[cls.driver]"])
def test_the_protocol_rules_see_a_second_copy(line):
    assert ROUND_PROTOCOL.search(line) or KIND_QUESTION.search(line)


# Imports between concerns, counted as the pairs of layers of which one imports the other: a
# ratchet, lowered as concerns are untangled and never raised to let a new import through (ask
# whether the thing imported belongs lower, or the importer higher).
MAX_LAYER_PAIRS = 90


def layer_pairs(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(_layer(m), _layer(t)) for m, targets in graph.items() for t in targets
            if m != "gasloc_emu" and _layer(m) != _layer(t)}


def test_imports_between_concerns_do_not_grow():
    pairs = layer_pairs(import_graph())
    assert len(pairs) <= MAX_LAYER_PAIRS, (
        f"{len(pairs)} pairs of layers import one another, at most {MAX_LAYER_PAIRS}: "
        + ", ".join(f"{a}->{b}" for a, b in sorted(pairs)))


def test_the_ratchet_counts_a_new_pair():
    graph = import_graph()
    before = len(layer_pairs(graph))
    graph["gasloc_emu.params"].add("gasloc_emu.exitcodes")   # a pair no module makes today
    assert len(layer_pairs(graph)) == before + 1
