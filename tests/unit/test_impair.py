"""The packet line's rules (netem.impair) and the pure parts of its forwarder (netem.packetline:
spec, checksums, GSO segmentation, frame handling with fake sockets), without any socket."""
from __future__ import annotations

import json
import math
import random
import statistics
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netem.impair import (
    DEFAULT_QUEUE_CAP_BYTES,
    DEFAULT_QUEUE_FLOOR_BYTES,
    JITTER_DISTS,
    ByteBudget,
    Impairment,
    ImpairmentError,
    LinkLine,
    impairment_of,
    jitter_moments,
    jitter_t,
)
from netem.packetline import (
    GSO_TCPV4,
    VNET_HDR,
    VNET_LEN,
    Histogram,
    PacketLine,
    PacketLineSpec,
    Port,
    SpecError,
    checksum,
    gso_segments,
    ones_sum,
    parse_ipv4,
    segment_tcp4,
)

# ================================================================ Impairment: validation

@pytest.mark.parametrize("fields, words", [
    ({"delay_ms": -1}, ["delay_ms = -1", "[0, 10000]"]),
    ({"delay_ms": 10_001}, ["delay_ms = 10001", "[0, 10000]"]),
    ({"delay_ms": float("nan")}, ["delay_ms = nan", "out of range"]),
    ({"delay_ms": True}, ["delay_ms = True", "not a number"]),
    ({"delay_ms": "5"}, ["delay_ms = '5'", "not a number"]),
    ({"jitter_ms": -0.5}, ["jitter_ms = -0.5", "[0, 10000]"]),
    ({"delay_ms": 5, "jitter_ms": 6}, ["jitter_ms = 6", "[0, 5]", "reorder"]),
    ({"jitter_dist": "gauss"}, ["jitter_dist = 'gauss'", "normal, uniform, pareto"]),
    ({"reorder": 1}, ["reorder = 1", "true or false"]),
    ({"reorder_pct": 101}, ["reorder_pct = 101", "[0, 100]"]),
    ({"loss_pct": 100}, ["loss_pct = 100", "[0, 100)", "cut"]),
    ({"loss_pct": -0.1}, ["loss_pct = -0.1", "[0, 100)"]),
    ({"ge_p_pct": 5}, ["ge_r_pct = 0.0", "(0, 100]", "ge_p_pct = 5"]),
    ({"ge_bad_loss_pct": 120}, ["ge_bad_loss_pct = 120", "[0, 100]"]),
    ({"ge_good_loss_pct": 100}, ["ge_good_loss_pct = 100", "[0, 100)"]),
    ({"limit_pkts": 0}, ["limit_pkts = 0", "[1, 10000000]"]),
    ({"limit_pkts": 2.5}, ["limit_pkts = 2.5", "integer"]),
    ({"limit_bytes": 100}, ["limit_bytes = 100", "[1514,"]),
])
def test_a_bad_value_is_refused_naming_it_and_its_range(fields, words):
    with pytest.raises(ImpairmentError) as info:
        Impairment(**fields)
    assert isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_jitter_beyond_the_delay_is_allowed_once_packets_may_overtake():
    assert Impairment(delay_ms=5, jitter_ms=8, reorder=True).reorders
    assert Impairment(delay_ms=5, jitter_ms=8, reorder_pct=10).reorders
    assert not Impairment(delay_ms=5, jitter_ms=5).reorders


def test_the_gilbert_elliott_stationary_loss_follows_its_formula():
    imp = Impairment(ge_p_pct=1, ge_r_pct=10, ge_bad_loss_pct=50, ge_good_loss_pct=0.5)
    assert imp.ge_loss_share() == pytest.approx((0.10 * 0.005 + 0.01 * 0.5) / 0.11)
    both = Impairment(loss_pct=2, ge_p_pct=1, ge_r_pct=10)
    assert both.mean_loss_share() == pytest.approx(1 - 0.98 * (1 - 1 / 11))
    assert Impairment(ge_good_loss_pct=3).ge_loss_share() == pytest.approx(0.03)
    assert Impairment().mean_loss_share() == 0


def test_default_queue_is_twice_the_delay_at_10_gbit_within_floor_and_cap():
    assert Impairment().queue_limits()[1] == DEFAULT_QUEUE_FLOOR_BYTES
    assert Impairment(delay_ms=10).queue_limits()[1] == int(2 * 0.010 * 10e9 / 8)
    assert Impairment(delay_ms=500).queue_limits()[1] == DEFAULT_QUEUE_CAP_BYTES
    pkts, size = Impairment(limit_pkts=7, limit_bytes=9000).queue_limits()
    assert (pkts, size) == (7, 9000)
    assert Impairment(limit_bytes=512_000).queue_limits()[0] == 1000


# ================================================================ Impairment: JSON

impairments = st.builds(
    lambda delay, jit_share, dist, reorder, rpct, loss, p, r, h, k, lp, lb: Impairment(
        delay_ms=delay, jitter_ms=delay * jit_share, jitter_dist=dist, reorder=reorder,
        reorder_pct=rpct, loss_pct=loss, ge_p_pct=p, ge_r_pct=r if p else 0.0,
        ge_bad_loss_pct=h, ge_good_loss_pct=k, limit_pkts=lp, limit_bytes=lb),
    st.floats(0, 10_000), st.floats(0, 1), st.sampled_from(JITTER_DISTS), st.booleans(),
    st.floats(0, 100), st.floats(0, 99.9), st.floats(0, 100), st.floats(0.1, 100),
    st.floats(0, 100), st.floats(0, 99.9), st.none() | st.integers(1, 10**7),
    st.none() | st.integers(1514, 2**31))


@settings(max_examples=200, deadline=None)
@given(impairments)
def test_json_round_trip_keeps_every_field(imp):
    data = json.loads(json.dumps(imp.to_json()))
    assert data["version"] == 1
    assert Impairment.from_json(data) == imp


def test_from_json_refuses_other_versions_and_unknown_fields():
    with pytest.raises(ImpairmentError, match="version = 2"):
        Impairment.from_json({"version": 2})
    with pytest.raises(ImpairmentError, match="unknown impairment field.*latency_ms"):
        Impairment.from_json({"version": 1, "latency_ms": 3})
    assert Impairment.from_json({"delay_ms": 3}) == Impairment(delay_ms=3)


def test_updated_changes_some_fields_and_validates():
    imp = Impairment(delay_ms=20, jitter_ms=5)
    assert imp.updated({"delay_ms": 30}) == Impairment(delay_ms=30, jitter_ms=5)
    with pytest.raises(ImpairmentError, match="jitter_ms = 5"):
        imp.updated({"delay_ms": 4})


def test_impairment_of_a_plan_link_maps_latency_to_delay():
    class PlanLink:
        latency_ms, jitter_ms, loss_pct, jitter_dist = 30.0, 2.0, 0.5, "pareto"
        reorder_pct, ge_p_pct, ge_r_pct, ge_bad_loss_pct = 0.0, 1.0, 20.0, 80.0
        rate_mbit = 50.0
    imp = impairment_of(PlanLink())
    assert imp == Impairment(delay_ms=30, jitter_ms=2, loss_pct=0.5, jitter_dist="pareto",
                             ge_p_pct=1, ge_r_pct=20, ge_bad_loss_pct=80)
    assert impairment_of(object(), delay_ms=4) == Impairment(delay_ms=4)


# ================================================================ jitter distributions

def test_distribution_moments_match_netems_tables():
    mean, sd = jitter_moments("uniform")
    assert mean == pytest.approx(0, abs=1e-9) and sd == pytest.approx(1 / math.sqrt(3), 1e-4)
    mean, sd = jitter_moments("normal")
    assert mean == pytest.approx(0, abs=1e-6) and sd == pytest.approx(1, abs=2e-3)
    for dist in ("pareto", "paretonormal"):
        mean, sd = jitter_moments(dist)
        assert abs(mean) < 0.05 and 0.5 < sd < 1.2, (dist, mean, sd)
    assert all(-4 <= jitter_t(d, u / 1000) <= 4 for d in JITTER_DISTS for u in range(1000))


@pytest.mark.parametrize("dist", JITTER_DISTS)
def test_sampled_delays_have_the_configured_mean_and_spread(dist):
    imp = Impairment(delay_ms=50, jitter_ms=10, jitter_dist=dist, reorder=True)
    line = LinkLine(imp, seed=5)
    delays = [(line.admit(100, 0.0) or 0.0) * 1e3 for _ in range(20_000)]
    for _ in delays:
        line.released(100)
    assert statistics.fmean(delays) == pytest.approx(50 + 10 * jitter_moments(dist)[0], abs=0.3)
    assert statistics.pstdev(delays) == pytest.approx(imp.jitter_sd_ms(), rel=0.04)


# ================================================================ LinkLine: timing

def test_a_plain_delay_releases_at_arrival_plus_delay():
    line = LinkLine(Impairment(delay_ms=25))
    assert line.admit(1500, 10.0) == pytest.approx(10.025)
    assert line.counters.admitted_pkts == 1 and line.held_pkts == 1


arrival_gaps = st.lists(st.floats(0, 0.02), min_size=2, max_size=300)


@settings(max_examples=100, deadline=None)
@given(arrival_gaps, st.floats(0, 50), st.floats(0, 1), st.sampled_from(JITTER_DISTS),
       st.integers(0, 2**32))
def test_without_reordering_releases_keep_the_arrival_order(gaps, delay, share, dist, seed):
    line = LinkLine(Impairment(delay_ms=delay, jitter_ms=delay * share, jitter_dist=dist),
                    seed=seed)
    now, releases = 0.0, []
    for gap in gaps:
        now += gap
        release = line.admit(100, now)
        assert release is not None and release >= now
        releases.append(release)
    assert releases == sorted(releases)


def test_with_reordering_each_packet_keeps_its_own_draw():
    line = LinkLine(Impairment(delay_ms=10, jitter_ms=20, reorder=True), seed=1)
    releases = [line.admit(100, i * 0.001) for i in range(500)]
    assert releases != sorted(releases)
    assert all(r >= i * 0.001 for i, r in enumerate(releases))     # a negative draw: at once


def test_reorder_pct_sends_that_share_at_once():
    line = LinkLine(Impairment(delay_ms=10, reorder_pct=30), seed=2)
    at_once = sum(line.admit(100, 1.0) == 1.0 for _ in range(20_000))
    assert at_once / 20_000 == pytest.approx(0.30, abs=0.015)
    always = LinkLine(Impairment(delay_ms=10, reorder_pct=100))
    assert always.admit(100, 3.0) == 3.0


def test_a_live_change_leaves_the_held_alone_and_keeps_the_order():
    line = LinkLine(Impairment(delay_ms=100))
    first = line.admit(100, 0.0)
    line.set_impairment(Impairment(delay_ms=1))
    second = line.admit(100, 0.001)
    assert first == pytest.approx(0.1) and second == first     # not before the one held
    assert line.admit(100, 0.5) == pytest.approx(0.501)


def test_the_same_seed_gives_the_same_run_and_links_differ():
    def run(seed, src, dst, jitter=5.0):
        line = LinkLine(Impairment(delay_ms=10, jitter_ms=jitter, loss_pct=5), seed, src, dst)
        return [line.admit(100, i * 0.01) for i in range(300)]
    assert run(1, 0, 1) == run(1, 0, 1)
    assert run(1, 0, 1) != run(1, 1, 0) and run(1, 0, 1) != run(2, 0, 1)
    # loss draws have their own stream: changing the jitter keeps the loss pattern
    assert [r is None for r in run(1, 0, 1)] == [r is None for r in run(1, 0, 1, jitter=1.0)]


# ================================================================ LinkLine: loss

def losses(line: LinkLine, n: int) -> list[bool]:
    """Offer ``n`` packets one at a time (each released before the next, so the queue never
    fills): which were lost."""
    out = []
    for _ in range(n):
        kept = line.admit(64, 0.0) is not None
        if kept:
            line.released(64)
        out.append(not kept)
    return out


def binomial_ok(count: int, n: int, p: float, sigmas: float = 4.5) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


@settings(max_examples=6, deadline=None)
@given(st.sampled_from([0.1, 1.0, 5.0, 30.0]), st.integers(0, 2**32))
def test_random_loss_rate_is_within_binomial_tolerance_over_1e5_draws(loss_pct, seed):
    line = LinkLine(Impairment(loss_pct=loss_pct), seed=seed)
    n = 100_000
    lost = sum(losses(line, n))
    assert binomial_ok(lost, n, loss_pct / 100), (lost, n * loss_pct / 100)
    assert line.counters.dropped_pkts["loss"] == lost


@settings(max_examples=6, deadline=None)
@given(st.floats(2, 10), st.floats(30, 90), st.floats(20, 100), st.floats(0, 2),
       st.integers(0, 2**32))
def test_gilbert_elliott_loss_is_its_stationary_share(p, r, bad, good, seed):
    imp = Impairment(ge_p_pct=p, ge_r_pct=r, ge_bad_loss_pct=bad, ge_good_loss_pct=good)
    line = LinkLine(imp, seed=seed)
    n = 100_000
    lost = sum(losses(line, n))
    expected = imp.ge_loss_share()
    assert lost / n == pytest.approx(expected, rel=0.15, abs=0.002), (lost / n, expected)
    assert line.counters.dropped_pkts["ge_loss"] == lost


def test_simple_gilbert_losses_come_in_bursts_of_mean_one_over_r():
    line = LinkLine(Impairment(ge_p_pct=2, ge_r_pct=25), seed=3)
    lost = losses(line, 200_000)
    bursts, run = [], 0
    for x in lost:
        if x:
            run += 1
        elif run:
            bursts.append(run)
            run = 0
    assert statistics.fmean(bursts) == pytest.approx(1 / 0.25, rel=0.1)


def test_netems_bernoulli_special_case_loses_p():
    # tc-netem(8): gemodel p alone is Bernoulli with r = 1 - p, 1-h = 1, 1-k = 0
    line = LinkLine(Impairment(ge_p_pct=3, ge_r_pct=97), seed=4)
    n = 100_000
    assert binomial_ok(sum(losses(line, n)), n, 0.03)


def test_gso_loss_is_decided_per_segment():
    line = LinkLine(Impairment(loss_pct=10), seed=9)
    frames, segments, lost, whole = 3000, 44, 0, 0
    for _ in range(frames):
        v = line.admit_gso(44 * 1514, 0.0, segments)
        lost += len(v.lost)
        whole += len(v.lost) == segments
        assert all(0 <= i < segments for i in v.lost) and len(set(v.lost)) == len(v.lost)
        if v.release_s is not None:
            assert v.held_pkts == segments - len(v.lost)
            line.released(v.held_bytes, v.held_pkts)
    assert binomial_ok(lost, frames * segments, 0.10)
    assert whole == 0
    c = line.counters
    assert c.admitted_pkts == frames * segments == c.forwarded_pkts + c.dropped_pkts["loss"]
    assert c.admitted_bytes == c.forwarded_bytes + c.dropped_bytes["loss"]


# ================================================================ LinkLine: the queue

ops = st.lists(st.tuples(st.sampled_from(["admit", "gso", "release"]), st.integers(60, 65_000),
                         st.integers(1, 44)), max_size=300)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 50), st.integers(1514, 300_000), st.floats(0, 20))
def test_the_queue_limit_is_never_exceeded_and_counters_balance(ops_, lim_pkts, lim_bytes,
                                                                loss):
    line = LinkLine(Impairment(delay_ms=5, loss_pct=loss, limit_pkts=lim_pkts,
                               limit_bytes=lim_bytes), seed=1)
    held = []
    for op, size, segs in ops_:
        if op == "admit" and line.admit(size, 0.0) is not None:
            held.append((size, 1))
        elif op == "gso":
            v = line.admit_gso(size, 0.0, segs)
            if v.release_s is not None:
                held.append((v.held_bytes, v.held_pkts))
        elif op == "release" and held:
            line.released(*held.pop(0))
        assert line.held_pkts <= lim_pkts and line.held_bytes <= lim_bytes
        c = line.counters
        assert c.admitted_pkts == (c.forwarded_pkts + sum(c.dropped_pkts.values())
                                   + line.held_pkts)
        assert c.admitted_bytes == (c.forwarded_bytes + sum(c.dropped_bytes.values())
                                    + line.held_bytes)


def test_a_full_queue_drops_at_the_tail_and_counts_it():
    line = LinkLine(Impairment(delay_ms=5, limit_pkts=2))
    assert line.admit(100, 0.0) is not None and line.admit(100, 0.0) is not None
    assert line.admit(100, 0.0) is None
    assert line.counters.dropped_pkts == {"loss": 0, "ge_loss": 0, "queue": 1}
    line.released(100)
    assert line.admit(100, 0.0) is not None


def test_the_global_budget_is_shared_by_every_link():
    budget = ByteBudget(10_000, per_pkt_bytes=0)
    a = LinkLine(Impairment(), src=0, dst=1, budget=budget)
    b = LinkLine(Impairment(), src=1, dst=0, budget=budget)
    assert a.admit(6000, 0.0) is not None
    assert b.admit(6000, 0.0) is None and b.counters.dropped_pkts["queue"] == 1
    a.released(6000)
    assert b.admit(6000, 0.0) is not None and budget.held_bytes == 6000


# ================================================================ packetline: the spec

def spec(**kw) -> PacketLineSpec:
    ports = (Port(0, "p0", "198.18.0.1"), Port(1, "p1", "198.18.0.2"),
             Port(2, "p2", "198.18.0.3"))
    return PacketLineSpec(ports=ports, **kw)


def test_spec_json_round_trip(tmp_path):
    s = spec(links={(0, 1): Impairment(delay_ms=20), (2, 0): Impairment(loss_pct=1)},
             default=Impairment(delay_ms=3), seed=11, stats_path="/x/stats.json",
             ready_path="/x/ready.json")
    data = json.loads(json.dumps(s.to_json()))
    assert data["version"] == 1 and data["ports"][0] == [0, "p0", "198.18.0.1"]
    assert data["links"][0]["src"] == 0 and data["links"][0]["impairment"]["delay_ms"] == 20
    assert PacketLineSpec.from_json(data) == s
    s.save(str(tmp_path / "spec.json"))
    assert PacketLineSpec.load(str(tmp_path / "spec.json")) == s
    assert s.impairment(1, 2) == Impairment(delay_ms=3)


@pytest.mark.parametrize("data, words", [
    ({"ports": []}, ["ports = []"]),
    ({"ports": [[0, "p0", "198.18.0.1"], [0, "p1", "198.18.0.2"]]}, ["rank 0 appears twice"]),
    ({"ports": [[0, "p0", "198.18.0.300"]]}, ["not an IPv4 address"]),
    ({"ports": [[0, "a very long device", "198.18.0.1"]]}, ["not a device name"]),
    ({"ports": [[0, "p0", "198.18.0.1"]], "links": [{"src": 0, "dst": 3}]},
     ["not a pair of port ranks"]),
    ({"ports": [[0, "p0", "198.18.0.1"]], "version": 9}, ["version = 9"]),
    ({"ports": [[0, "p0", "198.18.0.1"]], "bogus": 1}, ["unknown spec field(s) bogus"]),
    ({"ports": [[0, "p0", "198.18.0.1"], [1, "p1", "198.18.0.2"]],
      "links": [{"src": 0, "dst": 1, "impairment": {"delay_ms": -3}}]}, ["delay_ms = -3"]),
])
def test_bad_specs_are_refused_naming_the_problem(data, words):
    with pytest.raises(SpecError) as info:
        PacketLineSpec.from_json(data)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_spec_for_a_topology_names_its_ports_and_addresses():
    from netem.commands import NetTopology
    from netem.packetline import spec_for_topology
    s = spec_for_topology(NetTopology("ab", 300), {(0, 299): Impairment(delay_ms=1)})
    assert s.ports[299] == Port(299, "p299", "198.18.1.44")


# ================================================================ packetline: checksums, GSO

def rfc1071(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    s = 0
    for (w,) in struct.iter_unpack("!H", data):
        s += w
        s = (s & 0xFFFF) + (s >> 16)
    return s


@settings(max_examples=300)
@given(st.binary(max_size=3000))
def test_the_fast_ones_complement_sum_equals_rfc1071s_loop(data):
    assert ones_sum(data) % 0xFFFF == rfc1071(data) % 0xFFFF
    assert (ones_sum(data) == 0) == (rfc1071(data) == 0)
    even = data + b"\x00" * (len(data) % 2)
    assert ones_sum(even + checksum(even).to_bytes(2, "big")) in (0, 0xFFFF)   # verifies


def tcp4_gso_frame(payload: bytes, mss: int, seq: int = 1000, ip_id: int = 65530,
                   flags: int = 0x18 | 0x80 | 0x01) -> bytes:
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + 32 + len(payload) & 0xFFFF,
                               ip_id, 0x4000, 64, 6, 0, bytes([198, 18, 0, 1]),
                               bytes([198, 18, 0, 2])))
    tcp = struct.pack("!HHIIBBHHH", 5000, 6000, seq, 7, 8 << 4, flags, 512, 0, 0) + bytes(12)
    vnet = VNET_HDR.pack(1, GSO_TCPV4, 14 + 20 + 32, mss, 34, 16)
    eth = bytes.fromhex("020000000002" "020000000001" "0800")
    return vnet + eth + bytes(ip) + tcp + payload


def check_segment(seg: bytes) -> tuple[int, int, int, int, bytes]:
    """Validates both checksums; (ip id, seq, flags, total length, payload)."""
    assert seg[:VNET_LEN] == bytes(VNET_LEN)
    ip, tcp_and_data = seg[VNET_LEN + 14:VNET_LEN + 34], seg[VNET_LEN + 34:]
    assert ones_sum(ip) == 0xFFFF
    pseudo = ip[12:20] + b"\x00\x06" + len(tcp_and_data).to_bytes(2, "big")
    assert ones_sum(pseudo + tcp_and_data) == 0xFFFF
    tot_len, ip_id = struct.unpack_from("!HH", ip, 2)
    seq = struct.unpack_from("!I", tcp_and_data, 4)[0]
    return ip_id, seq, tcp_and_data[13], tot_len, tcp_and_data[32:]


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=20_000), st.integers(100, 1448), st.data())
def test_segmenting_a_gso_frame_is_what_the_kernels_gso_would_send(payload, mss, data):
    frame = tcp4_gso_frame(payload, mss, seq=2**32 - 10)
    info = parse_ipv4(frame)
    count, hdr_end = gso_segments(frame, info)
    assert count == -(-len(payload) // mss) and hdr_end == VNET_LEN + 14 + 20 + 32
    keep = sorted(data.draw(st.sets(st.integers(0, count - 1))))
    segs = segment_tcp4(frame, info, hdr_end, keep)
    assert len(segs) == len(keep)
    for i, seg in zip(keep, segs, strict=True):
        ip_id, seq, flags, tot_len, body = check_segment(seg)
        assert body == payload[i * mss:(i + 1) * mss]
        assert tot_len == 52 + len(body)
        assert ip_id == (65530 + i) & 0xFFFF and seq == (2**32 - 10 + i * mss) % 2**32
        assert bool(flags & 0x01) == bool(flags & 0x08) == (i == count - 1)   # FIN, PSH
        assert bool(flags & 0x80) == (i == 0)                                 # CWR


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_frame_parsing_never_raises_on_garbage(frame):
    info = parse_ipv4(frame)
    if info is not None:
        gso_segments(frame, info)


# ================================================================ packetline: frames, control

class FakeSock:
    def __init__(self):
        self.sent: list[bytes] = []

    def send(self, frame: bytes) -> int:
        self.sent.append(frame)
        return len(frame)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_line(**kw) -> tuple[PacketLine, dict[int, FakeSock], Clock, list]:
    clock, replies = Clock(), []
    line = PacketLine(spec(**kw), clock=clock, control_fd=None, reply=replies.append)
    socks = {k: FakeSock() for k in range(3)}
    line.socks = socks
    return line, socks, clock, replies


def udp_frame(dst: int, vnet: bytes = bytes(VNET_LEN)) -> bytes:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 1, 0, 64, 17, 0, bytes([198, 18, 0, 1]),
                     bytes([198, 18, 0, dst + 1]))
    return vnet + bytes.fromhex("020000000002" "020000000001" "0800") + ip + bytes(8)


def test_ipv4_goes_to_its_destination_after_the_links_delay():
    line, socks, clock, _ = fake_line(links={(0, 2): Impairment(delay_ms=10)})
    frame = udp_frame(2)
    line.on_frame(0, frame, clock.now)
    line.release_due()
    assert socks[2].sent == []
    clock.now += 0.010
    line.release_due()
    assert socks[2].sent == [frame] and socks[1].sent == []
    assert line.late.count == 1 and line.late.max_s == 0.0


def test_zero_delay_frames_leave_at_once_and_arp_is_flooded():
    line, socks, clock, _ = fake_line()
    line.on_frame(0, udp_frame(1), clock.now)
    assert len(socks[1].sent) == 1
    arp = bytes(VNET_LEN) + b"\xff" * 6 + bytes.fromhex("020000000001" "0806") + bytes(28)
    line.on_frame(1, arp, clock.now)
    assert socks[0].sent == [arp] and socks[2].sent == [arp] and len(socks[1].sent) == 1


def test_a_lossy_gso_frame_is_cut_and_only_survivors_leave():
    line, socks, clock, _ = fake_line(links={(0, 1): Impairment(loss_pct=50)}, seed=3)
    frame = tcp4_gso_frame(bytes(range(256)) * 40, 1000)
    line.on_frame(0, frame, clock.now)
    c = line.lines[(0, 1)].counters
    assert c.admitted_pkts == 11 and 0 < c.dropped_pkts["loss"] < 11
    assert len(socks[1].sent) == 11 - c.dropped_pkts["loss"]
    assert line.counts["gso_split"] == 1
    for seg in socks[1].sent:
        check_segment(seg)


def test_malformed_and_unroutable_frames_are_counted_not_forwarded():
    line, socks, clock, _ = fake_line()
    line.on_frame(0, b"\x00" * 5, clock.now)
    bad_version = bytearray(udp_frame(1))
    bad_version[VNET_LEN + 14] = 0x65
    line.on_frame(0, bytes(bad_version), clock.now)
    line.on_frame(0, udp_frame(7), clock.now)
    line.on_frame(1, udp_frame(1), clock.now)
    assert line.counts["malformed"] == 2 and line.counts["unroutable"] == 1
    assert line.counts["hairpin"] == 1
    assert all(not s.sent for s in socks.values())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120), st.integers(0, 2))
def test_no_frame_content_stops_the_line(garbage, src):
    line, _, clock, _ = fake_line(links={(0, 1): Impairment(loss_pct=30, delay_ms=1)})
    for frame in (garbage, bytes(VNET_LEN) + garbage, VNET_HDR.pack(1, 1, 0, 1, 0, 0) + garbage,
                  udp_frame(1)[:VNET_LEN + 14] + garbage):
        line.on_frame(src, frame, clock.now)
    clock.now += 1
    line.release_due()


def test_control_set_changes_one_link_and_refuses_bad_values():
    line, _, _, replies = fake_line(links={(0, 1): Impairment(delay_ms=20)})
    line._control_line(b'{"op": "set", "src": 0, "dst": 1, "jitter_ms": 5}')
    assert replies[-1]["ok"] and line.line(0, 1).impairment == Impairment(delay_ms=20,
                                                                           jitter_ms=5)
    for raw in (b'{"op": "set", "src": 0, "dst": 1, "jitter_ms": 50}', b"not json",
                b'{"op": "set", "src": 0, "dst": 0}', b'{"op": "fly"}', b"[1]"):
        line._control_line(raw)
        assert replies[-1]["ok"] is False and replies[-1]["error"]
    assert line.counts["control_errors"] == 5
    line._control_line(b'{"op": "stats"}')
    assert replies[-1]["stats"]["links"][0]["impairment"]["jitter_ms"] == 5


def test_histogram_percentiles_are_within_one_bin():
    h = Histogram()
    rng = random.Random(1)
    values = [rng.expovariate(1 / 0.002) for _ in range(20_000)]
    for v in values:
        h.add(v)
    values.sort()
    for q in (0.5, 0.99):
        exact = values[math.ceil(q * len(values)) - 1]
        assert exact <= h.percentile_s(q) <= exact + 1e-4
    assert h.max_s == values[-1] and h.summary_ms()["count"] == 20_000
    assert Histogram().percentile_s(0.5) == 0.0


def test_a_histogram_since_a_copy_holds_only_what_came_after():
    h = Histogram()
    for v in (0.050, 0.090, 0.0001):     # the probe's late frames
        h.add(v)
    before = h.copy()
    for v in (0.0002, 0.0004, 0.0009):   # training's
        h.add(v)
    after = h.since(before)
    assert after.count == 3 and after.percentile_s(0.99) == pytest.approx(0.0009, abs=1.5e-6)
    assert after.max_s == pytest.approx(0.0009, abs=1.5e-6) and h.max_s == 0.090  # one bin high
    assert h.since(h.copy()).count == 0


def test_control_mark_gives_the_stats_a_window_from_then():
    line, _, clock, replies = fake_line(links={(0, 1): Impairment(delay_ms=20)})
    line.late.add(0.080)
    line._control_line(b'{"op": "stats"}')
    assert "since_mark" not in replies[-1]["stats"]
    line._control_line(b'{"op": "mark"}')
    assert replies[-1] == {"ok": True, "op": "mark"}
    line.late.add(0.0003)
    clock.now += 2.0
    line._control_line(b'{"op": "stats"}')
    stats = replies[-1]["stats"]
    assert stats["late_release"]["max_ms"] == 80.0
    assert stats["since_mark"]["late_release"]["count"] == 1
    assert stats["since_mark"]["late_release"]["max_ms"] == pytest.approx(0.3, abs=1.5e-3)
    assert stats["since_mark"]["uptime_s"] == pytest.approx(2.0)


def test_control_lateness_answers_the_histograms_alone_and_writes_no_file(tmp_path):
    """What a live verdict asks once a second: lateness and read lag (with since_mark), no
    link counters; the stats file is left as it was."""
    line, _, clock, replies = fake_line(links={(0, 1): Impairment(delay_ms=20)},
                                        stats_path=str(tmp_path / "stats.json"))
    line.late.add(0.080)
    line._control_line(b'{"op": "mark"}')
    line.late.add(0.0003)
    line.lag.add(0.002)
    clock.now += 1.0
    line._control_line(b'{"op": "lateness"}')
    reply = replies[-1]
    assert reply["ok"] and reply["op"] == "lateness" and not (tmp_path / "stats.json").exists()
    got = reply["lateness"]
    assert "links" not in got and got["late_release"]["max_ms"] == 80.0
    assert got["since_mark"]["late_release"]["count"] == 1
    assert got["since_mark"]["read_lag"]["count"] == 1
    line._control_line(b'{"op": "stats"}')
    whole = replies[-1]["stats"]
    assert {k: whole[k] for k in ("late_release", "read_lag", "since_mark")} == \
        {k: got[k] for k in ("late_release", "read_lag")} | {"since_mark": got["since_mark"]}
