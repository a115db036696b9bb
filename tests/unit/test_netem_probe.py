"""The probe's pure parts: job timing, message sizes, window arithmetic, row flags."""
from __future__ import annotations

import pytest

from gasloc_emu.config import NetConfig
from netem import probe as P
from netem.profiles import build_link_plan


def test_job_times_are_ordered_and_leave_room_for_latency():
    t = P.job_times(100.0, pings=10, seconds=2.0, max_latency_ms=50.0)
    assert t["t0"] == 100.0 < t["bulk"] < t["end"] < t["stop"] < t["report"]
    assert t["bulk"] - t["t0"] >= 10 * P.PING_GAP_S + 0.05
    assert t["end"] - t["bulk"] == pytest.approx(2.0)
    assert t["stop"] - t["end"] >= 0.05
    assert t["warm"] - t["bulk"] == pytest.approx(0.5)   # a quarter of the phase, at most 0.5 s


def test_the_warm_up_lasts_k_times_longer_under_dilation():
    """TCP's start lasts round trips, which are K times longer at K: the window that reads
    goodput starts K times later (a phase of 2 K seconds keeps its quarter)."""
    for k in (1.0, 4.0):
        t = P.job_times(0.0, pings=10, seconds=2.0 * k, max_latency_ms=50.0 * k, time_scale=k)
        assert t["warm"] - t["bulk"] == pytest.approx(0.5 * k)
    assert P.warmup_s(8.0) == 0.5 and P.warmup_s(8.0, time_scale=4.0) == 2.0
    assert P.warmup_s(1.0, time_scale=4.0) == 0.25   # never more than a quarter of the phase


def test_the_senders_buffer_keeps_the_bandwidth_delay_product_under_dilation():
    """At K the rate is K times lower and the round trip K times longer: the same bytes are
    in flight, and the buffer that holds them is K = 1's."""
    assert P.sndbuf_bytes(50.0 / 4, time_scale=4.0) == P.sndbuf_bytes(50.0)
    assert P.sndbuf_bytes(50.0 / 4) < P.sndbuf_bytes(50.0)


def test_message_size_is_20ms_of_data_within_bounds():
    assert P.msg_bytes(50.0) == 125_000
    assert P.msg_bytes(0.01) == P.MSG_BYTES_RANGE[0]
    assert P.msg_bytes(10_000.0) == P.MSG_BYTES_RANGE[1]
    assert P.msg_bytes(None) == P.MSG_BYTES_RANGE[1]


def test_summary_counts_only_the_window():
    times = {"t0": 0.0, "bulk": 1.0, "warm": 1.5, "end": 3.0}   # window [1.5, 3.0]
    rec = {"lat": [(0.020, 0.1, 64), (0.022, 0.12, 64), (0.030, 0.14, 64)],
           "bulk": [(0.0, 1.2, 1000), (0.0, 1.5, 1000), (0.0, 2.9, 1000), (0.0, 3.1, 1000)]}
    s = P._summarise(rec, times)
    assert s["bytes"] == 2000 and s["mbit"] == pytest.approx(2000 * 8 / 1.5 / 1e6)
    assert s["latency_ms"] == pytest.approx(22.0) and s["pings"] == 3


def test_rows_flag_misses_beyond_ten_percent():
    plan = build_link_plan(NetConfig(bw_profile="uniform", rate_mbit=10.0, latency_ms=20.0), 2, 0)
    rx = {"mbit": 9.5, "latency_ms": 21.0, "latency_p90_ms": 22.0, "bytes": 1}
    good = P._row(plan, 0, 1, rx)
    assert good["ok"] and good["ratio"] == 0.95 and good["configured_mbit"] == 10.0
    assert not P._row(plan, 0, 1, rx | {"mbit": 8.9})["ok"]
    assert not P._row(plan, 0, 1, rx | {"latency_ms": 23.5})["ok"]
    assert not P._row(plan, 0, 1, rx | {"latency_ms": None})["ok"]


def test_rows_of_unshaped_links_have_no_ratio():
    plan = build_link_plan(NetConfig(), 2, 0)
    row = P._row(plan, 1, 0, {"mbit": 900.0, "latency_ms": 0.2, "latency_p90_ms": 0.3, "bytes": 5})
    assert row["ratio"] is None and row["configured_mbit"] is None and row["ok"]


@pytest.mark.parametrize("pairs, seconds, pings, message", [
    ([(0, 0)], 1.0, 5, r"pair \(0, 0\) is not a link"),
    ([(0, 5)], 1.0, 5, r"workers 0..2"),
    ([(0, 1)], 0.1, 5, "seconds_per_link = 0.1 is out of range"),
    ([(0, 1)], 1.0, 0, "pings = 0 is out of range"),
])
def test_probe_arguments_are_checked(pairs, seconds, pings, message):
    with pytest.raises(ValueError, match=message):
        P._check_args(pairs, 3, seconds, pings)


def test_goodput_fit_is_the_rate_and_resists_a_stall_at_the_window_edge():
    even = [(1.0 + 0.01 * k, 12_500) for k in range(300)]          # 10 Mbit/s for 3 s
    assert P.goodput_mbit(even, 1.5, 3.0) == pytest.approx(10.0, rel=1e-6)
    # the receiver lost the CPU for 0.2 s at the window start and then caught up at once
    stalled = [(max(t, 1.6), n) if 1.4 <= t < 1.6 else (t, n) for t, n in even]
    counted = sum(n for t, n in stalled if 1.5 <= t <= 3.0) * 8 / 1.5 / 1e6
    assert abs(counted - 10.0) > 0.6                                 # counting: >6 % off
    assert P.goodput_mbit(stalled, 1.5, 3.0) == pytest.approx(10.0, rel=0.05)
