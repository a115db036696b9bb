"""Time dilation: the dilated link plan, the worker's clock, the TCP model at K, auto's pick,
and simulate at K = 4 against K = 1 (emulated times within 5 %, losses bit-equal)."""
from __future__ import annotations

import json

import pytest

from gasloc_emu import netplan as dilation
from gasloc_emu.config import ConfigError
from gasloc_emu.plan import build_plan
from gasloc_emu.testing import contract_config, shared_corpus
from netem import capacity
from netem.profiles import Link
from netem.tcpmodel import TcpConnection, TcpModelError, TcpParams

SHAPED = {"net.bw_profile": "uniform", "net.rate_mbit": 50.0, "net.latency_ms": 25.0,
          "net.delay": "packet-line", "net.shaper": "tc"}


def _cfg(k, **extra):
    return contract_config("diloco", **SHAPED, **{"run.time_scale": k}, **extra)


def test_the_played_links_are_k_times_slower_and_longer_with_the_asked_ones_kept():
    cfg1, cfg4 = _cfg(1.0), _cfg(4.0)
    p1, p4 = build_plan(cfg1, data=False), build_plan(cfg4, data=False)
    assert p1.time_scale == 1.0 and p1.asked_links is None
    assert p4.time_scale == 4.0 and p4.cfg == cfg4   # the record keeps the asked config
    asked, played = p4.emulated_links.links[(0, 1)], p4.link_plan.links[(0, 1)]
    assert asked == p1.link_plan.links[(0, 1)]
    assert (played.rate_mbit, played.latency_ms) == (12.5, 100.0)
    assert (played.loss_pct, played.queue_pkts) == (asked.loss_pct, asked.queue_pkts)
    assert played.tcp.route_args()[-2:] == ["rto_min", "800ms"]
    assert p4.describe()["links"] == p1.describe()["links"]
    assert p4.describe()["time_scale"]["time_scale"] == 4.0


def test_a_delay_the_shapers_cannot_hold_at_k_names_the_time_scale():
    with pytest.raises(ConfigError, match=r"run.time_scale = 1000 cannot be played on link"):
        dilation.dilate_link(Link(0, 1, 50.0, latency_ms=25.0), 1000.0)


def test_the_worker_clock_reports_emulated_time_and_sleeps_dilated():
    wall, slept = [100.0], []
    clock = dilation.WorkerClock(4.0, wall=lambda: wall[0], epoch=lambda: wall[0],
                                 wall_sleep=slept.append)
    start = clock.now_s()
    wall[0] += 2.0          # two wall seconds pass
    assert clock.now_s() - start == 0.5
    assert clock.since_s(98.0) == 1.0
    clock.sleep(0.25)       # a quarter of an emulated second: one wall second
    assert slept == [1.0]


def test_the_tcp_model_at_k_scales_rto_min_and_keeps_the_kernels_fixed_constants():
    p = TcpParams()
    assert p.seen_at(1.0) is p
    q = p.seen_at(10.0)
    assert q.rto_min_s == p.rto_min_s                 # the route's rto_min x K
    assert q.hystart_ack_delta_s == pytest.approx(p.hystart_ack_delta_s / 10)
    assert q.rto_max_s == pytest.approx(12.0)
    assert q.cubic_c == pytest.approx(p.cubic_c * 1000)
    assert p.seen_at(10.0, frozenset(dilation_constants())) == p
    with pytest.raises(TcpModelError, match="time_scale = 0.5 is out of range"):
        p.seen_at(0.5)


def dilation_constants():
    from netem.tcpmodel import DILATABLE
    return DILATABLE


def test_with_every_constant_scaled_the_model_is_the_same_in_emulated_time():
    # the model itself has no other clock: a dilated link (rate / K, RTT x K) with every
    # constant x K (cubic's C / K^3) takes K times as long, message by message
    k, base = 8.0, TcpParams()
    dilated = TcpParams(rto_min_s=0.2 * k, rto_max_s=120.0, cubic_c=base.cubic_c / k ** 3,
                        hystart_ack_delta_s=0.002 * k, hystart_delay_min_s=0.004 * k,
                        hystart_delay_max_s=0.016 * k)
    a, b = TcpConnection(base, 50.0, 0.05), TcpConnection(dilated, 50.0 / k, 0.05 * k)
    for i, nbytes in enumerate([480_000, 480_000, 4_000_000, 100_000]):
        ta, tb = a.transfer(nbytes, 3.0 * i), b.transfer(nbytes, 3.0 * i * k)
        assert tb.total_s / k == pytest.approx(ta.total_s, rel=1e-9)


def test_simulate_at_k_predicts_the_emulated_times_of_k_1_and_the_same_losses(tmp_path):
    from gasloc_emu.simulator.simulate import simulate
    rows = {}
    for k in (1.0, 4.0):
        cfg = _cfg(k, **{"tcp.congestion_control": "bbr", "workers": 2})
        plan = build_plan(cfg, corpus=shared_corpus(cfg))
        assert plan.link_model is not None and "TCP" in plan.link_model.describe()
        simulate(plan, tmp_path / f"k{k:g}")
        lines = (tmp_path / f"k{k:g}" / "metrics.jsonl").read_text().splitlines()
        rows[k] = {(r["worker"], r["round"]): r for r in map(json.loads, lines)
                   if "train_loss" in r}
    assert rows[1.0].keys() == rows[4.0].keys() and rows[1.0]
    for key, r1 in rows[1.0].items():
        r4 = rows[4.0][key]
        assert r4["train_loss"] == r1["train_loss"]          # bit-equal
        assert r4["comm_s"] == pytest.approx(r1["comm_s"], rel=0.05)
        assert r4["compute_s"] == r1["compute_s"]


def test_auto_picks_the_smallest_k_whose_peak_fits_half_the_capacity():
    mss = 1448
    # 1 ms of data at 100 Mbit/s is 12.5 kB: 1000 frames/s and as many ACKs per flow
    assert dilation.frame_bytes(100.0, mss) == 12_500
    assert dilation.frame_bytes(1.0, mss) == 2 * mss          # at least two segments
    assert dilation.frame_bytes(10_000.0, mss) == 65_536      # a 64 KiB GSO frame at most
    flows = [100.0] * 8
    assert dilation.peak_frame_rate(flows, mss) == pytest.approx(16_000)

    def peak_at(k):
        return dilation.peak_frame_rate([r / k for r in flows], mss)
    k = dilation.pick_time_scale(peak_at, capacity_fps=10_000)
    assert peak_at(k) <= 5_000 < peak_at(k - 1)
    assert dilation.pick_time_scale(peak_at, capacity_fps=1e9) == 1.0
    with pytest.raises(ConfigError, match="even K = 1000"):
        dilation.pick_time_scale(peak_at, capacity_fps=1.0)


def test_auto_where_nothing_can_be_measured_is_one_config_error(monkeypatch):
    def refuse():
        raise capacity.CapacityError("no namespace or no packet line here (unshare: EPERM)")
    monkeypatch.setattr(capacity, "host_capacity", refuse)
    with pytest.raises(ConfigError, match=r"run.time_scale = 'auto' cannot be resolved here: "
                                          r"no namespace"):
        build_plan(_cfg("auto"), data=False)


def test_auto_records_its_estimate(monkeypatch):
    monkeypatch.setattr(capacity, "host_capacity",
                        lambda: capacity.Capacity(20_000.0, "measured", "test"))
    plan = build_plan(_cfg("auto"), data=False)
    auto = plan.describe()["time_scale"]["auto"]
    assert auto["time_scale"] == plan.time_scale >= 1.0
    assert auto["peak_fps_at_k"] <= 0.5 * auto["capacity_fps"]


def test_the_capacity_cache_is_kept_per_machine_and_engine(tmp_path):
    path, here = tmp_path / "cap.json", {"host": "a", "cpu": "x", "cores": 2, "kernel": "6"}
    cap = capacity.Capacity(1e5, "measured", "now")
    capacity.write_cache(path, cap, 1000.0, here, "e1")
    assert capacity.read_cache(path, 1000.0 + 60, here, "e1").frames_per_s == 1e5
    assert capacity.read_cache(path, 1000.0 + 60, here | {"host": "b"}, "e1") is None
    assert capacity.read_cache(path, 1000.0 + 60, here, "e2") is None
    assert capacity.read_cache(path, 1000.0 + capacity.MAX_AGE_S + 1, here, "e1") is None


def test_simulate_at_k_plays_a_scenarios_times_and_values_in_emulated_time(tmp_path):
    """A link slowed at 1 s and a worker leaving at round 2, at K = 3: the same rows (losses
    bit-equal) and, once the link is slow, the same emulated comm times as at K = 1."""
    from gasloc_emu.simulator.simulate import simulate
    scenario = tmp_path / "s.toml"
    scenario.write_text('[[event]]\ntype = "link"\nat_s = 1.0\nlinks = [[0, 1], [1, 0]]\n'
                        'rate_mbit = 5\n\n[[event]]\ntype = "leave"\nround = 2\n'
                        'worker = 2\n')
    rows = {}
    for k in (1.0, 3.0):
        cfg = _cfg(k, **{"run.scenario": str(scenario), "tcp.congestion_control": "bbr",
                         "workers": 3, "run.rounds": 4})
        plan = build_plan(cfg, corpus=shared_corpus(cfg))
        simulate(plan, tmp_path / f"k{k:g}")
        lines = (tmp_path / f"k{k:g}" / "metrics.jsonl").read_text().splitlines()
        rows[k] = {(r["worker"], r["round"]): r for r in map(json.loads, lines)
                   if "train_loss" in r}
    assert rows[1.0].keys() == rows[3.0].keys()
    assert {w for w, t in rows[1.0] if t == 3} == {0, 1}   # worker 2 left
    slow = [key for key, r in rows[1.0].items() if r["comm_s"] > 0.05 and key[0] in (0, 1)]
    assert slow   # the 5 Mbit/s link shows in its workers' comm times
    for key, r1 in rows[1.0].items():
        assert rows[3.0][key]["train_loss"] == r1["train_loss"]
        assert rows[3.0][key]["comm_s"] == pytest.approx(r1["comm_s"], rel=0.05)
