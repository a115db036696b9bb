"""The TCP link model: the delay-line measurements it must reproduce, its invariants, and its
use by the virtual clock (and that the old link-model protocol is untouched)."""
import math
import statistics
import types

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gasloc_emu.netplan import RoundLinkModel, TcpLinkModel, sim_link_model, tcp_sees_latency
from gasloc_emu.simulator.virtual_clock import Compute, Done, Mark, Recv, Send, VirtualClock
from netem.tcpmodel import (
    TcpConnection,
    TcpModelError,
    TcpParams,
    after_idle_series,
    cubic_window_segs,
    mathis_window_segs,
    params_for,
    steady_rate_mbit,
)
from netem.tcpsettings import HostTcp, TcpSettings, read_host

# The delay line counted IP bytes (1448 payload per 1500-byte packet): that overhead is part of
# what was measured; gasloc-emu's own tc rates are corrected and use 1.0.
LINE_OVERHEAD = 1500 / 1448
PAIRS = ((20.0, 0.050), (50.0, 0.100), (100.0, 0.200))   # (Mbit/s, RTT s) given with the rows


def ratio(cc, ssai, rate_mbit, rtt_s, nbytes, loss_pct=0.0, messages=4, skip=1):
    """Median of (message time) / (bytes * 8 / rate + one-way latency), each message sent 2 s
    after the previous one arrived on one connection, the first ``skip`` left out (warm-up)."""
    params = TcpParams(congestion_control=cc, slow_start_after_idle=ssai,
                       wire_overhead=LINE_OVERHEAD, loss_pct=loss_pct)
    times = after_idle_series(params, rate_mbit, rtt_s, nbytes, 2.0, messages + skip)
    line_s = nbytes * 8 / (rate_mbit * 1e6) + rtt_s / 2
    return statistics.median(t.total_s / line_s for t in times[skip:])


def error(model, lo, hi=None):
    """Relative distance of ``model`` from a measured value or range (0 inside the range)."""
    hi = lo if hi is None else hi
    return 0.0 if lo <= model <= hi else min(abs(model - lo) / lo, abs(model - hi) / hi)


# (what, model value, measured lo, measured hi): every row whose conditions are given
def measured_rows():
    rows = [("cubic ssai=1 0.5 MB 20 Mbit/s 50 ms", ratio("cubic", True, 20, .05, 500_000),
             1.55, None),
            ("cubic ssai=1 0.5 MB 50 Mbit/s 100 ms", ratio("cubic", True, 50, .1, 500_000),
             4.3, None),
            ("cubic ssai=1 0.5 MB 100 Mbit/s 200 ms", ratio("cubic", True, 100, .2, 500_000),
             7.9, None)]
    for nbytes in (500_000, 2_000_000, 8_000_000, 32_000_000):
        for rate, rtt in PAIRS:
            rows.append((f"cubic ssai=0 {nbytes} B {rate} {rtt}",
                         ratio("cubic", False, rate, rtt, nbytes), 1.01, 1.04))
            rows.append((f"bbr {nbytes} B {rate} {rtt}", ratio("bbr", True, rate, rtt, nbytes),
                         1.02, 1.10))
    rows += [("bbr 0.1 % 2 MB", ratio("bbr", True, 50, .1, 2_000_000, 0.1), 1.04, 1.10),
             ("bbr 1 % 2 MB", ratio("bbr", True, 50, .1, 2_000_000, 1.0), 1.29, None),
             ("cubic ssai=1 0.1 % 2 MB (steady state)",
              ratio("cubic", True, 50, .1, 2_000_000, 0.1, messages=20, skip=20), 10.2, None)]
    return rows


def test_the_measured_table_within_10_percent_median_25_percent_worst():
    errors = {what: error(model, lo, hi) for what, model, lo, hi in measured_rows()}
    worst = max(errors, key=errors.get)
    assert statistics.median(errors.values()) <= 0.10, errors
    assert errors[worst] <= 0.25, (worst, errors[worst])


def test_the_048_mb_exchange_over_50_mbit_50_ms():
    """gasloc-emu itself (its tc rates are goodput: no overhead), 0.48 MB, 50 Mbit/s, 50 ms
    one-way, 2 s idle: 0.558-0.573 s under cubic with idle restart, 0.127-0.142 s under bbr
    (against 0.127 s for bytes / rate + latency)."""
    nbytes = 120_576 * 4
    line_s = nbytes * 8 / 50e6 + 0.05

    def after_idle(cc, ssai):
        params = TcpParams(congestion_control=cc, slow_start_after_idle=ssai)
        return statistics.median(t.total_s for t in
                                 after_idle_series(params, 50, 0.1, nbytes, 2.0, 5)[1:])
    assert error(after_idle("cubic", True), 0.558, 0.573) <= 0.05
    assert error(after_idle("bbr", True), 0.127, 0.142) <= 0.05
    assert 1.0 <= after_idle("cubic", False) / line_s <= 1.04 * 1.05
    restarted = after_idle_series(TcpParams(), 50, 0.1, nbytes, 2.0, 3)
    assert [t.restarted for t in restarted] == [False, True, True]
    assert not any(t.restarted for t in after_idle_series(TcpParams("bbr"), 50, .1, nbytes, 2, 3))


def test_ranges_of_the_larger_messages_over_the_given_pairs():
    """2 MB: 1.18-4.3 and 8 MB: 1.07-1.77 under cubic with idle restart (the rows' exact
    conditions are not given: the model's range over the three pairs is compared)."""
    for nbytes, lo, hi in ((2_000_000, 1.18, 4.3), (8_000_000, 1.07, 1.77)):
        model = [ratio("cubic", True, rate, rtt, nbytes) for rate, rtt in PAIRS]
        assert min(model) == pytest.approx(lo, rel=0.10)
        assert max(model) == pytest.approx(hi, rel=0.10)


def test_heavy_loss_under_cubic_is_over_16_times_the_line():
    assert ratio("cubic", True, 50, .1, 2_000_000, 1.0, messages=5) > 16
    assert ratio("cubic", False, 50, .1, 2_000_000, 1.0, messages=5) > 16


def test_a_long_lossy_transfer_settles_at_the_response_function():
    """Periodic loss gives Reno's Mathis window and CUBIC's response function (RFC 8312 5.1)."""
    for cc in ("reno", "cubic"):
        params = TcpParams(congestion_control=cc, loss_pct=0.1)
        conn = TcpConnection(params, 1000, 0.05)
        conn.transfer(50_000_000, 0.0)                 # settle
        tt = conn.transfer(200_000_000, 1000.0)
        rate = 200_000_000 * 8 / tt.wire_s / 1e6
        assert rate == pytest.approx(steady_rate_mbit(params, 1000, 0.05), rel=0.20), cc
    assert mathis_window_segs(0.001) == pytest.approx(38.73, rel=1e-3)
    assert cubic_window_segs(0.001, 0.1) == pytest.approx(38.73, rel=1e-3)   # Reno-friendly
    assert cubic_window_segs(1e-5, 0.2) > mathis_window_segs(1e-5)           # cubic region


def test_buffers_cap_the_rate_at_window_over_rtt():
    params = TcpParams(rcv_buf_bytes=1_000_000, snd_buf_bytes=4_194_304)
    conn = TcpConnection(params, 1000, 0.1)
    conn.transfer(10_000_000, 0.0)
    tt = conn.transfer(100_000_000, 100.0)
    window_mbit = 1_000_000 * 8 / 0.1 / 1e6
    assert 100_000_000 * 8 / tt.wire_s / 1e6 == pytest.approx(window_mbit, rel=0.05)
    assert tt.window_s > 0.5 * tt.total_s


def test_the_kernel_idle_restart_rule():
    """tcp_cwnd_restart: ssthresh = max(ssthresh, 3/4 cwnd); cwnd halved per RTO of idle, not
    below min(init_cwnd, cwnd)."""
    conn = TcpConnection(TcpParams(), 50, 0.1)
    conn.transfer(8_000_000, 0.0)
    cwnd, ssthresh, rto = conn.cwnd_segments, conn.ssthresh_segments, conn.rto_s()
    last = conn._last_send_s
    idle = 2.5 * rto
    conn.transfer(1, last + idle)
    expect = math.floor(math.floor(cwnd) // 2) // 2      # two whole RTOs: two halvings
    assert conn.ssthresh_segments >= max(ssthresh, 0.75 * cwnd)
    assert conn.cwnd_segments >= max(expect, 10)         # (and whatever the 1 byte grew)
    assert conn.cwnd_segments <= max(expect, 10) + 1
    short = TcpConnection(TcpParams(), 50, 0.1)
    short.transfer(8_000_000, 0.0)
    before = short.cwnd_segments
    short.transfer(1, short._last_send_s + 0.9 * short.rto_s())   # idle < RTO: no restart
    assert short.cwnd_segments >= before


def test_slow_start_doubles_per_round_from_the_initial_window():
    conn = TcpConnection(TcpParams(congestion_control="reno"), 1000, 0.1)
    segs = 10 + 20 + 40 + 80            # four rounds, far below the BDP
    tt = conn.transfer(segs * 1448, 0.0)
    assert tt.rounds == 4
    assert tt.total_s == pytest.approx(3 * (0.1 + 1448 * 8 / 1e9) + 80 * 1448 * 8 / 1e9
                                       + 0.05, rel=1e-6)
    assert conn.cwnd_segments == pytest.approx(160)


def test_validation_names_the_bad_value_and_the_range():
    for kwargs, name in (({"congestion_control": "vegas"}, "congestion_control"),
                         ({"init_cwnd_segments": 0}, "init_cwnd_segments"),
                         ({"loss_pct": 100.0}, "loss_pct"),
                         ({"wire_overhead": 0.9}, "wire_overhead"),
                         ({"rcv_buf_bytes": 10}, "rcv_buf_bytes"),
                         ({"slow_start_after_idle": 1}, "slow_start_after_idle"),
                         ({"queue_pkts": 0}, "queue_pkts")):
        with pytest.raises(TcpModelError, match=name):
            TcpParams(**kwargs)
    with pytest.raises(TcpModelError, match=r"rate_mbit = 0 .*\(0, "):
        TcpConnection(TcpParams(), 0, 0.1)
    with pytest.raises(TcpModelError, match="streams"):
        TcpConnection(TcpParams(), 10, 0.1, streams=0)
    with pytest.raises(TcpModelError, match="nbytes"):
        TcpConnection(TcpParams(), 10, 0.1).transfer(-1, 0.0)


# ---------------------------------------------------------------- properties

CCS = st.sampled_from(["cubic", "reno", "bbr"])
PARAMS = st.builds(TcpParams, congestion_control=CCS, slow_start_after_idle=st.booleans(),
                   loss_pct=st.sampled_from([0.0, 0.0, 0.01, 0.5, 3.0]),
                   queue_pkts=st.sampled_from([10, 1000]),
                   rcv_buf_bytes=st.sampled_from([65_536, 6_291_456]))
RATES = st.floats(0.5, 5000)
RTTS = st.floats(0.0, 0.4)
SIZES = st.integers(1, 64 * 2**20)


@settings(max_examples=150, deadline=None)
@given(PARAMS, RATES, RTTS, st.lists(st.tuples(SIZES, st.floats(0, 5)), min_size=1,
                                     max_size=5))
def test_never_faster_than_the_line_and_the_split_adds_up(params, rate, rtt, messages):
    conn, t = TcpConnection(params, rate, rtt), 0.0
    for nbytes, gap_s in messages:
        tt = conn.transfer(nbytes, t)
        line_s = nbytes * 8 / (rate * 1e6) + rtt / 2
        assert tt.total_s >= line_s * (1 - 1e-9)
        parts = (tt.serialisation_s, tt.propagation_s, tt.window_s, tt.retransmit_s)
        assert min(parts) >= 0
        assert sum(parts) == pytest.approx(tt.total_s, rel=1e-9, abs=1e-12)
        t += tt.wire_s + gap_s


@settings(max_examples=150, deadline=None)
@given(PARAMS, RATES, RTTS, SIZES, SIZES)
def test_monotone_in_bytes(params, rate, rtt, a, b):
    small, large = sorted((a, b))
    assert TcpConnection(params, rate, rtt).transfer(small, 0.0).total_s <= \
        TcpConnection(params, rate, rtt).transfer(large, 0.0).total_s * (1 + 1e-9)


@settings(max_examples=100, deadline=None)
@given(st.builds(TcpParams, congestion_control=CCS, slow_start_after_idle=st.booleans()),
       RATES, st.floats(0.001, 0.4), SIZES, st.integers(2, 16))
@example(TcpParams("reno", False), 388.0, 0.046875, 18592320, 2)
@example(TcpParams("reno", False), 213.0, 0.15625, 30014145, 2)
def test_striping_is_never_slower_than_one_connection(params, rate, rtt, nbytes, streams):
    """...than by one segment at a stream's share of the rate per round (a round's first ACK
    comes back one segment after its start, and a stream's segment takes N times longer) and
    one round trip: a stream's share can end a few bytes beyond a window that the whole
    message's window covers (40.0002 segments a stream, a window of 40: a second round for
    the last bytes, as the kernel sends a 41st, short, segment).

    For every message that starts from the initial window: the first (cold) one, and with idle
    restart every later one, where striping's N initial windows help. Without idle restart a
    later message reuses the window the last one left, and striped that can be smaller: the
    streams lose together at the shared queue (droptail synchronises them) and in aggregate
    grow by N segments a round trip, so they reach the queue's loss point N times sooner and
    take a loss, and its halved windows, that one connection never takes. Both examples are
    such: reno, 2 streams, the third message 0.465 s against 0.407 s; and a 30 MB first
    message that loses once striped (2.247 s against 2.334 s, still faster) and leaves the
    next two 9 rounds where one connection needs 8 (1.336 s against 1.205 s)."""
    one = after_idle_series(params, rate, rtt, nbytes, 2.0, 3)
    many = after_idle_series(params, rate, rtt, nbytes, 2.0, 3, streams=streams)
    stream_seg_s = params.mss_bytes * 8 * streams / (rate * 1e6)
    cold = len(one) if params.slow_start_after_idle else 1
    for a, b in list(zip(one, many, strict=True))[:cold]:
        assert b.total_s <= a.total_s * (1 + 1e-9) + b.rounds * stream_seg_s + rtt
    for a, b in zip(one, many, strict=True):
        assert b.serialisation_s == pytest.approx(a.serialisation_s)


@settings(max_examples=60, deadline=None)
@given(CCS, RATES, st.floats(0.005, 0.4), SIZES)
def test_an_idle_restart_only_ever_costs(cc, rate, rtt, nbytes):
    """The same message after idle: with the restart at least as long as without it."""
    on = after_idle_series(TcpParams(cc, True), rate, rtt, nbytes, 2.0, 3)
    off = after_idle_series(TcpParams(cc, False), rate, rtt, nbytes, 2.0, 3)
    assert all(a.total_s >= b.total_s * (1 - 1e-9) for a, b in zip(on, off, strict=True))


@settings(max_examples=80, deadline=None)
@given(CCS, st.booleans(), RATES, st.floats(0.001, 0.4), SIZES, st.floats(0.0, 30.0),
       st.integers(2, 6))
def test_only_a_loss_based_sender_with_idle_restart_on_ever_restarts(cc, ssai, rate, rtt,
                                                                     nbytes, idle_s, count):
    """tcp_slow_start_after_idle_check: the sysctl, and no cong_control hook (bbr has one)."""
    series = after_idle_series(TcpParams(cc, ssai), rate, rtt, nbytes, idle_s, count)
    if cc == "bbr" or not ssai:
        assert not any(t.restarted for t in series)
    assert not series[0].restarted                   # nothing was sent before the first


class _Unmemoised(TcpConnection):
    """A connection that computes every message (never looks it up in its memo)."""

    def _memo_key(self, *_):
        return None


def _state(conn: TcpConnection) -> dict:
    """The connection's congestion state (every slot but the memo's own)."""
    memo_only = ("_memo", "memo_hits", "_ticks", "_memoisable")
    return {k: getattr(conn, k) for k in TcpConnection.__slots__ if k not in memo_only}


def _series_both_ways(params, rate, rtt, streams, messages, shared=None):
    """The same messages on a memoised connection (with the memo ``shared``, or its own)
    and on one that computes each: every message's time and the whole state after it must
    match to the bit; the memo's hits."""
    memo = TcpConnection(params, rate, rtt, streams, shared)
    plain = _Unmemoised(params, rate, rtt, streams)
    t = 0.0
    for nbytes, gap_s in messages:
        a, b = memo.transfer(nbytes, t), plain.transfer(nbytes, t)
        assert a == b and a.wire_s == b.wire_s
        assert _state(memo) == _state(plain)
        t += a.wire_s + gap_s
    return memo.memo_hits


@settings(max_examples=150, deadline=None)
@given(PARAMS, st.sampled_from([5.0, 50.0, 1000.0]), st.sampled_from([0.0, 0.02, 0.1]),
       st.sampled_from([1, 3]),
       st.lists(st.tuples(st.sampled_from([1, 70_000, 480_000, 4_000_000]),
                          st.sampled_from([0.0, 0.001, 0.05, 2.0])), min_size=1, max_size=40))
def test_a_memoised_message_is_the_computed_one_to_the_bit(params, rate, rtt, streams,
                                                          messages):
    """Messages of a few sizes at a few gaps (so that states and keys come back), over every
    congestion control, with and without loss and the idle restart: the memo changes
    nothing, its own or one that a connection alike has filled."""
    shared = {}
    _series_both_ways(params, rate, rtt, streams, messages, shared)
    _series_both_ways(params, rate, rtt, streams, messages[::-1], shared)


@pytest.mark.parametrize("cc", ["cubic", "reno", "bbr"])
def test_a_steady_exchange_is_timed_from_the_memo(cc):
    """One message a second on a 20 ms link: after the first few every message comes from
    the memo (cubic's too, whose slow start after each restart never reaches its clock), and
    all of them equal the computed ones."""
    shared, series = {}, [(480_000, 1.0)] * 30
    assert _series_both_ways(TcpParams(cc), 50.0, 0.04, 1, series, shared) >= 25
    # a second link alike finds every message, its slow start's too, in the shared memo
    assert _series_both_ways(TcpParams(cc), 50.0, 0.04, 1, series, shared) == 30


def test_a_restart_needs_more_idle_than_the_rto():
    """The restart after idle only once the idle time exceeds the RTO (srtt + rto_min)."""
    conn = TcpConnection(TcpParams(), 50, 0.1)
    conn.transfer(2_000_000, 0.0)
    rto = conn.rto_s()
    assert 0.3 <= rto <= 0.5
    assert not conn.transfer(10_000, conn._last_send_s + 0.8 * rto).restarted
    assert conn.transfer(10_000, conn._last_send_s + 1.2 * rto).restarted


def test_zero_rtt_costs_only_the_bytes():
    tt = TcpConnection(TcpParams(), 100, 0.0).transfer(10_000_000, 0.0)
    assert tt.total_s == pytest.approx(10_000_000 * 8 / 100e6, rel=1e-9)


def test_a_queued_message_continues_the_flow():
    """Two messages back to back (the second offered when the first is out) take no longer
    than one of both their bytes, plus at most one round trip."""
    rate, rtt = 50, 0.1
    conn = TcpConnection(TcpParams(), rate, rtt)
    first = conn.transfer(1_000_000, 0.0)
    second = conn.transfer(1_000_000, first.wire_s)
    both = TcpConnection(TcpParams(), rate, rtt).transfer(2_000_000, 0.0)
    assert first.wire_s + second.total_s <= both.total_s + rtt + 1e-9
    assert not second.restarted


# ---------------------------------------------------------------- settings and the host

def test_params_from_settings_and_the_host(tmp_path):
    """The project's one reading of the host (tcpsettings.read_host) and rule for what a
    namespace ends up with (tcpsettings.effective)."""
    (tmp_path / "tcp_congestion_control").write_text("bbr\n")
    (tmp_path / "tcp_rmem").write_text("4096\t131072\t33554432\n")
    (tmp_path / "tcp_wmem").write_text("4096\t16384\t4194304\n")
    host = read_host(tmp_path)
    p = params_for(None, host, mtu=9000, loss_pct=0.5, queue_pkts=50)
    assert (p.congestion_control, p.slow_start_after_idle, p.init_cwnd_segments) == \
        ("bbr", True, 10)                       # a new namespace starts with idle restart on
    assert (p.mss_bytes, p.rcv_buf_bytes, p.loss_pct, p.queue_pkts) == (8948, 33_554_432, 0.5,
                                                                         50)
    p = params_for(TcpSettings("cubic", 0, rmem_max_bytes=1 << 20, init_cwnd=4), host)
    assert (p.congestion_control, p.slow_start_after_idle, p.init_cwnd_segments,
            p.rcv_buf_bytes, p.snd_buf_bytes) == ("cubic", False, 4, 1 << 20, 4_194_304)
    # nothing readable: the kernel's defaults; a congestion control not modelled: cubic
    bare = read_host(tmp_path / "missing")
    p = params_for(None, bare)
    assert (p.congestion_control, p.rcv_buf_bytes, p.snd_buf_bytes) == \
        ("cubic", 6_291_456, 4_194_304)
    htcp = HostTcp("htcp", (), (), 1, (4096, 87380, 1 << 22), (4096, 16384, 1 << 22))
    assert params_for(None, htcp).congestion_control == "cubic"


# ---------------------------------------------------------------- the virtual clock

def tcp_model(cc, latency_s=0.05, rate_mbit=50.0):
    base = lambda src, dst, nbytes: (nbytes * 8 / (rate_mbit * 1e6), latency_s)  # noqa: E731
    return TcpLinkModel(base, lambda s, d, r, t: (rate_mbit, latency_s),
                        lambda s, d: TcpParams(congestion_control=cc))


def arrival_after_idle(link_model, nbytes=482_304):
    """Worker 0 sends worker 1 a message at 0 and another after 2 s of compute; when does the
    second arrive (worker 1's round-1 time)?"""
    rows = []
    clock = VirtualClock(2, link_model, 2, rows.append)
    prog0 = [Send((1, 0, 0, "x"), nbytes), Compute(2.0), Send((1, 0, 1, "x"), nbytes), Done()]
    prog1 = [Recv((1, 0, 0, "x")), Mark({"round": 0}), Recv((1, 0, 1, "x")),
             Mark({"round": 1}), Done()]
    for op0, op1 in zip(prog0, prog1, strict=False):
        clock.report(0, op0)
        clock.report(1, op1)
    for op in prog1[len(prog0):]:
        clock.report(1, op)
    assert clock.finished()
    return rows[-1]["time_s"] - 2.0


def test_the_virtual_clock_gives_an_after_idle_message_later_under_cubic_than_bbr():
    cubic, bbr = arrival_after_idle(tcp_model("cubic")), arrival_after_idle(tcp_model("bbr"))
    assert cubic > 3 * bbr
    assert bbr == pytest.approx(482_304 * 8 / 50e6 + 0.05, rel=0.05)
    plain = arrival_after_idle(lambda s, d, n: (n * 8 / 50e6, 0.05))
    assert plain == pytest.approx(482_304 * 8 / 50e6 + 0.05)


def test_an_exchange_pays_the_restart_where_tcp_sees_the_latency_and_not_under_the_queue():
    """Two workers, 0.48 MB after 2 s of compute, 8 Mbit/s and 50 ms each way: with the packet
    line the second message pays cubic's restart after idle; with the release queue it is
    the old arithmetic, to the bit."""
    host = HostTcp("cubic", ("cubic", "bbr"), ("cubic",), 1, (4096, 131072, 6_291_456),
                   (4096, 16384, 4_194_304))
    nbytes, plain_s = 482_304, 482_304 * 8 / 8e6 + 0.05
    cfg, plan = fake_cfg("release-queue", latency_ms=50.0)
    queue = sim_link_model(cfg, plan, host=host)
    assert not isinstance(queue, TcpLinkModel)
    assert arrival_after_idle(queue, nbytes) == arrival_after_idle(plan.link_model(), nbytes)
    assert arrival_after_idle(queue, nbytes) == (2.0 + 482_304 * 8 / 8e6 + 0.05) - 2.0
    cfg, plan = fake_cfg("packet-line", latency_ms=50.0)
    tcp = sim_link_model(cfg, plan, host=host)
    assert isinstance(tcp, TcpLinkModel)
    after_idle = arrival_after_idle(tcp, nbytes)
    # restarted at 10 segments: round trips of slow start (10, 20, 40) before the pipe
    # (69 segments at 8 Mbit/s over 100 ms) is full
    assert after_idle > plain_s + 0.1
    expected = after_idle_series(params_for(None, host), 8.0, 0.1, nbytes, 2.0, 2)
    assert expected[1].restarted
    assert after_idle == pytest.approx(expected[1].total_s, abs=0.02)
    # the same under bbr (no restart): the line's time
    cfg.tcp = types.SimpleNamespace(congestion_control="bbr")
    assert arrival_after_idle(sim_link_model(cfg, plan, host=host), nbytes) == \
        pytest.approx(plain_s, rel=0.02)
    # each replay starts from new connections: the plan's model itself holds no state
    assert tcp.record() == {}
    assert arrival_after_idle(tcp, nbytes) == after_idle


def test_a_scenario_composes_with_the_tcp_model():
    """A scenario's RoundLinkModel under the TCP model: the rate in force for the round, the
    window kept across the change (set_path), a cut link refused as before."""
    from gasloc_emu.netplan import LinkCut

    class Schedule:
        def at(self, src, dst, round_idx, now_s):
            return {0: (50.0, 50.0), 1: (10.0, 50.0)}.get(round_idx, (0.0, 50.0))
    base = RoundLinkModel(Schedule(), lambda s, d: (None, None))
    model = TcpLinkModel(base, base.path_at, lambda s, d: TcpParams("bbr"))
    wire0, lat0 = model.transfer(0, 1, 1_000_000, 0.0, 0)
    wire1, lat1 = model.transfer(0, 1, 1_000_000, 5.0, 1)
    assert lat0 == lat1 == 0.05
    assert wire1 >= 1_000_000 * 8 / 10e6 > wire0
    assert wire1 == pytest.approx(1_000_000 * 8 / 10e6, rel=0.02)     # bbr kept its window
    assert model.at_round(0, 1, 1000, 1) == base.at_round(0, 1, 1000, 1)
    with pytest.raises(LinkCut):
        model.transfer(0, 1, 1000, 9.0, 2)


def test_the_packet_line_grid_is_within_target():
    """The model against benchmarks/data/tcpmodel_grid.jsonl (real TCP through the project's
    packet line, measured by benchmarks/bench_tcpmodel.py): the after-idle medians within
    10 % at the median and 25 % at the worst."""
    import importlib.util
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    spec = importlib.util.spec_from_file_location("bench_tcpmodel", root / "bench_tcpmodel.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # loss-free cells: a lossy cell's few seeded losses (4 in 4 messages at 0.1 %) are one
    # draw, the model's an expectation (the lossy rows are in the report, not asserted)
    rows = [r for r in bench._load(str(root / "data" / "tcpmodel_grid.jsonl"))
            if "error" not in r and not r["loss_pct"]]
    assert len(rows) >= 40
    errors = [abs(bench.judged(r)["ratio"] - 1) for r in rows]
    assert statistics.median(errors) <= 0.10
    assert max(errors) <= 0.25


def test_the_old_protocol_is_bit_exact():
    """Without latency the TCP model answers with the plain model's own numbers, and its
    stateless calls are the plain model's."""
    plain = lambda s, d, n: (n * 8 / 37e6, 0.0)  # noqa: E731
    zero = TcpLinkModel(plain, lambda s, d, r, t: (37.0, 0.0), lambda s, d: TcpParams())
    assert arrival_after_idle(zero) == arrival_after_idle(plain)
    model = tcp_model("cubic")
    assert model(0, 1, 12345) == model.base(0, 1, 12345)
    assert model.at_round(0, 1, 12345, 3, 1.5) == model.base(0, 1, 12345)


def test_round_link_model_arithmetic_is_unchanged():
    class Schedule:
        def at(self, src, dst, round_idx, now_s):
            return (3.0, 7.0) if round_idx < 2 else (0.7, 0.0)
    m = RoundLinkModel(Schedule(), lambda s, d: (2.5, None))
    assert m.at_round(0, 1, 1000, 0) == (1000 * 8 / (2.5 * 1e6), 7.0 / 1e3)
    assert m.at_round(0, 1, 1000, 5) == (1000 * 8 / (0.7 * 1e6), 0.0)
    assert m(0, 1, 1000) == m.at_round(0, 1, 1000, 0)


def fake_cfg(delay="auto", latency_ms=25.0, shaper="auto"):
    """A config's net and comm as plain namespaces (``delay`` None: without net.delay)."""
    from gasloc_emu import config as C
    from netem.profiles import build_link_plan
    net = C.NetConfig(bw_profile="uniform", rate_mbit=8.0, latency_ms=latency_ms, shaper=shaper)
    net_ns = types.SimpleNamespace(**{f: getattr(net, f) for f in net.__dataclass_fields__})
    if delay is None:
        vars(net_ns).pop("delay", None)
    else:
        net_ns.delay = delay
    cfg = types.SimpleNamespace(net=net_ns, comm=types.SimpleNamespace(), workers=3)
    return cfg, build_link_plan(net, 3, 0)


def test_sim_link_model_uses_tcp_only_where_tcp_sees_the_latency():
    cfg, plan = fake_cfg(None)                  # a config without net.delay: today's model
    assert not isinstance(sim_link_model(cfg, plan), TcpLinkModel)
    assert sim_link_model(cfg, plan)(0, 1, 1000) == plan.link_model()(0, 1, 1000)
    for delay, tcp in (("release-queue", False), ("netem", True), ("packet-line", True),
                       ("auto", True)):
        cfg, plan = fake_cfg(delay)
        assert tcp_sees_latency(cfg) is tcp
        assert isinstance(sim_link_model(cfg, plan), TcpLinkModel) is tcp
    cfg, plan = fake_cfg("auto", shaper="userspace")     # the userspace shaper: release queue
    assert not isinstance(sim_link_model(cfg, plan), TcpLinkModel)
    cfg, plan = fake_cfg("netem", latency_ms=0.0)   # no latency anywhere: the plain model
    assert not isinstance(sim_link_model(cfg, plan), TcpLinkModel)
    # 8 Mbit/s over 2 x 10 ms: 13.8 segments in flight, within slow start's second window
    cfg, plan = fake_cfg("netem", latency_ms=10.0)
    assert not isinstance(sim_link_model(cfg, plan), TcpLinkModel)
    net = vars(cfg.net) | {"loss_pct": 0.1}               # ... unless the link loses packets
    from netem.profiles import build_link_plan
    lossy = build_link_plan(types.SimpleNamespace(**net), 3, 0)
    assert isinstance(sim_link_model(cfg, lossy), TcpLinkModel)


def test_the_default_config_without_latency_keeps_the_plain_model():
    from gasloc_emu import config as C
    from gasloc_emu.netplan import check_network
    for latency_ms, tcp in ((0.0, False), (20.0, True)):
        cfg = C.Config(workers=3, net=C.NetConfig(bw_profile="uniform", latency_ms=latency_ms))
        model = sim_link_model(cfg, check_network(cfg))
        assert isinstance(model, TcpLinkModel) is tcp


def test_sim_link_model_reads_the_tcp_section_defensively():
    cfg, plan = fake_cfg("netem")
    cfg.tcp = types.SimpleNamespace(congestion_control="bbr", slow_start_after_idle=0)
    cfg.comm.streams = 4
    model = sim_link_model(cfg, plan)
    assert model.streams == 4
    params = model.params_of(0, 1)
    assert (params.congestion_control, params.slow_start_after_idle) == ("bbr", False)
    wire_s, latency_s = model.transfer(0, 1, 100_000, 0.0)
    assert latency_s == 0.025 and wire_s >= 100_000 * 8 / 8e6
    assert model.record()["0->1"]["messages"] == 1
