"""simulate --timing-only: simulate's times, bytes and link busy seconds to the float without
training, and one-line refusals of what it does not time."""
from __future__ import annotations

import json

import pytest

from gasloc_emu import config as C
from gasloc_emu.config import ConfigError
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator import timing
from gasloc_emu.simulator.simulate import simulate

BASE = {"workers": 8, "model.preset": "tiny", "run.rounds": 2, "algo.local_steps": 2,
        "compute.step_time_s": 0.05, "run.dashboard": "off"}
TIMED = ("time_s", "comm_s", "wait_s", "compute_s", "bytes_sent", "bytes_recv", "peers",
         "steps", "step", "speed", "tokens")


def _cfg(**more):
    return C.resolve(None, BASE | more)


def _rows(folder):
    return {(r["worker"], r["round"]): r
            for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())}


def _links(folder):
    return {(lk["src"], lk["dst"]): lk
            for lk in json.loads((folder / "links.json").read_text())["links"]}


@pytest.mark.parametrize("settings", [
    {"algo.name": "gasloc", "topology.name": "expander", "net.bw_profile": "skewed",
     "net.latency_ms": 20.0},                                   # TCP-aware link model
    {"algo.name": "gasloc", "topology.name": "ring", "net.bw_profile": "skewed",
     "algo.overlap": 1, "algo.alpha": 0.5, "compute.profile": "straggler"},
    {"algo.name": "dsgd", "algo.local_steps": 1, "topology.name": "exponential",
     "net.bw_profile": "uniform", "net.rate_mbit": 20.0, "comm.codec": "topk"},
    {"algo.name": "diloco", "net.bw_profile": "two-cluster", "comm.codec": "int8"},
], ids=["gasloc-expander-tcp", "gasloc-overlap-straggler", "dsgd-topk", "diloco-int8"])
def test_timing_only_equals_simulate_to_the_float(tmp_path, settings):
    plan = build_plan(_cfg(**settings))
    full = simulate(plan, tmp_path / "full", device="cpu")
    timed = timing.simulate_timing(build_plan(_cfg(**settings), data=False), tmp_path / "timed")
    a, b = _rows(tmp_path / "full"), _rows(tmp_path / "timed")
    assert a.keys() == b.keys()
    for key, row in a.items():
        assert {f: row.get(f) for f in TIMED} == {f: b[key].get(f) for f in TIMED}, key
        assert b[key]["train_loss"] is None and "eval_loss" not in b[key]
    assert _links(tmp_path / "full") == _links(tmp_path / "timed")
    assert all(lk["busy_s"] > 0 for lk in _links(tmp_path / "timed").values())
    assert timed.predicted_wall_s == full.predicted_wall_s
    assert timed.bytes_sent_total == full.bytes_sent_total and timed.comm == full.comm
    assert timed.losses == "none (timing only)" and full.losses is None
    assert timed.final_eval_loss is None


@pytest.mark.parametrize("settings, names", [
    ({"compute.step_time_s": 0.0}, "compute.step_time_s"),
    ({"algo.name": "a2cid2"}, "algo.name = a2cid2"),
    ({"algo.name": "diloco", "algo.overlap": 1}, "algo.overlap = 1"),
    ({"run.checkpoint_every": 1}, "run.checkpoint_every"),
    ({"fault.worker": 2}, "fault.worker = 2"),
])
def test_timing_only_refuses_what_it_does_not_time(tmp_path, settings, names):
    plan = build_plan(_cfg(**({"topology.name": "ring"} | settings)), data=False)
    with pytest.raises(ConfigError) as err:
        timing.simulate_timing(plan, tmp_path / "refused")
    line = str(err.value)
    assert names in line and "\n" not in line and line.startswith("simulate --timing-only:")
    assert not (tmp_path / "refused").exists()
