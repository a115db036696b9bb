"""Algorithms carry their traits, and the run plan alone derives the run.

Read from the source with ``ast`` (nothing imported for the structure checks): no module
outside ``algorithms/`` decides anything by an algorithm's name, and nothing but the run plan
builds a graph, a world, a link plan or the compute models. Then the one path by which
``algo.name`` becomes a class, for built-ins and plugins alike, and its refusals.
"""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from gasloc_emu import algorithms
from gasloc_emu import config as C
from gasloc_emu.algorithms import OuterAlgorithm, gossip
from gasloc_emu.config import to_toml
from gasloc_emu.plan import build_plan

ROOT = Path(__file__).resolve().parents[2]
NAMES = set(C.ALGORITHMS)


def _sources() -> dict[str, ast.Module]:
    out = {}
    for pkg in ("gasloc_emu", "netem"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            out[str(f.relative_to(ROOT))] = ast.parse(f.read_text())
    return out


def _names_compared(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each comparison against a built-in algorithm's name."""
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            hits += [(node.lineno, it.value) for it in items
                     if isinstance(it, ast.Constant) and it.value in NAMES]
    return hits


def test_no_module_outside_algorithms_compares_an_algorithm_name():
    found = {path: hits for path, tree in _sources().items()
             if not path.startswith("gasloc_emu/algorithms/")
             and (hits := _names_compared(tree))}
    assert found == {}, f"decides by an algorithm's name (use a trait): {found}"


def test_the_name_check_sees_a_comparison():
    """The check above finds what it looks for (a check that finds nothing proves nothing)."""
    tree = ast.parse("if cfg.algo.name in ('x', 'diloco'):\n    pass\nok = a == 'gasloc'\n")
    assert _names_compared(tree) == [(1, "diloco"), (3, "gasloc")]


# what may build each part of a run, as (file, enclosing function); the topo command draws a
# graph of its own flags, not a run's
BUILDERS = {
    "build_link_plan": {("gasloc_emu/netplan.py", "check_network")},
    "check_network": {("gasloc_emu/plan.py", "build_plan")},
    "sim_link_model": {("gasloc_emu/plan.py", "build_plan")},
    "world_from_config": {("gasloc_emu/plan.py", "build_plan")},
    "from_config": {("gasloc_emu/plan.py", "build_plan")},
    "World": {("gasloc_emu/scenario/world.py", "from_config")},
    "Topology": {("gasloc_emu/topology.py", "from_config"),
                 ("gasloc_emu/commands/app.py", "topo_command")},
    "ComputeModel": {("gasloc_emu/training/compute.py", "plan")},
    "ComputePlan": {("gasloc_emu/training/compute.py", "plan")},
}


def _calls(tree: ast.Module) -> list[tuple[str, str]]:
    """(called name, enclosing top-level or method function) of every call in a module."""
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                out.append((name, fn.name))
    return out


def test_only_the_plan_builds_graph_world_links_and_compute():
    bad = []
    for path, tree in _sources().items():
        for name, where in _calls(tree):
            allowed = BUILDERS.get(name)
            if allowed is not None and (path, where) not in allowed and \
                    not (name == "compute.plan" and path == "gasloc_emu/plan.py"):
                bad.append(f"{path}:{where} calls {name}")
    plan_calls = [where for name, where in _calls(_sources()["gasloc_emu/plan.py"])
                  if name == "plan"]
    assert plan_calls == ["build_plan"]   # compute.plan, from the plan alone
    assert bad == []


# ---------------------------------------------------------------- the registry and plugins

@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    """A plugin's settings: checked like a config section."""

    share: float = C.setting(0.5, "A fraction.", lo=0.0, hi=1.0)
    label: str = C.setting("a", "A word.", choices=("a", "b"))


class Probe(OuterAlgorithm):
    """A plugin in a test module: plain gossip with settings and a trait of its own."""

    name = "probe"
    Settings = ProbeSettings
    shows = ("eta",)
    default_local_steps = 3

    @classmethod
    def constants(cls, acfg, topo):
        return {"eta": 0.25}

    @torch.no_grad()
    def outer_step(self, round_idx, theta):
        gossip(self.transport, self.topology, self.rank, round_idx, theta.clone(), theta)


def _plan(**overrides):
    return build_plan(C.resolve(overrides={"workers": 4} | overrides), data=False)


def test_built_ins_come_through_the_entry_point_group():
    assert set(algorithms.known()) >= NAMES
    assert {algorithms.load(n).name for n in NAMES} == NAMES
    assert algorithms.load("gasloc") is algorithms.GASLoC


def test_a_plugin_by_path_carries_its_settings_and_traits():
    plan = _plan(**{"algo.name": "test_traits:Probe", "algo.params": {"share": 0.25}})
    assert plan.algo is Probe and plan.algorithm.params == ProbeSettings(share=0.25)
    assert plan.compute.fixed_steps == (3,) * 4 and plan.constants() == {"eta": 0.25}
    assert plan.run_label() == "probe-ring"
    record = plan.algorithm.record()
    assert record["object"] == "test_traits:Probe" and record["params"]["share"] == 0.25


@pytest.mark.parametrize("overrides, needle", [
    ({"algo.name": "no_such_pkg:X"}, "algo.name = 'no_such_pkg:X': module 'no_such_pkg' did "
                                     "not import"),
    ({"algo.name": "nonesuch"}, "algo.name = 'nonesuch' is not known; expected one of a2cid2"),
    ({"algo.name": "test_traits:Nope"}, "module 'test_traits' has no 'Nope'"),
    ({"algo.name": "test_traits:ProbeSettings"}, "not a subclass of"),
    ({"algo.name": "test_traits:Probe", "algo.params": {"nope": 1}},
     "unknown setting algo.params.nope; known in this section: label, share"),
    ({"algo.name": "test_traits:Probe", "algo.params": {"share": 2.0}},
     "algo.params.share = 2.0 is out of range"),
    ({"algo.name": "gasloc", "algo.params": {"x": 1}}, "unknown setting algo.params.x"),
    ({"model.preset": "huge"}, "model.preset = 'huge' is not known; expected one of tiny"),
    ({"algo.name": "dsgd", "algo.outer_lr": "1-momentum"},
     "algo.outer_lr = '1-momentum' is not allowed for dsgd"),
])
def test_what_does_not_resolve_is_one_line(overrides, needle):
    with pytest.raises(C.ConfigError) as info:
        _plan(**overrides)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_plugin_settings_round_trip_through_the_record_toml(tmp_path):
    cfg = C.resolve(sets=["algo.name=test_traits:Probe", "algo.params.share=0.75"])
    (tmp_path / "c.toml").write_text(to_toml(cfg))
    again = C.resolve(tmp_path / "c.toml")
    assert again == cfg and hash(again) == hash(cfg)
    assert dict(again.algo.params) == {"share": 0.75}
