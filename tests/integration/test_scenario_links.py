"""Round-triggered link and partition events in both runners: a partition gives the same losses
in run and simulate, and a link slowed under the userspace shaper slows the rounds that use it
by what its new rate says (and the simulator's link model says the same)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BASE = ["--workers", "4", "--model", "tiny", "--local-steps", "2", "--seed", "2",
        "--topology", "ring", "--no-dashboard", "--set", "data.max_corpus_mb=0.5",
        "--set", "data.eval_batches=1", "--set", "run.failure_detect_s=0.5"]
PARTITION = """
[[event]]
type = "partition"
round = 3
end_round = 6
groups = [[0, 1], [2, 3]]
"""
SLOW = """
[[event]]
type = "link"
round = 3
links = [[0, 1], [1, 0]]
rate_mbit = 2.0
"""
SLOW_MBIT = 2.0


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=timeout)


def rows(run_dir: Path) -> dict[tuple[int, int], dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {(r["round"], r["worker"]): r for r in map(json.loads, lines)}


def events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def both(tmp_path: Path, text: str, rounds: int) -> dict[str, Path]:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(text)
    out = {}
    for mode in ("simulate", "run"):
        out[mode] = tmp_path / mode
        res = cli(mode, *BASE, "--rounds", str(rounds), "--scenario", str(scenario),
                  "--out", str(out[mode]))
        assert res.returncode == 0, res.stderr
    return out


def test_a_partition_of_two_groups_run_equals_simulate(tmp_path):
    runs = both(tmp_path, PARTITION, 8)
    sim, emu = rows(runs["simulate"]), rows(runs["run"])
    assert set(sim) == set(emu) == {(t, w) for t in range(8) for w in range(4)}
    assert max(abs(sim[k]["train_loss"] - emu[k]["train_loss"]) for k in sim) <= 1e-5
    for t in range(8):   # the ring 0-1-2-3-0 loses 1-2 and 3-0 for rounds 3..5
        assert emu[t, 0]["peers"] == ([1] if 3 <= t < 6 else [1, 3])
        assert emu[t, 2]["peers"] == sim[t, 2]["peers"] == ([3] if 3 <= t < 6 else [1, 3])
    cut, restore = events(runs["run"])
    assert cut["type"] == "partition" and cut["detected_by"] == [0, 1, 2, 3]
    assert {(a["src"], a["dst"], a["rate_mbit"]) for a in cut["applied"]} == \
        {(s, d, 0.0) for a, b in ((0, 2), (0, 3), (1, 2), (1, 3)) for s, d in ((a, b), (b, a))}
    assert restore["source"] == "restore" and restore["round"] == 6


# the change's rate is also observed in test_link_observed_in_run.py (the same shaper path)
@pytest.mark.slow
def test_a_link_slowed_under_the_userspace_shaper_slows_its_rounds(tmp_path):
    """Covered in the default suite by test_a_link_trace_replays_in_both_runners_on_their_clocks
    (a link slowed under the userspace shaper, in run and simulate) and
    tests/integration/test_link_observed_in_run.py."""
    runs = both(tmp_path, SLOW, 5)
    for mode, path in runs.items():
        r = rows(path)
        for w in (0, 1):   # the workers whose ring exchange uses the slowed link
            message_bytes = r[0, w]["bytes_sent"] / 2   # one model to each of its two peers
            wire_s = message_bytes * 8 / (SLOW_MBIT * 1e6)
            before = max(r[t, w]["comm_s"] for t in range(3))
            after = min(r[t, w]["comm_s"] for t in range(3, 5))
            # comm_s starts at this worker's compute end; its peer's message may have left a
            # little earlier (its compute ended first), hence 0.9 of the wire time
            assert after - before >= 0.9 * wire_s, (mode, w, before, after, wire_s)
            assert after < 2 * wire_s, (mode, w, after)   # and not slower than the new rate
    sim, emu = rows(runs["simulate"]), rows(runs["run"])
    assert max(abs(sim[k]["train_loss"] - emu[k]["train_loss"]) for k in sim) <= 1e-5
    (ev,) = events(runs["run"])
    assert ev["applied"] == [{"src": 0, "dst": 1, "rate_mbit": 2.0, "latency_ms": 0.0},
                             {"src": 1, "dst": 0, "rate_mbit": 2.0, "latency_ms": 0.0}]
    assert ev["applied_by"].startswith("userspace")
    assert json.loads((runs["run"] / "summary.json").read_text())["shaper"] == "userspace"


TRACE = "time_s,src,dst,rate_mbit\n0.0,0,1,50\n0.0,1,0,50\n0.5,0,1,2\n0.5,1,0,2\n"


def test_a_link_trace_replays_in_both_runners_on_their_clocks(tmp_path):
    """Two workers whose one link slows from 50 to 2 Mbit/s at 0.5 s on the run's clock: the
    rounds before exchange in a fraction of the slow wire time, the last one takes it, in both
    runners (the simulator on its virtual clock, the userspace shaper on the wall clock)."""
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    runs = {}
    for mode in ("simulate", "run"):
        runs[mode] = tmp_path / mode
        res = cli(mode, "--workers", "2", "--model", "tiny", "--local-steps", "2", "--seed", "2",
                  "--rounds", "4", "--step-time-s", "0.1", "--no-dashboard",
                  "--set", "data.max_corpus_mb=0.5", "--set", "data.eval_batches=1",
                  "--link-trace", str(trace), "--out", str(runs[mode]))
        assert res.returncode == 0, res.stderr
    for mode, path in runs.items():
        r = rows(path)
        wire_s = r[0, 0]["bytes_sent"] * 8 / (SLOW_MBIT * 1e6)
        assert max(r[0, w]["comm_s"] for w in (0, 1)) < 0.3 * wire_s, (mode, wire_s)
        # the worker whose compute ended first waits for its peer's later message: the whole
        # wire time at least (the other one, that much less the gap between their ends)
        last = max(r[3, w]["comm_s"] for w in (0, 1))
        assert 0.98 * wire_s <= last < 2 * wire_s, (mode, last, wire_s)
        logged = events(path)
        assert [(e["at_s"], e["links"], e["source"]) for e in logged] == [
            (0.0, [[0, 1]], "trace"), (0.0, [[1, 0]], "trace"),
            (0.5, [[0, 1]], "trace"), (0.5, [[1, 0]], "trace")]
        assert all(e["logged_at_s"] >= e["at_s"] for e in logged)
    sim, emu = rows(runs["simulate"]), rows(runs["run"])
    assert max(abs(sim[k]["train_loss"] - emu[k]["train_loss"]) for k in sim) <= 1e-5
    assert events(runs["run"])[-1]["applied_by"].startswith("userspace")
