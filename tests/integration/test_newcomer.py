"""A new worker joins: an id whose first scenario event is a join is absent from the start,
then enters from a donor's parameters and trains to the end; run equals simulate."""
from __future__ import annotations

import json

import pytest

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.simulate import simulate

SCENARIO = """
[[event]]
type = "join"
worker = 4
round = 3

[[event]]
type = "leave"
worker = 1
round = 5
"""


def _cfg(tmp_path, algo: str, topology: str) -> C.Config:
    (tmp_path / "s.toml").write_text(SCENARIO)
    return C.resolve(overrides={
        "workers": 5, "algo.name": algo, "topology.name": topology, "algo.local_steps": 3,
        "run.rounds": 8, "run.eval_every": 4, "run.scenario": str(tmp_path / "s.toml"),
        "run.dashboard": "off", "run.failure_detect_s": 0.2})


def _rounds_of(run_dir, worker: int) -> list[int]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sorted(r["round"] for r in rows if r["worker"] == worker)


def _check(summary: dict, run_dir) -> None:
    assert summary["status"] == "ok"
    assert _rounds_of(run_dir, 4) == list(range(3, 8))      # absent until its join
    assert _rounds_of(run_dir, 1) == list(range(5))
    m = summary["membership"]
    assert m["new_workers"] == [4] and m["alive_at_end"] == [0, 2, 3, 4]
    joins = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()
             if json.loads(x)["type"] == "join"]
    assert [(e["worker"], e["round"]) for e in joins] == [(4, 3)]


@pytest.mark.parametrize(("algo", "topology"), [("gasloc", "ring"), ("diloco", "ring")])
def test_a_new_worker_joins_in_simulate(tmp_path, algo, topology):
    cfg = _cfg(tmp_path, algo, topology)
    summary = simulate(build_plan(cfg), tmp_path / "sim")
    _check(summary, tmp_path / "sim")


@pytest.mark.slow  # the CI suite's budget: the simulate tests above run in it
def test_a_new_worker_joins_in_run_as_in_simulate(tmp_path):
    """Covered in the default suite by test_a_new_worker_joins_in_simulate (the same join) and
    tests/integration/test_churn.py (workers leaving and joining in run as in simulate)."""
    from gasloc_emu.emulator.launcher import launch
    from gasloc_emu.report.records import new_run_dir
    cfg = _cfg(tmp_path, "gasloc", "ring")
    sim = simulate(build_plan(cfg), tmp_path / "sim")
    result = launch(build_plan(cfg), new_run_dir(cfg, tmp_path / "run"))
    run = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert result.code == 0
    _check(run, tmp_path / "run")
    assert abs(run["final_eval_loss"] - sim["final_eval_loss"]) <= 1e-5
