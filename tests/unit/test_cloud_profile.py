"""The ``cloud`` profile: the shipped table against the measurements it came from, placements,
and the links it makes (asymmetric, same-region rule, missing pairs, capacity vs one stream).

Pure: no process, no network; the table is read from the package (and rebuilt from the CSVs in
../shared/data/wan beside the repository, which CI has: GASLOC_REQUIRE_NET=1 or
GASLOC_REQUIRE_WAN_DATA=1 make their absence a failure, not a skip).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gasloc_emu import config as C
from netem import cloud, cloudtable
from netem.profiles import ProfileError, build_link_plan

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
WAN = ROOT.parent / "shared" / "data" / "wan"
# the issue asks for the check where the data exist; CI sets GASLOC_REQUIRE_NET for namespaces,
# not for this folder, so only GASLOC_REQUIRE_WAN_DATA=1 turns its absence into a failure
REQUIRE = ("GASLOC_REQUIRE_WAN_DATA",)
TABLE = cloud.load_table()
# an ocean pair both sets measured, both directions (aws8's first and fourth regions)
US_WEST, EU_WEST = "aws:us-west-2", "aws:eu-west-1"


def plan(placement: str, **net):
    workers = len(cloud.parse_placement(placement))
    return build_link_plan(C.NetConfig(bw_profile="cloud", placement=placement, **net),
                           workers, seed=0)


def wan_or_skip() -> Path:
    if WAN.is_dir():
        return WAN
    required = [k for k in REQUIRE if os.environ.get(k, "") not in ("", "0")]
    if required:
        pytest.fail(f"{required[0]}={os.environ[required[0]]} but the measurements are not at "
                    f"{WAN} (../shared/data/wan of the repository)", pytrace=False)
    pytest.skip(f"the measurements are not at {WAN} (../shared/data/wan of the repository)")


# ---------------------------------------------------------------- the shipped table

def test_the_shipped_table_is_what_the_measurements_give():
    """Rebuilt in memory from the CSVs with the shipped derivation date: the same bytes."""
    wan = wan_or_skip()
    shipped = cloudtable.DEFAULT_OUT.read_text()
    rebuilt = cloudtable.render(cloudtable.build_table(wan, TABLE.derived))
    assert rebuilt == shipped, "netem/data/cloud_regions.json is stale: run " \
                               "`python -m netem.cloudtable --derived YYYY-MM-DD`"


def test_a_pair_is_the_median_of_its_rows(tmp_path):
    """Two throughput rows of one pair give their median; ping rows their lower median; a GCP
    zone names its region; a pair only pinged is no link."""
    (tmp_path / cloudtable.THROUGHPUT).write_text(
        "src_region,dst_region,iperf3_connections,throughput_sent_bps,throughput_received_bps\n"
        "aws:us-east-1,gcp:us-east1-b,64,0,4000000000\n"
        "aws:us-east-1,gcp:us-east1-b,64,0,5000000000\n")
    (tmp_path / cloudtable.LATENCY).write_text(
        "src_region,dst_region,min_rtt_ms,avg_rtt_ms,max_rtt_ms,mdev_rtt_ms\n"
        "aws:us-east-1,gcp:us-east1-b,0,12.5,0,0\naws:us-east-1,gcp:us-east1-b,0,80,0,0\n"
        "aws:us-east-1,aws:us-west-2,0,60,0,0\n")
    (tmp_path / cloudtable.INTERCLOUD).write_text(
        "timestamp,run_id,from_cloud,from_region,to_cloud,to_region,bitrate_Bps,avgrtt,gcp_vm,"
        "aws_vm\nt,r,GCP,us-east1,AWS,us-east-1,1000000,13.0,e2-small,t3.nano\n")
    table = cloud.CloudTable.from_json(cloudtable.render(cloudtable.build_table(tmp_path,
                                                                                "2026-01-02")))
    there = table.pairs[("aws:us-east-1", "gcp:us-east1")]
    assert (there.capacity_mbit, there.capacity_rows, there.rtt_ms, there.rtt_rows) == \
        (4500, 2, 12.5, 2)
    back = table.pairs[("gcp:us-east1", "aws:us-east-1")]
    assert (back.capacity_mbit, back.single_stream_mbit, back.rtt_ms, back.rtt_source) == \
        (None, 8.0, 12.5, "skyplane-reverse")
    assert ("aws:us-east-1", "aws:us-west-2") not in table.pairs
    assert table.derived == "2026-01-02" and table.regions == ("aws:us-east-1", "gcp:us-east1")


def test_the_table_says_where_its_numbers_come_from():
    files = {s["file"]: s for s in TABLE.sources}
    assert set(files) == {cloudtable.THROUGHPUT, cloudtable.LATENCY, cloudtable.INTERCLOUD}
    for s in files.values():
        assert s["licence"] == "Apache-2.0" and s["commit"] and s["units"] and s["rows"] > 0
        assert len(s["sha256"]) == 64
    assert files[cloudtable.INTERCLOUD]["units"].startswith("bytes/s")


def test_the_package_ships_the_table():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["netem"]
    shipped = cloudtable.DEFAULT_OUT.relative_to(ROOT / "netem")
    assert any(shipped.match(p) for p in patterns), patterns


def test_a_table_of_another_version_is_refused():
    text = cloudtable.DEFAULT_OUT.read_text().replace('"version": 1,', '"version": 9,', 1)
    with pytest.raises(cloud.CloudError, match="version 9 is not readable"):
        cloud.CloudTable.from_json(text)


# ---------------------------------------------------------------- placement

def test_placements_by_name_count_and_preset():
    assert cloud.parse_placement("aws:us-east-1, gcp:asia-east1") == \
        ("aws:us-east-1", "gcp:asia-east1")
    assert cloud.parse_placement("aws:us-east-1*2,gcp:asia-east1×3") == \
        ("aws:us-east-1",) * 2 + ("gcp:asia-east1",) * 3
    assert cloud.parse_placement("aws8") == cloud.PRESETS["aws8"]
    assert len(set(cloud.PRESETS["aws8"])) == 8
    assert {r.split(":")[0] for r in cloud.PRESETS["two-cloud"]} == {"aws", "gcp"}


@pytest.mark.parametrize("placement, needles", [
    ("aws:us-east-9", ["'aws:us-east-9' is not in the cloud table", "nearest names: "
                       "aws:us-east-2", "aws8, two-cloud"]),
    ("gcp:asia-east1-a", ["nearest names: gcp:asia-east1"]),
    ("aws:us-east-1*0", ["'aws:us-east-1*0' has count '0'", ">= 1"]),
    ("aws:us-east-1×two", ["count 'two'"]),
    ("aws:us-east-1,,gcp:asia-east1", ["empty entry"]),
])
def test_a_bad_placement_is_refused_at_construction_naming_it(placement, needles):
    with pytest.raises(C.ConfigError) as err:
        C.NetConfig(bw_profile="cloud", placement=placement)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_placement_and_the_cloud_profile_go_together():
    with pytest.raises(C.ConfigError, match="'cloud' needs net.placement"):
        C.NetConfig(bw_profile="cloud")
    with pytest.raises(C.ConfigError, match="net.cloud_rate = 'fast' is not allowed"):
        C.NetConfig(bw_profile="cloud", placement="aws8", cloud_rate="fast")


def test_a_placement_for_another_number_of_workers_is_refused():
    net = C.NetConfig(bw_profile="cloud", placement="aws8")
    with pytest.raises(ProfileError, match="places 8 workers; this run has 4"):
        build_link_plan(net, 4, seed=0)


# ---------------------------------------------------------------- links

def test_links_are_the_measured_values_in_each_direction():
    p = plan(f"{US_WEST},{EU_WEST}", latency_ms=2.0)
    there, back = TABLE.pairs[(US_WEST, EU_WEST)], TABLE.pairs[(EU_WEST, US_WEST)]
    assert p.links[(0, 1)].rate_mbit == there.capacity_mbit
    assert p.links[(1, 0)].rate_mbit == back.capacity_mbit
    assert p.links[(0, 1)].rate_mbit != p.links[(1, 0)].rate_mbit      # the data's asymmetry
    assert p.links[(0, 1)].latency_ms == pytest.approx(there.rtt_ms / 2 + 2.0)
    assert p.profile == "cloud" and f"0 {US_WEST}, 1 {EU_WEST}" in p.note
    assert "cloud_regions.json v1" in p.note and "capacity" in p.note


def test_one_stream_gets_less_than_the_capacity_across_oceans():
    """Every aws8 pair more than 60 ms of RTT apart: one TCP stream is below the 64-stream
    capacity (window-bound), and each link is the intercloud median."""
    regions = cloud.PRESETS["aws8"]
    cap, one = plan("aws8"), plan("aws8", cloud_rate="single-stream")
    far = [(i, j) for i in range(8) for j in range(8)
           if i != j and TABLE.pairs[(regions[i], regions[j])].rtt_ms > 60]
    assert len(far) >= 20
    for key in far:
        m = TABLE.pairs[(regions[key[0]], regions[key[1]])]
        assert one.links[key].rate_mbit == m.single_stream_mbit
        assert one.links[key].rate_mbit < cap.links[key].rate_mbit / 2, key
    assert "single-stream" in one.note


def test_two_workers_in_one_region_follow_the_recorded_same_region_rule():
    own = "gcp:europe-west4"           # Skyplane measured this region to itself
    row = TABLE.pairs[(own, own)]
    p = plan(f"{own}*2")
    assert (p.links[(0, 1)].rate_mbit, p.links[(0, 1)].latency_ms) == \
        (row.capacity_mbit, row.rtt_ms / 2)
    assert f"{own}'s same-region row" in p.note
    assert ("aws:us-east-1", "aws:us-east-1") not in TABLE.pairs
    p = plan("aws:us-east-1*2,gcp:asia-east1", cloud_rate="single-stream",
             cloud_missing="nearest")
    fill = TABLE.same_region_fill
    assert p.links[(0, 1)].rate_mbit == fill.capacity_mbit == 7104
    assert p.links[(1, 0)].latency_ms == fill.rtt_ms / 2
    assert "no same-region row for aws:us-east-1: fill = median of the 44" in p.note
    assert "intercloud set has no same-region rows (links 0->1 1->0)" in p.note


def test_a_pair_without_a_measurement_is_an_error_naming_it_and_its_neighbours():
    a, b = "aws:us-east-1", "aws:ap-southeast-2"
    assert TABLE.pairs[(a, b)].single_stream_mbit is None
    with pytest.raises(ProfileError) as err:
        plan(f"{a},{b}", cloud_rate="single-stream")
    text = str(err.value)
    assert f"workers 0 -> 1: no single-stream rate measured for {a} -> {b}" in text
    assert "nearest measured pairs: aws:ca-central-1 -> aws:ap-southeast-2" in text
    assert "net.cloud_missing" in text
    plan(f"{a},{b}")                   # the capacity set has the pair


def test_an_opted_in_fill_is_recorded_in_the_note():
    a, b = "aws:us-east-1", "aws:ap-southeast-2"
    p = plan(f"{a},{b}", cloud_rate="single-stream", cloud_missing="nearest")
    near = TABLE.pairs[("aws:ca-central-1", b)]
    assert p.links[(0, 1)].rate_mbit == near.single_stream_mbit
    assert p.links[(0, 1)].latency_ms == TABLE.pairs[(a, b)].rtt_ms / 2   # measured: kept
    assert f"single-stream rate of aws:ca-central-1 -> {b} (nearest measured" in p.note
    # reverse: only where the other direction was measured; else still the error
    with pytest.raises(ProfileError, match="no single-stream rate measured"):
        plan(f"{a},{b}", cloud_rate="single-stream", cloud_missing="reverse")
    one_way = [(x, y) for (x, y), m in TABLE.pairs.items() if m.single_stream_mbit is None
               and x != y and m.rtt_ms is not None
               and (TABLE.pairs.get((y, x)) or m).single_stream_mbit is not None]
    x, y = one_way[0]
    p = plan(f"{x},{y}", cloud_rate="single-stream", cloud_missing="reverse")
    assert p.links[(0, 1)].rate_mbit == TABLE.pairs[(y, x)].single_stream_mbit
    assert f"single-stream rate of {y} -> {x} (reverse) (links 0->1)" in p.note


@pytest.mark.parametrize("setting", ["net.placement=aws8", "net.cloud_rate=single-stream",
                                     "net.cloud_missing=nearest"])
def test_a_cloud_setting_with_another_profile_is_refused_not_ignored(setting):
    from gasloc_emu import config as C
    from gasloc_emu.plan import build_plan
    cfg = C.resolve(None, {}, ["workers=8", "net.bw_profile=uniform", setting])
    with pytest.raises(ProfileError, match="applies to net.bw_profile = 'cloud' only"):
        build_plan(cfg, data=False)


def test_simulate_takes_the_cloud_profile_and_an_ocean_costs_its_latency(tmp_path):
    """A tiny ring of 3 simulated with two workers in us-east-1 and the third there too, then in
    asia-east1 (181 ms RTT from us-east-1 in the table): each of the 2 rounds waits at least one
    one-way latency more."""
    import json

    from gasloc_emu import config as C
    from gasloc_emu.plan import build_plan
    from gasloc_emu.simulator.simulate import simulate
    walls = {}
    for far in ("aws:us-east-1", "gcp:asia-east1"):
        cfg = C.resolve(None, {}, [
            "workers=3", "model.preset=tiny", "topology.name=ring", "run.rounds=2",
            "algo.local_steps=1", "compute.step_time_s=0.05", "net.bw_profile=cloud",
            f"net.placement=aws:us-east-1*2,{far}", "run.dashboard=off", "data.eval_batches=1",
            "data.max_corpus_mb=1"])
        simulate(build_plan(cfg), tmp_path / far.replace(":", "-"))
        summary = json.loads((tmp_path / far.replace(":", "-") / "summary.json").read_text())
        assert summary["status"] == "ok"
        walls[far] = summary["predicted_wall_s"]
        # the record keeps the peers and the slowest edge a round uses
        assert summary["peers"]["rule"] == "ring: fixed by worker index"
        assert summary["peers"]["edges"][0][:2] == [0, 1]
        assert summary["peers"]["bottleneck_mbit"] > 0
    links, _ = cloud.cloud_links(cloud.parse_placement("aws:us-east-1,gcp:asia-east1"),
                                 "capacity", "error")
    one_way_s = links[(0, 1)].rtt_ms / 2e3
    assert walls["gcp:asia-east1"] - walls["aws:us-east-1"] > 2 * one_way_s


# ---------------------------------------------------------------- peers chosen by the links

def _aws8_plan(topology: str, rate: str, seed: int = 0, **more):
    from gasloc_emu.plan import build_plan
    sets = [f"seed={seed}", "workers=8", f"topology.name={topology}", "topology.degree=3",
            "net.bw_profile=cloud", "net.placement=aws8", f"net.cloud_rate={rate}"]
    sets += [f"{k}={v}" for k, v in more.items()]
    return build_plan(C.resolve(None, {}, sets), data=False)


@pytest.mark.parametrize("rate", cloud.RATES)
def test_fastest_peers_on_aws8_have_a_faster_bottleneck_than_random_ones(rate):
    """The plan hands the link plan's rates to the graph: on aws8, the fastest graph's slowest
    edge beats every random 3-regular expander's of seeds 0-9, connected, with a spectral gap
    (smaller: a sparser, tree-like graph mixes slower; benchmarks/placement_peers.py)."""
    fast = _aws8_plan("fastest", rate)
    topo = fast.topology
    links = fast.link_plan.links
    slowest = min(min(links[(a, b)].rate_mbit, links[(b, a)].rate_mbit)
                  for a, b in topo.edges(0))
    assert topo.bottleneck_mbit() == pytest.approx(slowest)
    randoms = [_aws8_plan("expander", rate, seed).topology.bottleneck_mbit() for seed in range(10)]
    assert slowest > max(randoms)
    assert 0.0 < topo.spectral_gap < 1.0 and len(topo.edges(0)) >= 7   # spans the 8 regions
    described = fast.describe()["topology"]
    assert described["peers"]["rule"].startswith("fastest: ")
    assert described["peers"]["bottleneck_mbit"] == pytest.approx(slowest)
    assert sorted(tuple(e[:2]) for e in described["peers"]["edges"]) == sorted(topo.edges(0))


def test_without_a_shaped_profile_the_fastest_graph_is_refused():
    from gasloc_emu.plan import build_plan
    from gasloc_emu.topology import TopologyError
    with pytest.raises(TopologyError, match="needs a shaped bandwidth profile"):
        build_plan(C.resolve(None, {}, ["workers=8", "topology.name=fastest"]), data=False)


def test_the_run_record_keeps_the_peers_and_the_rule():
    from gasloc_emu.report.schema import RunSummary
    peers = _aws8_plan("fastest", "capacity").topology.peers_record()
    record = RunSummary.of({"status": "ok", "peers": peers}).to_json()
    assert RunSummary.from_json(record).to_json() == record
    assert record["peers"]["edges"] == [list(e) for e in peers["edges"]]


def test_the_dashboard_header_and_plan_know_each_workers_region():
    from gasloc_emu.report.dashboard_state import header_from_plan
    p = _aws8_plan("fastest", "capacity")
    assert p.regions == cloud.PRESETS["aws8"]
    assert header_from_plan(p).regions == cloud.PRESETS["aws8"]
    assert _aws8_plan("ring", "capacity", **{"net.bw_profile": "uniform",
                                             "net.placement": ""}).regions == ()
