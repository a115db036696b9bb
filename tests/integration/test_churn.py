"""Workers that leave and join by a scenario: training goes on, and run equals simulate."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BASE = ["--workers", "4", "--model", "tiny", "--local-steps", "2", "--rounds", "6", "--seed", "2",
        "--topology", "ring", "--no-dashboard", "--set", "data.max_corpus_mb=0.5",
        "--set", "data.eval_batches=1", "--set", "run.failure_detect_s=0.5"]
CHURN = """
[[event]]
type = "leave"
round = 2
worker = 2

[[event]]
type = "join"
round = 4
worker = 2
"""


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=timeout)


def losses(run_dir: Path) -> dict[tuple[int, int], float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {(r["round"], r["worker"]): r["train_loss"] for r in rows}


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("algo", ["gasloc", "diloco"])
def test_leave_and_rejoin_run_equals_simulate(tmp_path, algo):
    scenario = tmp_path / "churn.toml"
    scenario.write_text(CHURN)
    runs = {}
    for mode in ("simulate", "run"):
        out = tmp_path / mode
        res = cli(mode, *BASE, "--algo", algo, "--scenario", str(scenario), "--out", str(out))
        assert res.returncode == 0, res.stderr
        runs[mode] = out
    sim, emu = losses(runs["simulate"]), losses(runs["run"])
    absent = {(t, 2) for t in (2, 3)}
    assert set(sim) == {(t, w) for t in range(6) for w in range(4)} - absent
    assert set(emu) == set(sim)
    assert max(abs(sim[k] - emu[k]) for k in sim) <= 1e-5
    s_sim, s_emu = summary(runs["simulate"]), summary(runs["run"])
    assert s_emu["status"] == "ok"
    assert abs(s_sim["final_eval_loss"] - s_emu["final_eval_loss"]) <= 1e-5
    assert s_emu["membership"]["changes"] == [{"type": "leave", "worker": 2, "round": 2},
                                               {"type": "join", "worker": 2, "round": 4}]
    events = [json.loads(line) for line in
              (runs["run"] / "events.jsonl").read_text().splitlines()]
    assert [(e["type"], e["round"], e["worker"]) for e in events] == [("leave", 2, 2),
                                                                     ("join", 4, 2)]
    first, last = sim[(0, 0)], sim[(5, 0)]
    assert math.isfinite(last) and last < first  # training went on through the churn
    if algo == "diloco":   # the joiner took over the donor's momentum: one model, to the bit
        assert s_sim["consensus_distance"] == s_emu["consensus_distance"] == 0.0


def test_a_departure_fails_the_run_when_told_to(tmp_path):
    scenario = tmp_path / "leave.toml"
    scenario.write_text(CHURN.split("[[event]]\ntype = \"join\"")[0])
    res = cli("run", *BASE, "--scenario", str(scenario), "--set", "run.on_worker_loss=fail",
              "--out", str(tmp_path / "run"))
    assert res.returncode != 0
    assert "worker 2" in res.stderr and "round 2" in res.stderr


def test_bad_scenario_is_refused_before_anything_runs(tmp_path):
    scenario = tmp_path / "bad.toml"
    scenario.write_text("[[event]]\ntype = \"leave\"\nround = 3\nworker = 9\n")
    res = cli("run", *BASE, "--scenario", str(scenario), "--out", str(tmp_path / "run"))
    assert res.returncode == 2
    assert "worker 9" in res.stderr
    assert not (tmp_path / "run").exists()
