"""The worked examples of docs/EXTENDING.md, run as the doc says: each is one file under
examples/extending/ (included in the doc verbatim) plus its entry-point registration, and goes
through the real code path: the codec through the channel, the wire schema, framing and a
short ``simulate``; the event kind through scenario loading and a short ``simulate`` of
``tiny`` with nominal step times; the shaper through config validation, ``run --dry-run``, the
workers' pacer built from the run's spec, and a short ``simulate``."""
from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import pytest
import torch
from test_channel import decode, frames, gossip_rounds, ring_mean, vec

from gasloc_emu import config as C
from gasloc_emu import netplan, plugins, topology
from gasloc_emu.comm import codecs
from gasloc_emu.plan import build_plan
from gasloc_emu.scenario import events
from gasloc_emu.scenario.load import load_scenario
from gasloc_emu.simulator.simulate import simulate
from gasloc_emu.transport import framing
from gasloc_emu.transport.schema import Wire, WireSchema
from netem import shapers
from netem.profiles import ProfileError
from netem.userspace import shaping_from_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "extending"
N = 4  # test_channel's ring


def _blocks(language: str) -> list[str]:
    text = (ROOT / "docs" / "EXTENDING.md").read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


@pytest.mark.parametrize("name", ["fp16_codec.py", "hypercube_topology.py", "slowdown_event.py",
                                  "distance_profile.py", "deep_queue_shaper.py"])
def test_the_doc_shows_each_example_file_verbatim(name):
    assert (EXAMPLES / name).read_text() in _blocks("python")


@pytest.fixture
def registered(monkeypatch):
    """The examples' folder importable and their entry points installed, as the doc's
    ``[project.entry-points...]`` tables would install them (read from the doc)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    tables = "\n".join(_blocks("toml"))
    eps = {group: {name: metadata.EntryPoint(name, value, group)
                   for name, value in re.findall(rf'\[project\.entry-points\."{group}"\]\n'
                                                 r'(\S+) = "([^"]+)"', tables)}
           for group in (codecs.GROUP, events.GROUP, topology.GROUP, netplan.PROFILE_GROUP,
                         shapers.GROUP)}
    assert eps[codecs.GROUP] == {"fp16": metadata.EntryPoint("fp16", "fp16_codec:FP16",
                                                             codecs.GROUP)}
    assert set(eps[events.GROUP]) == {"slowdown"}
    assert eps[topology.GROUP] == {"hypercube": metadata.EntryPoint(
        "hypercube", "hypercube_topology:Hypercube", topology.GROUP)}
    assert set(eps[netplan.PROFILE_GROUP]) == {"distance"}
    assert eps[shapers.GROUP] == {"deep-queue": metadata.EntryPoint(
        "deep-queue", "deep_queue_shaper:DeepQueue", shapers.GROUP)}
    real = plugins.registered

    def with_examples(group: str):
        return {**real(group), **eps.get(group, {})}
    monkeypatch.setattr(plugins, "registered", with_examples)
    monkeypatch.setattr(C, "registered_names", lambda group: frozenset(with_examples(group)))
    # the shaper registry is netem's own (netem imports nothing of gasloc_emu)
    real_shapers = shapers.registered()
    monkeypatch.setattr(shapers, "registered", lambda: {**real_shapers, **eps[shapers.GROUP]})
    monkeypatch.setattr(shapers, "_LOADED", dict(shapers._LOADED))


# -- the codec

def test_the_config_names_exactly_the_builtin_codecs():
    assert ("none", *codecs.BUILTIN) == C.CODECS
    assert all(name == cls.name for name, cls in codecs.BUILTIN.items())


def test_the_codec_is_found_by_its_registered_name_and_by_path(registered):
    fp16 = codecs.make_codec("fp16")
    assert type(fp16).__name__ == "FP16" and fp16.nbytes(1001) == 2002
    assert type(codecs.make_codec("fp16_codec:FP16")) is type(fp16)
    with pytest.raises(C.ConfigError, match="'fp17' is unknown; expected one of none, .*fp16"):
        codecs.make_codec("fp17")
    with pytest.raises(C.ConfigError, match="not a subclass of gasloc_emu.comm.codecs.Codec"):
        codecs.make_codec("fp16_codec:torch")


def test_the_codec_round_trips_through_the_channel_ring_and_wire(registered):
    x = vec(3, 1001) * 1e3
    fp16 = codecs.make_codec("fp16")
    assert torch.allclose(fp16.decode(fp16.encode(x), 1001), x, rtol=2 ** -11)
    zs = [vec(r) for r in range(N)]           # gossip keeps the average
    got = gossip_rounds("fp16", zs, rounds=2)
    assert torch.allclose(torch.stack([got[r][0] for r in range(N)]).mean(0),
                          torch.stack(zs).mean(0), atol=1e-5)
    inputs = [vec(10 + r) for r in range(N)]  # the ring: same bits everywhere, nothing lost
    ring = ring_mean("fp16", inputs)
    assert all(torch.equal(ring[r][0][0], ring[0][0][0]) for r in range(N))
    residuals = torch.stack([ring[r][1] for r in range(N)]).sum(0)
    assert torch.allclose(ring[0][0][0] * N + residuals, torch.stack(inputs).sum(0), atol=1e-4)
    s = WireSchema(1, N, 1000, codec=fp16, compressed=("z",))
    assert s.wire_of(0, "z") == Wire("uint8", (2000,), 1000)
    good = fp16.encode(vec(1, 1000))
    assert torch.equal(decode(s, frames("z", good)).tensor, good)
    bad = good.clone()
    bad.view(torch.float16)[7] = float("nan")
    with pytest.raises(framing.FrameError) as info:   # a peer's NaN is dropped on arrival
        decode(s, frames("z", bad))
    assert info.value.reason == "codec"


def _cfg(**dotted) -> C.Config:
    return C.resolve(overrides={
        "workers": 3, "algo.local_steps": 2, "run.rounds": 3, "compute.step_time_s": 0.01,
        "run.dashboard": "off", "net.probe": False} | dotted)


def test_simulate_runs_with_the_registered_codec(registered, tmp_path):
    simulate(build_plan(_cfg(**{"comm.codec": "fp16", "algo.name": "diloco"})), tmp_path / "sim")
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["comm"]["codec"] == "fp16"
    assert summary["comm"]["bytes_sent_total"] == pytest.approx(
        0.5 * summary["comm"]["raw_bytes_sent_total"], rel=1e-3)


# -- the topology

def test_the_config_names_exactly_the_builtin_topologies():
    assert C.TOPOLOGIES == topology.NAMES
    assert all(name == fam.name for name, fam in topology.BUILTIN.items())


def test_the_hypercube_is_found_by_name_and_path_and_mixes_as_the_closed_form(registered):
    for d in (1, 2, 3, 4):
        cube = topology.Topology("hypercube", 2 ** d)
        assert [len(p) for p in cube.neighbors(0)] == [d] * 2 ** d
        assert all(bin(i ^ j).count("1") == 1 for i, j in cube.possible_edges)
        # W = I - L / (d + 1) with L's eigenvalues 2k, k = 0..d
        assert cube.lambda2 == pytest.approx((d - 1) / (d + 1), abs=1e-12)
    by_path = topology.Topology("hypercube_topology:Hypercube", 8)
    assert by_path.possible_edges == topology.Topology("hypercube", 8).possible_edges
    with pytest.raises(topology.TopologyError, match="power of two workers; got N = 6"):
        topology.Topology("hypercube", 6)
    with pytest.raises(topology.TopologyError,
                       match="'hypercub'; expected one of ring, .*, hypercube, or"):
        topology.Topology("hypercub", 8)
    with pytest.raises(topology.TopologyError, match="not a subclass of gasloc_emu.topology"):
        topology.Topology("hypercube_topology:_bits", 8)


def test_simulate_gossips_over_the_registered_topology(registered, tmp_path):
    cfg = _cfg(**{"workers": 8, "algo.name": "local-gossip", "topology.name": "hypercube",
                  "run.rounds": 2})
    simulate(build_plan(cfg), tmp_path / "sim")
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["peers"]["rule"].startswith("hypercube: workers whose indices differ")
    links = json.loads((tmp_path / "sim" / "links.json").read_text())
    used = {(int(s), int(d)) for s, d in _used_links(links)}
    assert used == {(i, i ^ b) for i in range(8) for b in (1, 2, 4)}


def _used_links(links: dict) -> list[tuple[int, int]]:
    """The directed links that carried bytes in a simulate's links.json."""
    return [(row["src"], row["dst"]) for row in links["links"] if row["bytes"] > 0]


# -- the bandwidth profile

def test_the_profile_gives_every_link_the_rate_of_its_distance(registered):
    for ref in ("distance", "distance_profile:distance"):
        plan = build_plan(_cfg(**{"workers": 6, "net.bw_profile": ref, "net.rate_mbit": 60.0,
                                  "net.latency_ms": 5.0}), data=False)
        links = plan.link_plan.links
        assert len(links) == 6 * 5
        for (i, j), link in links.items():
            hops = min(abs(i - j), 6 - abs(i - j))
            assert (link.rate_mbit, link.latency_ms) == (pytest.approx(60.0 / hops, abs=1e-3), 5.0)
        assert plan.link_plan.note == "rate_mbit / hops around a ring of 6 sites"


def test_a_bad_profile_is_one_line_naming_it(registered, monkeypatch):
    with pytest.raises(ProfileError, match="'distanse' is not a profile; expected one of "
                                            "uniform, .*, distance, a path"):
        build_plan(_cfg(**{"net.bw_profile": "distanse"}), data=False)
    import distance_profile
    monkeypatch.setattr(distance_profile, "distance", lambda net, n, seed: ({(0, 1): 5.0}, ""))
    with pytest.raises(ProfileError, match=r"'distance' gave no rate for pair \(0, 2\)"):
        build_plan(_cfg(**{"net.bw_profile": "distance"}), data=False)
    monkeypatch.setattr(distance_profile, "distance",
                        lambda net, n, seed: ({(0, 1): 5.0, (0, 2): -1.0, (1, 2): 5.0}, ""))
    with pytest.raises(ProfileError, match=r"pair \(0, 2\).*-1.0"):
        build_plan(_cfg(**{"net.bw_profile": "distance"}), data=False)


def _round_times(run_dir) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().split("\n") if x]
    return [r["time_s"] for r in sorted(rows, key=lambda r: (r["round"], r["worker"]))]


def test_simulate_times_the_links_at_the_profile_rates(registered, tmp_path):
    def run(name, profile, graph):
        simulate(build_plan(_cfg(**{"workers": 4, "topology.name": graph, "net.rate_mbit": 20.0,
                                    "net.bw_profile": profile})), tmp_path / name)
        return _round_times(tmp_path / name)
    # on a ring every gossip link is one hop: the profile is the uniform one there, to the bit
    assert run("ring-distance", "distance", "ring") == run("ring-uniform", "uniform", "ring")
    # on the complete graph worker i also waits for i + 2, two hops and half the rate away
    assert run("complete-distance", "distance", "complete")[-1] > \
        run("complete-uniform", "uniform", "complete")[-1]


# -- the event kind

SCENARIO = """
[[event]]
type = "{kind}"
round = 1
workers = [0, 2]
speed = 0.5
"""


@pytest.mark.parametrize("kind", ["slowdown", "slowdown_event:Slowdown"])
def test_the_event_kind_loads_as_the_speed_events_it_stands_for(registered, tmp_path, kind):
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO.format(kind=kind))
    sc = load_scenario(path, workers=3, rounds=3)
    assert sc.events == (events.SpeedEvent(worker=0, speed=0.5, round=1),
                         events.SpeedEvent(worker=2, speed=0.5, round=1))


def test_a_bad_event_of_the_new_kind_is_one_line_naming_it(registered, tmp_path):
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO.format(kind="slowdown").replace("[0, 2]", "[0, 0]"))
    with pytest.raises(events.ScenarioError, match=r"event #1 \(slowdown\): workers = \[0, 0\] "
                                                   "names a worker twice"):
        load_scenario(path, workers=3, rounds=3)
    path.write_text(SCENARIO.format(kind="slowdown").replace("[0, 2]", "[0, 7]"))
    with pytest.raises(events.ScenarioError, match=r"event #1 \(slowdown\): worker 7 is not "):
        load_scenario(path, workers=3, rounds=3)
    path.write_text(SCENARIO.format(kind="slowdown").replace("speed = 0.5", ""))
    with pytest.raises(events.ScenarioError, match="event #1 \\(slowdown\\): missing 'speed'"):
        load_scenario(path, workers=3, rounds=3)
    path.write_text(SCENARIO.format(kind="slowdwn"))
    with pytest.raises(events.ScenarioError, match="'slowdwn' is not an event type; expected "
                                                   "one of link, .*, slowdown"):
        load_scenario(path, workers=3, rounds=3)


def test_simulate_plays_the_event_kind(registered, tmp_path):
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO.format(kind="slowdown"))
    simulate(build_plan(_cfg(**{"run.scenario": str(path)})), tmp_path / "sim")
    assert json.loads((tmp_path / "sim" / "summary.json").read_text())["status"] == "ok"
    rows = [json.loads(x) for x in (tmp_path / "sim" / "metrics.jsonl").read_text().split("\n")
            if x]
    speed = {(r["worker"], r["round"]): (r["speed"], r["compute_s"]) for r in rows}
    for w in range(3):
        slowed = w in (0, 2)
        assert speed[w, 0] == (1.0, pytest.approx(0.02))
        for t in (1, 2):   # 2 steps of 0.01 s at half speed take 0.04 s
            assert speed[w, t] == ((0.5, pytest.approx(0.04)) if slowed
                                   else (1.0, pytest.approx(0.02)))
    recorded = [json.loads(x) for x in (tmp_path / "sim" / "events.jsonl").read_text().split("\n")
                if x]
    assert [(e["type"], e["worker"]) for e in recorded if e.get("type") == "speed"] == \
        [("speed", 0), ("speed", 2)]


# -- the shaper

def _shaped(shaper: str) -> C.Config:
    return _cfg(**{"net.shaper": shaper, "net.bw_profile": "uniform", "net.rate_mbit": 8.0,
                   "net.latency_ms": 10.0, "algo.name": "diloco"})


def test_the_shaper_is_refused_until_it_is_registered():
    with pytest.raises(C.ConfigError, match="net.shaper = 'deep-queue' is not allowed; expected "
                                            "one of auto, tc, userspace, none"):
        _shaped("deep-queue")


def test_a_dry_run_decides_the_registered_shaper(registered):
    from click.testing import CliRunner

    from gasloc_emu.commands.cli import main
    assert "deep-queue" in shapers.known()
    out = CliRunner().invoke(main, ["run", "--dry-run", "--workers", "3", "--bw-profile",
                                    "uniform", "--latency-ms", "10", "--shaper", "deep-queue"],
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "# shaper: deep-queue (deep-queue shaper requested: sender pacing with a 8 s " \
        "queue" in out.output
    assert "each sender queues at most 8 s of data a link" in out.output


@pytest.mark.parametrize("shaper, waits", [("userspace", [0.5]), ("deep-queue", [])])
def test_the_workers_pace_with_the_shapers_queue(registered, shaper, waits):
    """Two seconds of data handed to an 8 Mbit/s link at once: the userspace shaper's sender
    waits until the link holds at most half a second, the deep queue's takes both."""
    plan = build_plan(_shaped(shaper))
    from gasloc_emu.netplan import shaping_decision
    decision = shaping_decision(plan.cfg)
    assert decision.shaper == shaper and decision.delay == "release-queue"
    spec = decision.shaper_kind.worker_spec(plan.link_plan, decision)
    slept: list[float] = []
    pacer = shaping_from_spec(spec, 0, sleep=slept.append)
    first = pacer.stamp(1, 1_000_000, now=0.0)          # 1 s of data at 8 Mbit/s
    second = pacer.stamp(1, 1_000_000, now=0.0)
    assert slept == [pytest.approx(w) for w in waits]
    # the rate and the latency are the userspace shaper's either way
    assert (first, second) == (pytest.approx(1.01), pytest.approx(2.01))


def test_simulate_predicts_the_shaper_as_the_userspace_one(registered, tmp_path):
    walls = {}
    for shaper in ("userspace", "deep-queue"):
        simulate(build_plan(_shaped(shaper)), tmp_path / shaper)
        summary = json.loads((tmp_path / shaper / "summary.json").read_text())
        assert summary["status"] == "ok"
        walls[shaper] = summary["predicted_wall_s"]
    assert walls["deep-queue"] == walls["userspace"] > 0
