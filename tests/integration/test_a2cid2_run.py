"""A2CiD2 end to end: simulate and run both train (eval loss falls) and record per-worker steps
and pairings; the simulator is deterministic with nominal step times."""
from __future__ import annotations

import json

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.simulate import simulate
from gasloc_emu.topology import Topology

STEPS = 40


def _cfg(momentum: bool = True) -> C.Config:
    return C.resolve(overrides={
        "workers": 4, "algo.name": "a2cid2", "algo.continuous_momentum": momentum,
        "algo.inner.lr": 0.004, "topology.name": "ring", "run.rounds": STEPS,
        "run.eval_every": 10, "compute.step_time_s": 0.05, "run.dashboard": "off"})


def _evals(run_dir) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step: dict[int, list[float]] = {}
    for r in rows:
        if "eval_loss" in r:
            by_step.setdefault(r["round"], []).append(r["eval_loss"])
    return [sum(v) / len(v) for _, v in sorted(by_step.items())]


def _check_record(summary: dict, run_dir) -> None:
    rec = summary["asynchronous"]
    assert rec["steps"] == [STEPS] * 4
    ring = Topology("ring", 4).possible_edges
    assert rec["exchanges"] > STEPS and set(rec["pairings"]) <= {f"{a}-{b}" for a, b in ring}
    assert 2 * rec["exchanges"] + sum(rec["unpaired"]) == 4 * STEPS
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted((r["worker"], r["round"]) for r in rows) == \
        [(w, k) for w in range(4) for k in range(STEPS)]
    assert all(len(r["peers"]) <= 1 for r in rows)
    evals = _evals(run_dir)
    assert evals[-1] < evals[0] - 0.3 and summary["final_eval_loss"] < evals[0]


def test_simulate_a2cid2_trains_records_and_repeats(tmp_path):
    a = simulate(build_plan(_cfg()), tmp_path / "a")
    _check_record(a, tmp_path / "a")
    assert a["asynchronous"]["eta"] > 0 and a["asynchronous"]["alpha_tilde"] > 0
    b = simulate(build_plan(_cfg()), tmp_path / "b")
    assert b["final_eval_loss"] == a["final_eval_loss"]   # nominal steps: deterministic
    assert b["asynchronous"] == a["asynchronous"]
    off = simulate(build_plan(_cfg(momentum=False)), tmp_path / "off")
    assert off["asynchronous"]["eta"] == 0.0 and off["final_eval_loss"] != a["final_eval_loss"]


def test_run_a2cid2_trains_and_records_steps_and_pairings(tmp_path):
    from gasloc_emu.emulator.launcher import launch
    from gasloc_emu.report.records import new_run_dir
    cfg = _cfg()
    result = launch(build_plan(cfg), new_run_dir(cfg, tmp_path / "r"))
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert result.code == 0 and summary["status"] == "ok", summary.get("error")
    _check_record(summary, tmp_path / "r")
    assert summary["drops"]["total"] == 0
