"""A profile file that ``netem measure`` writes (sites, not workers) loads through
``plan.build_plan`` as per-directed-link rates and latencies, places the run's workers on the
sites by the file's rule, gives same-site links the file's explicit rule, and ``simulate``
runs over it."""
from __future__ import annotations

import json

import pytest

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from netem.measureplan import HostReport, MeasureBounds, PairResult, profile_document
from netem.profiles import ProfileError, site_of_workers

# site i -> site j: (goodput Mbit/s, median RTT ms) as a measurement would have them
MEASURED = {(0, 1): (20.0, 40.0), (1, 0): (35.0, 40.4)}


def _doc() -> dict:
    hosts = [HostReport(k, f"node{k}", f"198.18.0.{k + 1}", 5000, "1",
                        {"congestion_control": "cubic"}, 1) for k in range(2)]
    results = [PairResult(i, j, ended_by="max_bytes_per_pair",
                          rtt={"count": 9, "median_ms": rtt, "p95_ms": rtt, "min_ms": rtt},
                          receiver={"mbit": mbit, "mean_mbit": mbit, "seconds": 1.0, "bytes": 1},
                          sender={"total_retrans": 0, "data_segs_out": 10}, seconds=1.0)
               for (i, j), (mbit, rtt) in MEASURED.items()]
    return profile_document(hosts, results, bounds=MeasureBounds(), loss_from="zero",
                            date="2026-12-05T00:00:00+00:00", tool_version="test")


def _write(tmp_path, doc: dict):
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(doc))
    return path


def _plan(path, workers: int, *sets: str):
    cfg = C.resolve(None, {}, [f"workers={workers}", f"net.bw_profile={path}",
                               "model.preset=tiny", *sets])
    return build_plan(cfg)


def test_a_measured_file_gives_each_directed_link_its_sites_numbers(tmp_path):
    plan = _plan(_write(tmp_path, _doc()), 4).link_plan
    links = plan.links
    # cycle: workers 0 and 2 on site 0, 1 and 3 on site 1
    assert (links[(0, 1)].rate_mbit, links[(0, 1)].latency_ms) == (20.0, 20.0)
    assert (links[(3, 2)].rate_mbit, links[(3, 2)].latency_ms) == (35.0, 20.2)
    assert links[(0, 2)].rate_mbit == 100_000.0 and links[(0, 2)].latency_ms == 0.0
    assert "worker -> site [0, 1, 0, 1]" in plan.note and "same-site links: unshaped" in plan.note
    assert plan.shaped and len(links) == 12


def test_blocks_and_a_listed_placement(tmp_path):
    doc = _doc() | {"placement": "blocks"}
    links = _plan(_write(tmp_path, doc), 3).link_plan.links
    assert links[(0, 1)].rate_mbit == 100_000.0 and links[(1, 2)].rate_mbit == 20.0
    assert site_of_workers([1, 0, 1], 3, 2) == [1, 0, 1]
    assert site_of_workers("blocks", 5, 2) == [0, 0, 0, 1, 1]
    with pytest.raises(ProfileError, match=r"placement\[1\] = 2 is out of range"):
        site_of_workers([0, 2], 2, 2)


def test_workers_sharing_a_site_need_an_explicit_rule(tmp_path):
    doc = {k: v for k, v in _doc().items() if k != "same_site"}
    path = _write(tmp_path, doc)
    assert _plan(path, 2).link_plan.links[(1, 0)].rate_mbit == 35.0   # one worker per site
    with pytest.raises(ProfileError, match="workers 0 and 2 are both on site 0.*no "
                                           r"\[same_site\] rule"):
        _plan(path, 4)


@pytest.mark.parametrize("change, message", [
    (lambda d: d | {"site_link": d["site_link"][:1]}, r"no \[\[site_link\]\] for 1->0"),
    (lambda d: d | {"version": 2}, "version 2; this gasloc-emu reads"),
    (lambda d: d | {"link": []}, "unknown key 'link'"),
    (lambda d: d | {"site_link": [d["site_link"][0] | {"rate_mbit": -1}, d["site_link"][1]]},
     "rate_mbit = -1 is out of range"),
    (lambda d: d | {"site_link": [d["site_link"][0] | {"dst": 5}, d["site_link"][1]]},
     r"dst = 5 is out of range; expected a site in \[0, 1\]"),
    (lambda d: d | {"placement": "random"}, "placement = 'random' is not allowed"),
])
def test_a_malformed_measured_file_is_refused_naming_what(tmp_path, change, message):
    with pytest.raises(ProfileError, match=message):
        _plan(_write(tmp_path, change(_doc())), 2)


def test_simulate_runs_over_a_measured_file_and_its_latency_costs_time(tmp_path):
    """Two workers, one per site: a round waits at least the slower direction's one-way
    latency more than the same file with the RTTs cut to 0.4 ms."""
    from gasloc_emu.simulator.simulate import simulate
    fast = _doc()
    for link in fast["site_link"]:
        link["latency_ms"] = 0.2
    walls = {}
    for name, doc in (("measured", _doc()), ("near", fast)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        plan = _plan(path, 2, "run.rounds=2", "algo.local_steps=1", "compute.step_time_s=0.05",
                     "run.dashboard=off", "data.eval_batches=1", "data.max_corpus_mb=1")
        simulate(plan, tmp_path / name)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["status"] == "ok"
        walls[name] = summary["predicted_wall_s"]
    assert walls["measured"] - walls["near"] > 2 * (20.0 - 0.2) / 1e3
