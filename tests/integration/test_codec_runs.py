"""Compressed communication in worker processes: ``run`` equals ``simulate`` with every codec,
the record counts the bytes before and after compression per link, and the combinations that
cannot work are refused before anything starts."""
from __future__ import annotations

import json

import pytest

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.simulate import simulate


def _cfg(**dotted) -> C.Config:
    return C.resolve(overrides={
        "workers": 3, "algo.local_steps": 2, "run.rounds": 3, "compute.step_time_s": 0.01,
        "run.dashboard": "off", "net.probe": False} | dotted)


def _metrics(run_dir) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {(r["worker"], r["round"]): (r["train_loss"], r["bytes_sent"]) for r in rows}


# one algorithm per codec keeps the suite short; every codec meets gossip or the ring
@pytest.mark.parametrize("codec,algo", [("int8", "gasloc"), ("int4", "diloco"),
                                        ("topk", "local-gossip"), ("randk", "diloco"),
                                        ("bf16", "dsgd")])
def test_run_equals_simulate_with_every_codec(tmp_path, codec, algo):
    from gasloc_emu.emulator.launcher import launch
    from gasloc_emu.report.records import new_run_dir
    cfg = _cfg(**{"comm.codec": codec, "comm.ratio": 0.05, "algo.name": algo,
                  "topology.name": "ring", "algo.local_steps": 1 if algo == "dsgd" else 2})
    sim = simulate(build_plan(cfg), tmp_path / "sim")
    assert launch(build_plan(cfg), new_run_dir(cfg, tmp_path / "run")).code == 0
    ran = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert ran["status"] == "ok"
    assert _metrics(tmp_path / "run") == _metrics(tmp_path / "sim")  # the same bits
    assert ran["final_eval_loss"] == pytest.approx(sim["final_eval_loss"], abs=1e-5)
    assert ran["comm"] == sim["comm"] and ran["comm"]["codec"].startswith(codec)
    assert ran["comm"]["bytes_sent_total"] < 0.6 * ran["comm"]["raw_bytes_sent_total"]
    links = json.loads((tmp_path / "run" / "links.json").read_text())["links"]
    assert sum(lk["bytes"] for lk in links) == ran["bytes_sent_total"]
    assert sum(lk["raw_bytes"] for lk in links) == ran["comm"]["raw_bytes_sent_total"]
    sim_links = json.loads((tmp_path / "sim" / "links.json").read_text())["links"]
    assert {(lk["src"], lk["dst"], lk["bytes"], lk["raw_bytes"]) for lk in links} == \
        {(lk["src"], lk["dst"], lk["bytes"], lk["raw_bytes"]) for lk in sim_links}


def test_a2cid2_sends_compressed_exchanges_and_predicts_them_shorter(tmp_path):
    base = {"algo.name": "a2cid2", "topology.name": "ring", "workers": 4, "run.rounds": 12,
            "net.bw_profile": "uniform", "net.rate_mbit": 8.0}
    plain = simulate(build_plan(_cfg(**base)), tmp_path / "none")
    packed = simulate(build_plan(_cfg(**base, **{"comm.codec": "int8"})), tmp_path / "int8")
    ratio = packed["bytes_sent_total"] / plain["bytes_sent_total"]
    assert ratio == pytest.approx(0.25 + 1 / 256, rel=1e-3)
    assert packed["comm"]["raw_bytes_sent_total"] == plain["bytes_sent_total"]
    assert packed["predicted_wall_s"] < 0.6 * plain["predicted_wall_s"]
    assert packed["final_eval_loss"] == pytest.approx(plain["final_eval_loss"], rel=0.02)


def test_gossip_with_a_lossy_codec_refuses_a_join(tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text('[[event]]\ntype = "leave"\nworker = 2\nround = 1\n\n'
                        '[[event]]\ntype = "join"\nworker = 2\nround = 2\n')
    cfg = _cfg(**{"comm.codec": "int8", "run.scenario": str(scenario), "workers": 4,
                  "topology.name": "ring", "run.rounds": 4})
    with pytest.raises(C.ConfigError, match="comm.codec = int8 cannot take a worker that joins"):
        build_plan(cfg, data=False)
    build_plan(C.replace(cfg, **{"algo.name": "diloco"}), data=False)  # its residual is its own
