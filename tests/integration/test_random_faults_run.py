"""A scenario's random faults in whole runs: the timeline is written to the record before the
run starts (faults.json), the same seed gives the same run, and ``simulate --replay`` plays
the written timeline (not a new draw) to the run's losses, also after a ``run``."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gasloc_emu import config as C
from gasloc_emu.commands.cli import main
from gasloc_emu.plan import build_plan
from gasloc_emu.scenario.load import load_scenario
from gasloc_emu.simulator.simulate import simulate

pytestmark = pytest.mark.integration

# 3 steps of 0.05 s: a round takes 0.15 s, 12 rounds about 1.8 s
FAULTS = """
[faults]
seed = 11
horizon_s = 1.6

[[faults.crash]]
mtbf_s = 2.0
workers = [1, 2]
duration_median_s = 0.4

[[faults.hang]]
mtbf_s = 1.5
duration_median_s = 0.1

[[faults.slow]]
mtbf_s = 1.5
duration_median_s = 0.3
speed = 0.5

[[faults.link_flap]]
mtbf_s = 3.0
duration_median_s = 0.3
links = [[0, 3]]
"""


def _cfg(tmp_path, seed: int = 11) -> C.Config:
    (tmp_path / "s.toml").write_text(FAULTS.replace("seed = 11", f"seed = {seed}"))
    return C.resolve(overrides={
        "workers": 4, "algo.name": "gasloc", "topology.name": "ring", "algo.local_steps": 3,
        "run.rounds": 12, "run.eval_every": 4, "run.scenario": str(tmp_path / "s.toml"),
        "run.dashboard": "off", "run.failure_detect_s": 0.05, "compute.step_time_s": 0.05})


def _losses(run_dir) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {(r["worker"], r["round"]): r["train_loss"] for r in rows}


def _replay(tmp_path, run: str, out: str) -> dict:
    res = CliRunner().invoke(main, ["simulate", "--replay", str(tmp_path / run),
                                    "--out", str(tmp_path / out)])
    assert res.exit_code == 0, res.output
    return json.loads((tmp_path / out / "summary.json").read_text())


def test_simulate_plays_the_written_timeline_and_replays_it_after_the_seed_changed(tmp_path):
    plan = build_plan(_cfg(tmp_path))
    summary = simulate(plan, tmp_path / "a")
    assert summary["status"] == "ok"
    written = json.loads((tmp_path / "a" / "faults.json").read_text())
    assert written["version"] == 1 and written["spec"]["seed"] == 11
    assert written["counts"]["crash"]["played"] >= 1 and written["counts"]["hang"]["played"] >= 1
    assert summary["membership"]["faults"] == written["counts"]
    fired = [json.loads(x) for x in (tmp_path / "a" / "events.jsonl").read_text().splitlines()]
    assert {"leave", "join", "pause", "speed"} <= {e["type"] for e in fired}
    assert [c["type"] for c in summary["membership"]["changes"]].count("leave") >= 1
    # the same seed: the same run, to the bit
    again = simulate(build_plan(_cfg(tmp_path), corpus=plan.corpus), tmp_path / "b")
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a")
    assert again["final_eval_loss"] == summary["final_eval_loss"]
    # another seed in the file now, drawing other faults: the replay still plays the
    # record's timeline
    cfg = _cfg(tmp_path, seed=12)
    assert load_scenario(cfg.run.scenario, 4, 12).faults.to_json()["faults"] != written["faults"]
    replayed = _replay(tmp_path, "a", "replay")
    assert replayed["membership"]["changes"] == summary["membership"]["changes"]
    assert _losses(tmp_path / "replay") == _losses(tmp_path / "a")
    assert json.loads((tmp_path / "replay" / "faults.json").read_text()) == written


def test_a_run_with_random_faults_replays_to_its_losses(tmp_path):
    from gasloc_emu.emulator.launcher import launch
    from gasloc_emu.report.records import new_run_dir
    cfg = _cfg(tmp_path)
    result = launch(build_plan(cfg), new_run_dir(cfg, tmp_path / "run"))
    assert result.code == 0, result.error
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert [c["type"] for c in summary["membership"]["changes"]].count("leave") >= 1
    replayed = _replay(tmp_path, "run", "replay")
    assert replayed["membership"]["changes"] == summary["membership"]["changes"]
    assert replayed["final_eval_loss"] == pytest.approx(summary["final_eval_loss"], abs=1e-5)
    run = _losses(tmp_path / "run")
    assert _losses(tmp_path / "replay").keys() == run.keys()
    assert _losses(tmp_path / "replay") == pytest.approx(run, abs=1e-5)
    # what the crashed workers sent before they went is in the record, as in the replay's
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert summary["bytes_sent_total"] == sum(r["bytes_sent"] for r in rows if "worker" in r)
    assert summary["bytes_sent_total"] == replayed["bytes_sent_total"]


RESTART_FROM_CHECKPOINT = """
[faults]
seed = 11
horizon_s = 1.6

[[faults.crash]]
mtbf_s = 1.0
workers = [1, 2]
duration_median_s = 0.4
restart_from = "checkpoint"

[[faults.crash]]
mtbf_s = 1.0
workers = [3]
duration_median_s = 0.3
"""


def test_crashed_workers_restart_from_their_checkpoints_and_the_run_replays(tmp_path):
    """Checkpoints every 2 rounds (rounds 1, 3, ...): a crashed worker 1 or 2 that took part
    in one comes back from its own last checkpoint (its step counter goes on from there; no
    peer sends it parameters), one that did not comes back from a peer; which, is decided
    from the rounds the run fixed its faults at, so ``simulate --replay`` repeats it. Worker
    3 restarts from a peer (the default), and the copy is counted in both ends' bytes."""
    from gasloc_emu.emulator.launcher import launch
    from gasloc_emu.report.records import new_run_dir
    (tmp_path / "s.toml").write_text(RESTART_FROM_CHECKPOINT)
    cfg = C.resolve(overrides={
        "workers": 4, "algo.name": "gasloc", "topology.name": "ring", "algo.local_steps": 3,
        "run.rounds": 12, "run.eval_every": 4, "run.scenario": str(tmp_path / "s.toml"),
        "run.dashboard": "off", "run.failure_detect_s": 0.05, "compute.step_time_s": 0.05,
        "run.checkpoint_every": 2})
    result = launch(build_plan(cfg), new_run_dir(cfg, tmp_path / "run"))
    assert result.code == 0, result.error
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    took_part = {(r["worker"], r["round"]) for r in rows}
    joins = [e for e in events if e["type"] == "join"]
    assert {e["worker"] for e in joins} >= {1, 3}
    assert all(e.get("from_checkpoint", False) == (e["worker"] != 3) for e in joins)
    step = {(r["worker"], r["round"]): r["step"] for r in rows}
    restored = 0
    for e in joins:
        w, t = e["worker"], e["round"]
        wrote = [r for r in range(1, t, 2) if (w, r) in took_part and w != 3]
        assert (e["from_worker"] is None) == bool(wrote), e
        # 3 local steps a round: from its checkpoint's step count, or from 0 after a peer's
        assert step[w, t] == 3 * (1 + (len([r for r in range(wrote[-1] + 1)
                                             if (w, r) in took_part]) if wrote else 0))
        restored += bool(wrote)
    assert restored >= 1
    # a copy from a peer is traffic of the joining round, on both ends; a checkpoint is not
    # (no codec: every message is the whole model, one per peer each way on a ring)
    row = {(r["worker"], r["round"]): r for r in rows}
    model_bytes = row[0, 0]["bytes_sent"] // len(row[0, 0]["peers"])
    for e in joins:
        w, t = e["worker"], e["round"]
        extra = row[w, t]["bytes_recv"] - row[w, t]["bytes_sent"]
        assert extra == (model_bytes if e["from_worker"] is not None else 0), e
        if e["from_worker"] is not None:
            donor = row[e["from_worker"], t]
            assert donor["bytes_sent"] - donor["bytes_recv"] == model_bytes
    replayed = _replay(tmp_path, "run", "replay")
    assert replayed["membership"]["changes"] == json.loads(
        (tmp_path / "run" / "summary.json").read_text())["membership"]["changes"]
    assert _losses(tmp_path / "replay") == pytest.approx(_losses(tmp_path / "run"), abs=1e-5)
