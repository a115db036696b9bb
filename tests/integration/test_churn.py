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


REJOIN = """
[[event]]
type = "leave"
round = 3
worker = 2

[[event]]
type = "join"
round = 5
worker = 2
{source}
"""


def steps(run_dir: Path) -> dict[tuple[int, int], int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {(r["round"], r["worker"]): r["step"] for r in rows}


def test_a_worker_rejoins_from_its_last_checkpoint_and_run_equals_simulate(tmp_path):
    """Worker 2 checkpoints at rounds 1 (and would at 3, but leaves before it), is away for
    rounds 3 and 4 and rejoins at 5 from its own state of round 1: its step counter goes on
    from there, not from 0 as a donor's joiner's does, and run equals simulate."""
    runs = {}
    # the donor's joiner only as the contrast, on the simulator (run equals it elsewhere)
    for source, modes in (("from_checkpoint = true", ("simulate", "run")), ("", ("simulate",))):
        scenario = tmp_path / f"rejoin{len(source)}.toml"
        scenario.write_text(REJOIN.format(source=source))
        for mode in modes:
            out = tmp_path / f"{mode}{len(source)}"
            res = cli(mode, *BASE, "--rounds", "7", "--checkpoint-every", "2",
                      "--scenario", str(scenario), "--out", str(out))
            assert res.returncode == 0, res.stderr
            runs[mode, bool(source)] = out
    sim, emu = losses(runs["simulate", True]), losses(runs["run", True])
    assert set(emu) == set(sim) == \
        {(t, w) for t in range(7) for w in range(4)} - {(3, 2), (4, 2)}
    assert max(abs(sim[k] - emu[k]) for k in sim) <= 1e-5
    # 2 local steps a round: 4 steps by its checkpoint of round 1, 6 after round 5
    assert steps(runs["run", True])[5, 2] == steps(runs["simulate", True])[5, 2] == 6
    assert steps(runs["simulate", False])[5, 2] == 2   # a donor's joiner starts afresh
    assert losses(runs["simulate", False])[5, 2] != sim[5, 2]
    log = (runs["run", True] / "workers" / "worker2.log").read_text()
    assert "worker 2: rejoins at round 5 from its checkpoint of round 1" in log
    events = [json.loads(line) for line in
              (runs["run", True] / "events.jsonl").read_text().splitlines()]
    assert [(e["round"], e["worker"], e["from_worker"], e["from_checkpoint"])
            for e in events if e["type"] == "join"] == [(5, 2, None, True)]
    assert summary(runs["run", True])["status"] == "ok"


def test_a_rejoin_from_a_checkpoint_is_refused_where_it_cannot_be(tmp_path):
    scenario = tmp_path / "rejoin.toml"
    scenario.write_text(REJOIN.format(source="from_checkpoint = true"))
    for extra, words in ((["--checkpoint-every", "0"], "writes none"),
                         (["--checkpoint-every", "4"], "no checkpoint round before it"),
                         (["--checkpoint-every", "2", "--algo", "diloco"], "join from a donor")):
        res = cli("simulate", *BASE, "--rounds", "7", "--scenario", str(scenario), *extra,
                  "--out", str(tmp_path / "never"))
        assert res.returncode == 2, res.stderr
        assert words in res.stderr and "\n" not in res.stderr.strip(), res.stderr


@pytest.mark.parametrize("algo", ["gasloc", "diloco"])
def test_a_run_that_would_go_on_after_a_lost_host_is_the_same_run_until_one_is_lost(tmp_path,
                                                                                     algo):
    """``continue`` makes every worker ask at its round starts and mix over the living graph
    (DiLoCo: check each mean for a lost worker's gap): with nobody lost, the same losses to the
    bit (random matchings, or DiLoCo's ring; 4 workers, 3 rounds)."""
    from gasloc_emu import config
    from gasloc_emu.plan import build_plan
    from gasloc_emu.simulator.simulate import simulate

    def losses(on_loss: str) -> dict:
        cfg = config.resolve(overrides={"workers": 4, "run.rounds": 3}, sets=(
            "topology.name=matching", "compute.step_time_s=0.01", "algo.local_steps=2",
            f"run.on_worker_loss={on_loss}", f"algo.name={algo}"))
        out = tmp_path / on_loss
        simulate(build_plan(cfg), out)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return {(r["worker"], r["round"]): (r["train_loss"], r.get("eval_loss"),
                                            r.get("uncommitted")) for r in rows}

    assert losses("continue") == losses("auto")


def test_simulate_plays_a_recorded_host_loss(tmp_path):
    """What `simulate --replay` takes from a run that lost a host (``scenario.hostloss``):
    worker 3 of a ring of 4 died in round 2 (its last row round 1) and leaves at round 3; its
    round-2 messages were done without by both neighbours. The replay has no row of it from
    round 2; the messages done without change its neighbours from round 3 (round 2's loss is
    taken before mixing), the same loss with them delivered does not; rounds 0-1 are the
    undisturbed run's."""
    from gasloc_emu import config
    from gasloc_emu.plan import build_plan
    from gasloc_emu.scenario.hostloss import HostLoss
    from gasloc_emu.simulator.simulate import simulate

    def losses(name: str, lost: bool, dead=frozenset()) -> dict:
        cfg = config.resolve(overrides={"workers": 4, "run.rounds": 5}, sets=(
            "topology.name=ring", "compute.step_time_s=0.01", "algo.local_steps=2",
            "run.on_worker_loss=continue"))
        plan = build_plan(cfg)
        if lost:
            plan.world.replay([])
            plan.world.lose(HostLoss(1, "h1", (3,), 3, 1.0, {3: 1}))
        simulate(plan, tmp_path / name, dead=dead)
        rows = [json.loads(line)
                for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return {(r["worker"], r["round"]): r["train_loss"] for r in rows}

    before, delivered = losses("before", False), losses("delivered", True)
    after = losses("after", True, frozenset({(0, 3, 2, "z"), (2, 3, 2, "z")}))
    assert sorted(t for (w, t) in after if w == 3) == [0, 1] and len(after) == 4 * 2 + 3 * 3
    assert all(after[(w, t)] == before[(w, t)] for w in range(4) for t in (0, 1))
    assert all(after[(w, 3)] != delivered[(w, 3)] for w in (0, 2))
    assert after[(1, 3)] == delivered[(1, 3)]   # not 3's neighbour: nothing lost in round 2
