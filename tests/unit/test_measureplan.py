"""The socket-free rules of ``netem measure``: bounds, order, a pair's deadlines (made-up
times), the numbers of one pair, the records between hosts, and the profile file."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netem.measureplan import (
    BOUND_NAMES,
    HostReport,
    MeasureBounds,
    MeasureError,
    PairBudget,
    PairResult,
    goodput,
    pair_order,
    percentile,
    ping_stats,
    profile_document,
)


@pytest.mark.parametrize("field, value, flag, shown", [
    ("max_bytes_per_pair", 1000, "--max-bytes-per-pair", "[65536, "),
    ("max_bytes_per_pair", 2.5e6, "--max-bytes-per-pair", "an integer"),
    ("max_seconds_per_pair", 0.1, "--max-seconds-per-pair", "[0.5, 600]"),
    ("max_seconds_per_pair", float("nan"), "--max-seconds-per-pair", "[0.5, 600]"),
    ("max_seconds", 0, "--max-seconds", "[1, "),
    ("pings", 0, "--pings", "[1, 10000]"),
    ("pings", True, "--pings", "[1, 10000]"),
])
def test_a_bound_out_of_range_is_refused_naming_it_and_the_range(field, value, flag, shown):
    with pytest.raises(MeasureError) as err:
        MeasureBounds(**{field: value})
    assert flag in str(err.value) and repr(value) in str(err.value) and shown in str(err.value)


def test_the_defaults_are_within_their_bounds():
    b = MeasureBounds()
    assert b.max_bytes_per_pair == 64_000_000 and b.max_seconds_per_pair == 10.0


def test_every_directed_pair_once_both_directions_together():
    order = pair_order(3)
    assert order == [(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)]
    assert pair_order(3) == order     # every host derives the same
    assert len(set(pair_order(5))) == 20
    with pytest.raises(MeasureError, match="hosts = 1"):
        pair_order(1)


def test_a_pair_ends_at_its_own_bound_or_the_total_whichever_is_first():
    b = MeasureBounds(max_seconds_per_pair=10.0, max_seconds=100.0)
    own = PairBudget(b, start_s=50.0, total_deadline_s=100.0)
    assert own.deadline_s == 60.0 and own.time_bound == "max_seconds_per_pair"
    assert own.ping_deadline_s == pytest.approx(52.5)
    assert own.bulk_deadline_s == pytest.approx(59.0)     # 1 s kept for the report
    cut = PairBudget(b, start_s=96.0, total_deadline_s=100.0)
    assert cut.deadline_s == 100.0 and cut.time_bound == "max_seconds"
    assert cut.bulk_deadline_s == pytest.approx(99.2)     # 20 % of 4 s for the report
    assert cut.startable
    assert not PairBudget(b, start_s=99.7, total_deadline_s=100.0).startable
    assert cut.bulk_seconds(99.0) == pytest.approx(0.2) and cut.bulk_seconds(99.5) == 0.0


def test_which_bound_ended_a_transfer():
    b = MeasureBounds(max_bytes_per_pair=1 << 20)
    budget = PairBudget(b, 0.0, 1000.0)
    assert budget.ended_by(1 << 20) == "max_bytes_per_pair"
    assert budget.ended_by((1 << 20) - 1) == "max_seconds_per_pair"
    assert PairBudget(b, 995.0, 1000.0).ended_by(0) == "max_seconds"


@given(per=st.floats(0.5, 600), total=st.floats(1, 1e4), start=st.floats(0, 2e4))
def test_a_pairs_deadlines_are_in_order_and_within_both_bounds(per, total, start):
    b = MeasureBounds(max_seconds_per_pair=per, max_seconds=total)
    budget = PairBudget(b, start, total_deadline_s=total)
    if not budget.startable:
        return
    assert start <= budget.ping_deadline_s <= budget.bulk_deadline_s <= budget.deadline_s
    assert budget.deadline_s <= start + per and budget.deadline_s <= total
    assert budget.time_bound in BOUND_NAMES


def test_goodput_leaves_slow_start_out_and_says_the_mean_too():
    # 0.5 s at 5 Mbit/s, then 1.5 s at 40 Mbit/s, one read every 10 ms
    points, t, got = [], 0.0, 0
    while t < 2.0 - 1e-9:
        t += 0.01
        got += int((5e6 if t <= 0.5 else 40e6) * 0.01 / 8)
        points.append((t, got))
    g = goodput(points)
    assert g["mbit"] == pytest.approx(40.0, rel=0.01)
    assert g["mean_mbit"] < 33 and g["bytes"] == got and g["seconds"] == pytest.approx(1.99)
    with pytest.raises(MeasureError, match="too few"):
        goodput(points[:1])


def test_ping_stats_are_measured_values():
    s = ping_stats([0.010, 0.011, 0.012, 0.013, 0.050])
    assert s == {"count": 5, "median_ms": 12.0, "p95_ms": 50.0, "min_ms": 10.0}
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def _ok(src, dst, mbit=30.0, rtt=10.0, retrans=0, segs=1000):
    return PairResult(src, dst, ended_by="max_bytes_per_pair",
                      rtt={"count": 5, "median_ms": rtt, "p95_ms": rtt + 1, "min_ms": rtt},
                      receiver={"mbit": mbit, "mean_mbit": mbit, "seconds": 1.0, "bytes": 1},
                      sender={"total_retrans": retrans, "data_segs_out": segs}, seconds=1.2)


def test_a_pair_result_crosses_the_store_and_a_bad_one_is_refused():
    res = _ok(0, 1)
    assert PairResult.from_json(res.to_json()) == res
    raw = json.loads(res.to_json())
    for bad in ({**raw, "extra": 1}, {**raw, "src": "0"}, {**raw, "seconds": True},
                {**raw, "receiver": {"mbit": -1.0}}, {**raw, "ended_by": "whim"}):
        with pytest.raises(MeasureError):
            PairResult.from_json(json.dumps(bad))
    with pytest.raises(MeasureError, match="not JSON"):
        PairResult.from_json("{")
    failed = PairResult(0, 1, error="gone")
    assert PairResult.from_json(failed.to_json()) == failed and not failed.ok


def test_a_host_report_with_a_bad_port_is_refused():
    rep = HostReport(0, "h", "198.18.0.1", 4000, "1", {}, 7)
    assert HostReport.from_json(rep.to_json()) == rep
    with pytest.raises(MeasureError, match="port = 0"):
        HostReport.from_json(json.dumps({**json.loads(rep.to_json()), "port": 0}))


def _hosts(n):
    return [HostReport(k, f"h{k}", f"198.18.0.{k + 1}", 4000, "1",
                       {"congestion_control": "cubic", "slow_start_after_idle": 1}, 1)
            for k in range(n)]


def test_the_profile_says_where_each_number_came_from():
    results = [_ok(0, 1, 20.0, 8.0, retrans=5, segs=1000), _ok(1, 0, 40.0, 8.2)]
    doc = profile_document(_hosts(2), results, bounds=MeasureBounds(), loss_from="zero",
                           date="2026-12-05T00:00:00+00:00", tool_version="9")
    link = doc["site_link"][0]
    assert (link["src"], link["dst"], link["rate_mbit"], link["latency_ms"]) == (0, 1, 20.0, 4.0)
    assert link["loss_pct"] == 0.0 and link["measured"]["retrans_pct"] == 0.5
    assert link["measured"]["ended_by"] == "max_bytes_per_pair"
    prov = doc["provenance"]
    assert prov["date"].startswith("2026") and prov["tool_version"] == "9"
    assert prov["method"]["streams"] == 1 and prov["method"]["max_bytes_per_pair"] == 64_000_000
    assert prov["method"]["order"] == [[0, 1], [1, 0]]
    assert {"rate_mbit_from", "latency_ms_from", "loss_pct_from"} <= set(prov)
    assert doc["site"][1]["tcp"]["congestion_control"] == "cubic"
    assert doc["same_site"]["rule"] == "unshaped" and doc["placement"] == "cycle"
    lossy = profile_document(_hosts(2), results, bounds=MeasureBounds(), loss_from="retransmits",
                             date="d", tool_version="9")
    assert lossy["site_link"][0]["loss_pct"] == 0.5


def test_no_profile_from_a_measurement_with_a_failed_pair():
    with pytest.raises(MeasureError, match="1->0: gone"):
        profile_document(_hosts(2), [_ok(0, 1), PairResult(1, 0, error="gone")],
                         bounds=MeasureBounds(), loss_from="zero", date="d", tool_version="9")
