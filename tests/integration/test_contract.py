"""The contract kit (gasloc_emu.testing) on the five built-in algorithms and on the example
plugin (examples/sparta: the SPARTA algorithm and the mlp-lm model, installed with
``pip install -e examples/sparta``), and what a user sees when a plugin name or setting is wrong.

Each algorithm gets the simulator's checks (determinism, wire kinds, state bytes, churn); the
emulator's run-equals-simulate check runs here for the plugin only. For the built-ins it is
marked slow, since other tests compare run with simulate for them already: gasloc on a matching
(test_launcher.py), gasloc and diloco with churn (test_churn.py), and a2cid2 trains in both
(test_a2cid2_run.py); dsgd and local-gossip are gasloc's gossip with eta = 1, gamma = 0
(test_simulate.py checks the identity). Two small broken algorithms show that the kit fails
what it should.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest
import torch

from gasloc_emu import config as C
from gasloc_emu import plugins
from gasloc_emu.algorithms import OuterAlgorithm, registry
from gasloc_emu.config import ConfigError
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.simulate import simulate
from gasloc_emu.testing import (
    ContractError,
    check_all,
    check_run_equals_simulate,
    check_state_bytes,
    check_wire_kinds,
    contract_config,
    shared_corpus,
)
from gasloc_emu.training.model import count_parameters

pytestmark = pytest.mark.integration

# each built-in with the settings it is checked under (a2cid2: run.rounds counts its steps)
BUILT_IN = {
    "gasloc": {"topology.name": "matching"},
    "diloco": {},
    "dsgd": {"topology.name": "ring"},
    "local-gossip": {"topology.name": "ring"},
    "a2cid2": {"topology.name": "ring", "run.rounds": 6},
}
SPARTA = {"topology.name": "matching", "algo.params.fraction": 0.1}
EXAMPLE = "pip install -e examples/sparta"


def example_installed() -> bool:
    """Registered and importable: an install whose entry points outlived its files is not one."""
    return ("sparta" in plugins.registered(registry.GROUP)
            and "mlp-lm" in plugins.registered("gasloc_emu.models")
            and importlib.util.find_spec("gasloc_sparta") is not None)


needs_example = pytest.mark.skipif(not example_installed(),
                                   reason=f"the example plugin is not installed ({EXAMPLE})")


@pytest.mark.parametrize("algo", sorted(BUILT_IN))
def test_a_built_in_algorithm_keeps_the_contract(tmp_path, algo):
    report = check_all(algo, tmp_path, emulator=False, **BUILT_IN[algo])
    assert report.sent_kinds   # it communicated
    if algo == "a2cid2":       # no rounds for a scenario's events: refused, with its reason
        assert report.churn.startswith("refused: ") and "a2cid2" in report.churn
    else:
        assert report.churn.startswith("took over: ")
    if algo == "diloco":       # its one shared momentum goes to the joiner
        assert report.churn == "took over: outer"


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(BUILT_IN))
def test_a_built_in_algorithm_runs_as_it_simulates(tmp_path, algo):
    """Slow: the default suite compares run with simulate for these already, in
    test_launcher.py's test_run_matches_simulate (gasloc on a matching), test_churn.py's
    test_leave_and_rejoin_run_equals_simulate (gasloc, diloco), test_a2cid2_run.py (a2cid2
    trains in run as in simulate) and test_simulate.py (dsgd and local-gossip are gasloc's
    gossip with eta = 1, gamma = 0, bit for bit)."""
    check_run_equals_simulate(algo, tmp_path, **BUILT_IN[algo])


def test_the_example_plugin_is_installed_where_required():
    """CI installs the example and sets GASLOC_REQUIRE_EXAMPLES=1, so that its tests cannot
    be skipped there without failing."""
    if os.environ.get("GASLOC_REQUIRE_EXAMPLES") == "1":
        assert example_installed(), f"GASLOC_REQUIRE_EXAMPLES=1, but {EXAMPLE} was not run"


@needs_example
def test_sparta_keeps_the_contract_in_run_and_simulate(tmp_path):
    report = check_all("sparta", tmp_path, emulator=True, **SPARTA)
    cfg = contract_config("sparta", **SPARTA)
    numel = count_parameters(cfg.model)
    k = round(0.1 * numel)
    # only the k values travel: one message a worker and round, each k float32
    messages = report.sent_kinds["sparta"]
    assert set(report.sent_kinds) == {"sparta"}
    assert messages == cfg.workers * cfg.run.rounds   # 4 workers, all paired every round
    assert report.simulate["bytes_sent_total"] == report.run["bytes_sent_total"] \
        == messages * k * 4
    assert report.state_bytes == [0] * cfg.workers
    assert report.churn == "took over: parameters only"
    source = report.run["algorithm_source"]
    assert source["package"] == "gasloc-sparta" and source["object"] == \
        "gasloc_sparta.sparta:SPARTA"
    assert source["params"] == {"fraction": 0.1, "seed": 0}


@needs_example
def test_sparta_refuses_a_graph_with_two_neighbours():
    cfg = contract_config("sparta", **{"topology.name": "ring"})
    with pytest.raises(ConfigError, match="one neighbour per round.*--topology matching"):
        build_plan(cfg, data=False)


@needs_example
def test_the_example_model_trains(tmp_path):
    """model.preset = mlp-lm, the example's factory (tokens to logits), under gasloc: the
    evaluated loss falls well below ln(256) = 5.55 and between the first and last round."""
    cfg = C.resolve(overrides={
        "workers": 4, "model.preset": "mlp-lm", "topology.name": "matching",
        "algo.local_steps": 10, "run.rounds": 4, "run.eval_every": 1, "run.dashboard": "off",
        "run.device": "cpu", "data.eval_batches": 2, "data.max_corpus_mb": 0.5,
        "compute.step_time_s": 0.01})
    summary = simulate(build_plan(cfg, corpus=shared_corpus(cfg)), tmp_path / "mlp")
    assert summary["status"] == "ok"
    rows = [json.loads(x) for x in (tmp_path / "mlp" / "metrics.jsonl").read_text().splitlines()]
    first = [r["eval_loss"] for r in rows if r["round"] == 0]
    last = [r["eval_loss"] for r in rows if r["round"] == 3]
    assert sum(last) / len(last) < sum(first) / len(first) - 0.5
    assert summary["final_eval_loss"] < math.log(256) - 1.0, summary["final_eval_loss"]


@pytest.mark.parametrize("args, says", [
    (["--algo", "no_such_pkg:X"], "no_such_pkg"),
    (["--algo", "gasloc", "--set", "algo.params.nope=1"], "algo.params.nope"),
], ids=["unknown-plugin", "unknown-plugin-setting"])
def test_a_wrong_plugin_name_or_setting_is_one_line_and_exit_2(tmp_path, gasloc, args, says):
    out = tmp_path / "run"
    res = gasloc("simulate", *args, "--workers", "4", "--model", "tiny", "--rounds", "1",
                 "--no-dashboard", "--out", str(out), timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr
    assert not out.exists()   # refused before a record exists


class UndeclaredKind(OuterAlgorithm):
    """Gossip that also sends its anchor as "anchor", a kind it does not declare: simulate
    goes through, run's receivers would drop it."""

    name = "undeclared-kind"

    @torch.no_grad()
    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        for j in self.peers(round_idx):
            self.transport.send(j, round_idx, "anchor", self.anchor.clone())
        for j in self.peers(round_idx):
            self.transport.recv(j, round_idx, "anchor")
        self.anchor.copy_(theta)


class UnreportedState(UndeclaredKind):
    """Declares its kind, but keeps a second model-sized buffer that state_bytes leaves out."""

    name = "unreported-state"

    @classmethod
    def wire_kinds(cls, numel: int, params) -> dict[str, tuple[int, ...]]:
        return {"anchor": (numel,)}

    def begin(self, theta: torch.Tensor) -> None:
        super().begin(theta)
        self.spare = theta.detach().clone()


@pytest.mark.parametrize("cls, check, says", [
    (UndeclaredKind, check_wire_kinds, "'anchor' of round 0"),
    (UnreportedState, check_state_bytes, "spare"),
], ids=["undeclared-kind", "unreported-state"])
def test_the_kit_catches_a_broken_contract(tmp_path, cls, check, says):
    with pytest.raises(ContractError, match=says):
        check(f"{__name__}:{cls.__name__}", tmp_path, **{"topology.name": "ring"})
    if cls is UnreportedState:   # and the same algorithm passes what it does keep
        check_wire_kinds(f"{__name__}:{cls.__name__}", tmp_path / "ok", **{"topology.name": "ring"})
