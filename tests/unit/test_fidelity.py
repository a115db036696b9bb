"""The fidelity verdict's rules, each on hand-built inputs (report.fidelity)."""
import pytest

from gasloc_emu.report import fidelity as fd

LINKS = [fd.LinkPlan(0, 1, 40.0, 15.0), fd.LinkPlan(1, 0, 40.0, 15.0)]
QUIET = {"late_release": {"count": 1000, "p50_ms": 0.05, "p99_ms": 0.4, "max_ms": 1.1},
         "read_lag": {"count": 1000, "p50_ms": 0.02, "p99_ms": 0.3, "max_ms": 0.9},
         "engine": "c", "socket_drops": 0}
BUSY_FULL = {"busy_ms": 2000.0, "bytes_acked": int(39.5e6 / 8 * 2), "held_by": "path"}


def test_faithful_run():
    v = fd.judge(LINKS, line=QUIET, tcp={(0, 1): BUSY_FULL},
                 probe_rows=[{"src": 0, "dst": 1, "configured_mbit": 40.0, "measured_mbit": 39.2}],
                 step_time_s=0.1, step_ratios=[1.0, 1.01, 1.02])
    assert v.fidelity == "faithful" and v.reasons == () and v.worst_link is None
    assert v.to_json()["thresholds"]["lateness_limit_ms"] == pytest.approx(1.5)
    assert v.recorded["engine"] == "c"


def test_limit_is_two_ms_or_a_tenth_of_the_smallest_delay():
    assert fd.lateness_limit_ms(LINKS) == pytest.approx(1.5)
    assert fd.lateness_limit_ms([fd.LinkPlan(0, 1, 1.0, 50.0)]) == 2.0
    assert fd.lateness_limit_ms([fd.LinkPlan(0, 1, 1.0, 0.0)]) is None


def test_lateness_degrades_and_names_the_smallest_delayed_link():
    late = QUIET | {"late_release": {"count": 900, "p50_ms": 27.0, "p99_ms": 74.0, "max_ms": 90.0}}
    links = LINKS + [fd.LinkPlan(0, 2, 40.0, 5.0)]
    v = fd.judge(links, line=late)
    assert v.fidelity == "degraded" and [r.rule for r in v.reasons] == ["lateness"]
    assert v.reasons[0].numbers["p99_ms"] == 74.0 and v.line_late
    assert (v.worst_link["src"], v.worst_link["dst"]) == (0, 2)


def test_read_lag_past_the_delay_degrades():
    """A frame read after its link's delay had passed is released late whatever the line
    does: read lag is held to the smallest delay (15 ms here)."""
    v = fd.judge(LINKS, line=QUIET | {"read_lag": {"count": 5, "p50_ms": 1, "p99_ms": 16.0,
                                                    "max_ms": 20}})
    assert [r.rule for r in v.reasons] == ["read_lag"] and v.line_late
    assert v.reasons[0].numbers["limit_ms"] == 15.0
    assert v.to_json()["thresholds"]["read_lag_limit_ms"] == 15.0


def test_read_lag_within_the_delay_is_not_a_reason():
    """A frame's delay runs from the kernel's receive stamp: one read 3 ms after it arrived
    on a 15 ms link is still released at its time (its lateness says so)."""
    v = fd.judge(LINKS, line=QUIET | {"read_lag": {"count": 5, "p50_ms": 1, "p99_ms": 3.0,
                                                    "max_ms": 4}})
    assert v.faithful


def test_the_lateness_cap_holds_in_emulated_time_under_dilation():
    """At K the line's wall clock runs K times the emulated one: the 2 ms cap is 2 K wall ms,
    and the tenth of the (dilated) delay is unchanged."""
    dilated = [fd.LinkPlan(0, 1, 40.0 / 3, 45.0)]
    assert fd.lateness_limit_ms(dilated) == 2.0
    assert fd.lateness_limit_ms(dilated, time_scale=3.0) == pytest.approx(4.5)
    assert fd.lateness_limit_ms([fd.LinkPlan(0, 1, 10.0, 200.0)], time_scale=4.0) == 8.0
    late = QUIET | {"late_release": {"count": 900, "p50_ms": 0.1, "p99_ms": 3.0, "max_ms": 9.0}}
    assert not fd.judge(dilated, line=late).faithful
    assert fd.judge(dilated, line=late, time_scale=3.0).faithful


def test_python_engine_alone_is_recorded_not_a_reason():
    v = fd.judge(LINKS, line={k: v for k, v in QUIET.items() if k != "engine"})
    assert v.faithful and v.recorded["engine"] == "python"


def test_slow_path_limited_link_degrades():
    slow = {"busy_ms": 2000.0, "bytes_acked": int(30e6 / 8 * 2), "held_by": "path"}
    v = fd.judge(LINKS, tcp={(0, 1): BUSY_FULL, (1, 0): slow})
    assert [r.rule for r in v.reasons] == ["rate"]
    assert v.reasons[0].link == (1, 0)
    assert v.reasons[0].numbers["carried_mbit"] == pytest.approx(30.0)
    assert (v.worst_link["src"], v.worst_link["dst"]) == (1, 0)


@pytest.mark.parametrize("row", [
    {"busy_ms": 200.0, "bytes_acked": int(1e6), "held_by": "path"},     # too short to judge
    {"busy_ms": 2000.0, "bytes_acked": int(1e6), "held_by": "receiver"},  # not the network
])
def test_rate_unjudged_when_short_or_not_network_limited(row):
    assert fd.judge(LINKS, tcp={(0, 1): row}).faithful


def test_a_link_held_by_its_own_window_is_not_judged_by_rate():
    """Slow start after idle: 344 segments at most over 100 ms carry 39.9 Mbit/s, less than
    95 % of 50; the same link with a window that could fill it is judged."""
    links = [fd.LinkPlan(0, 1, 50.0, 50.0)]
    row = {"busy_ms": 5044.0, "bytes_acked": 3573384, "held_by": "path", "cwnd_segs_max": 344,
           "min_rtt_ms": 100.08}
    assert fd.window_mbit(row) == pytest.approx(39.8, abs=0.1)
    assert fd.judge(links, tcp={(0, 1): row}).faithful
    v = fd.judge(links, tcp={(0, 1): row | {"cwnd_segs_max": 600}})
    assert [r.rule for r in v.reasons] == ["rate"]


def test_messages_slower_than_the_tcp_model_degrade_and_replace_the_busy_rate():
    """The 8-worker expander at 40 Mbit/s and 15 ms with a late line: 0.213 s a message where
    TCP over the asked link takes 0.162 s. A faithful 2-worker exchange at 0.556 s against
    0.557 s is faithful, though its busy rate reads 11 % of the link's."""
    late = {"src": 0, "dst": 4, "training_messages": 8, "training_transfer_s": 8 * 0.213,
            "tcp_model_message_s": 0.162}
    v = fd.judge(LINKS, transfers=[late])
    assert [r.rule for r in v.reasons] == ["transfer"]
    assert v.reasons[0].numbers["ratio"] == pytest.approx(0.213 / 0.162, rel=1e-3)
    assert (v.worst_link["src"], v.worst_link["dst"]) == (0, 4)
    links = [fd.LinkPlan(0, 1, 50.0, 50.0)]
    ok = {"src": 0, "dst": 1, "training_messages": 8, "training_transfer_s": 8 * 0.556,
          "tcp_model_message_s": 0.557}
    busy = {"busy_ms": 5044.0, "bytes_acked": 3573384, "held_by": "path", "cwnd_segs_max": 600,
            "min_rtt_ms": 100.0}
    assert fd.judge(links, tcp={(0, 1): busy}, transfers=[ok]).faithful
    assert not fd.judge(links, tcp={(0, 1): busy}).faithful   # without the model: judged
    # the first message also waited for its connection's handshakes: the mean reads 1.12x,
    # the median over rounds is the model's
    first_slow = ok | {"training_transfer_s": 8 * 0.621}
    assert not fd.judge(links, transfers=[first_slow]).faithful
    assert fd.judge(links, transfers=[first_slow | {"training_message_s_median": 0.557}]).faithful


def test_probe_below_its_rate_degrades():
    v = fd.judge(LINKS, probe_rows=[{"src": 0, "dst": 1, "configured_mbit": 40.0,
                                      "measured_mbit": 30.0}])
    assert [r.rule for r in v.reasons] == ["probe"] and v.worst_link["dst"] == 1


def test_compute_overrun_at_the_median_degrades():
    v = fd.judge(LINKS, step_time_s=0.1, step_ratios=[1.2, 1.3, 1.0])
    assert [r.rule for r in v.reasons] == ["compute"]
    assert v.reasons[0].numbers["p50_ratio"] == pytest.approx(1.2)
    assert fd.judge(LINKS, step_time_s=None, step_ratios=[2.0]).faithful   # measured steps


def test_of_links_record_reads_links_json_rows():
    rec = {"links": [{"src": 0, "dst": 1, "configured_mbit": 40.0, "configured_latency_ms": 15.0,
                      "measured_mbit": 39.0,
                      "tcp_training": {"busy_ms": 1000.0, "bytes_acked": int(2e6),
                                       "held_by": "path"}}],
           "packet_line": QUIET}
    v = fd.of_links_record(rec)
    assert [r.rule for r in v.reasons] == ["rate"]


def test_bad_plan_is_refused_naming_it():
    with pytest.raises(fd.FidelityError, match="rate_mbit -1"):
        fd.LinkPlan(0, 1, -1, 1.0)


def test_describe_prints_the_verdict_worst_link_and_each_reason():
    late = QUIET | {"late_release": {"count": 9, "p50_ms": 27.0, "p99_ms": 74.0, "max_ms": 90.0}}
    lines = fd.describe(fd.judge(LINKS, line=late).to_json())
    assert lines[0] == "fidelity: degraded (worst link 0->1)"
    assert lines[1].startswith("  lateness: ") and "p99 74 ms" in lines[1]
    assert fd.describe(None) == []
    assert fd.describe(fd.judge(LINKS).to_json()) == ["fidelity: faithful"]
