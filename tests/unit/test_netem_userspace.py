"""Sender virtual clock, receiver release times, specs and the release queue."""
from __future__ import annotations

import json
import threading
import time

import pytest

from gasloc_emu.config import NetConfig
from netem.capabilities import Decision
from netem.profiles import build_link_plan
from netem.userspace import LinkShaper, ReleaseQueue, ShapingError, shaping_from_spec, spec_for

MB = 1_000_000


def shaper(mode="userspace", up=None, max_queue_s=0.5, sleeps=None):
    tx = {1: (8.0, 10.0), 2: (80.0, 0.0)}           # 8 Mbit/s + 10 ms to 1, 80 Mbit/s to 2
    rx = {1: 20.0} if mode == "delay-only" else {}
    # a recorded sleep: these tests use made-up clocks, real sleeping would only slow them
    return LinkShaper(0, mode, tx, rx, up, max_queue_s,
                      sleep=(sleeps if sleeps is not None else []).append)


def test_stamp_serialises_messages_on_a_link():
    s = shaper()
    assert s.stamp(1, MB, now=100.0) == pytest.approx(100.0 + 1.0 + 0.010)
    # a second message queued behind the first, even if it is stamped at the same time
    assert s.stamp(1, MB // 2, now=100.0) == pytest.approx(101.5 + 0.010)
    # after the link drained, it starts from now again
    assert s.stamp(1, MB // 8, now=200.0) == pytest.approx(200.125 + 0.010)


def test_links_have_independent_clocks():
    s = shaper()
    s.stamp(1, MB, now=0.0)
    assert s.stamp(2, MB, now=0.0) == pytest.approx(0.1)


def test_uplink_cap_is_shared_by_all_links():
    s = shaper(up=10.0)
    assert s.stamp(2, MB, now=0.0) == pytest.approx(0.8)          # 10 Mbit/s, not 80
    assert s.stamp(2, MB, now=0.0) == pytest.approx(1.6)
    assert s.stamp(1, MB, now=0.0) == pytest.approx(2.4 + 0.010)  # waits for the shared uplink


def test_backpressure_waits_while_the_queue_ahead_is_over_the_bound():
    sleeps: list[float] = []
    s = shaper(max_queue_s=0.5, sleeps=sleeps)
    s.stamp(1, MB // 4, now=0.0)         # 0.25 s of data on an empty link: no wait
    s.stamp(1, MB, now=0.0)              # 0.25 s ahead of it, under the bound: no wait
    assert sleeps == []
    assert s.queued_s(1, now=0.0) == pytest.approx(1.25)
    assert s.stamp(1, MB // 8, now=0.0) == pytest.approx(1.25 + 0.125 + 0.010)
    assert sleeps == [pytest.approx(0.75)]   # until 0.5 s was left ahead of it


def test_a_slow_link_does_not_hold_up_another():
    """Gossip sends one model to each neighbour; each link carries its own at its own rate,
    and no send waits for another link's queue."""
    sleeps: list[float] = []
    s = shaper(max_queue_s=0.5, sleeps=sleeps)
    assert s.stamp(1, 2 * MB, now=0.0) == pytest.approx(2.0 + 0.010)   # 2 s at 8 Mbit/s
    assert s.stamp(2, 2 * MB, now=0.0) == pytest.approx(0.2)           # 80 Mbit/s, at once
    assert sleeps == []


def test_a_capped_uplink_keeps_stamps_within_the_receivers_bound():
    sleeps: list[float] = []
    s = shaper(up=1.0, max_queue_s=0.5, sleeps=sleeps)     # 1 Mbit/s shared, 80 to worker 2
    assert s.stamp(2, MB // 8, now=0.0) == pytest.approx(1.0)
    # 1 s of uplink for a message the link would carry in 0.0125 s: the sender waits the
    # rest, so the stamp is within max_queue_s + the link's transfer of the send
    assert sleeps == [pytest.approx(1.0 - 0.5 - 0.0125)]


def test_release_at_in_userspace_mode_is_the_delivery_time():
    s = shaper()
    assert s.release_at(1, deliver_at=5.0, arrival=4.0) == 5.0
    assert s.release_at(1, deliver_at=5.0, arrival=6.0) == 6.0    # never before it arrived
    assert s.release_at(1, deliver_at=None, arrival=6.0) == 6.0


def test_delay_only_mode_delays_at_the_receiver():
    s = shaper("delay-only")
    assert s.stamp(1, MB, now=0.0) is None
    assert s.release_at(1, None, arrival=3.0) == pytest.approx(3.020)
    assert s.release_at(2, None, arrival=3.0) == 3.0               # no latency from 2


def test_shaper_validation():
    with pytest.raises(ShapingError, match="mode = 'tc'"):
        LinkShaper(0, "tc", {}, {})
    with pytest.raises(ShapingError, match="max_queue_s"):
        LinkShaper(0, "userspace", {}, {}, max_queue_s=0)
    with pytest.raises(ShapingError, match="no link to worker 7"):
        shaper().stamp(7, 10, 0.0)


# ---------------------------------------------------------------- specs

def plan_of(profile="uniform", workers=3, **net):
    return build_link_plan(NetConfig(bw_profile=profile, **net), workers, 0)


def test_userspace_spec_round_trips_through_json(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"default": {"rate_mbit": 50, "latency_ms": 5},
                                "worker": [{"id": 1, "up_mbit": 20, "down_mbit": 10}]}))
    plan = build_link_plan(NetConfig(bw_profile=str(path)), 3, 0)
    spec = json.loads(json.dumps(spec_for(plan, Decision("userspace", "release-queue", "t"))))
    assert spec["mode"] == "userspace" and spec["up_mbit"] == {"1": 20}
    s0, s1 = shaping_from_spec(spec, 0), shaping_from_spec(spec, 1)
    assert s0.stamp(1, MB, now=0.0) == pytest.approx(0.8 + 0.005)     # 1's downlink: 10 Mbit/s
    assert s0.stamp(2, MB, now=0.0) == pytest.approx(0.16 + 0.005)
    assert s1.stamp(0, MB, now=0.0) == pytest.approx(0.4 + 0.005)     # 1's uplink: 20 Mbit/s


def test_delay_only_spec_only_where_tc_has_no_netem():
    plan = plan_of(latency_ms=20.0)
    spec = spec_for(plan, Decision("tc", "release-queue", "t"))
    assert spec["mode"] == "delay-only"
    s = shaping_from_spec(spec, 2)
    assert s.stamp(0, 100, 0.0) is None and s.release_at(0, None, 1.0) == pytest.approx(1.02)
    assert spec_for(plan, Decision("tc", "netem", "t")) is None
    assert spec_for(plan_of(), Decision("tc", "release-queue", "t")) is None   # no latency
    assert spec_for(plan_of(""), Decision("userspace", "release-queue", "t")) is None
    assert spec_for(plan, Decision("none", "none", "t")) is None
    assert shaping_from_spec(None, 0) is None


def test_malformed_spec():
    with pytest.raises(ShapingError, match="malformed shaping spec for worker 0"):
        shaping_from_spec({"mode": "userspace"}, 0)


# ---------------------------------------------------------------- release queue

def test_release_queue_orders_by_release_time():
    now = [10.0]
    rq = ReleaseQueue(shaper("delay-only"), clock=lambda: now[0])
    assert rq.push(1, None, 10.0, "from-1") == pytest.approx(10.02)
    assert rq.push(2, None, 10.001, "from-2") == pytest.approx(10.001)
    assert [item for _, item, _ in rq.pop_due()] == []
    now[0] = 10.01
    assert [item for _, item, _ in rq.pop_due()] == ["from-2"]
    assert rq.next_due() == pytest.approx(10.02) and len(rq) == 1
    now[0] = 11.0
    assert [(src, item) for src, item, _ in rq.pop_due()] == [(1, "from-1")]


def test_release_queue_wait_blocks_until_due():
    rq = ReleaseQueue(None)
    due = time.time() + 0.05
    rq.push(0, due, due, "x")                # no shaper: released at its arrival time
    t = time.time()
    got = rq.wait(2.0)
    assert [item for _, item, _ in got] == ["x"] and time.time() >= due
    assert time.time() - t < 1.0
    assert rq.wait(0.01) == []


def test_release_queue_wait_wakes_on_push():
    rq = ReleaseQueue(None)
    threading.Timer(0.05, lambda: rq.push(3, None, time.time(), "late")).start()
    got = rq.wait(2.0)
    assert [(src, item) for src, item, _ in got] == [(3, "late")]


# ---------------------------------------------------------------- links that change in a run

def test_set_link_paces_from_now_on_and_keeps_what_is_queued():
    s = shaper()
    first = s.stamp(1, MB, now=100.0)
    assert first == pytest.approx(101.010)
    s.set_link(1, 4.0)                   # half the rate, latency kept
    # the first message keeps its stamp and its place: the next starts when it has left
    assert s.stamp(1, MB // 2, now=100.0) == pytest.approx(101.0 + 1.0 + 0.010)
    s.set_link(1, 4.0, latency_ms=50.0)
    assert s.stamp(1, MB // 2, now=200.0) == pytest.approx(200.0 + 1.0 + 0.050)
    assert s.stamp(2, MB, now=200.0) == pytest.approx(200.1)    # other links untouched


def test_set_link_none_is_unshaped_but_the_uplink_cap_still_counts():
    s = shaper()
    s.set_link(1, None)
    assert s.stamp(1, 10 * MB, now=5.0) == pytest.approx(5.010)
    capped = shaper(up=10.0)
    capped.set_link(1, None, latency_ms=0.0)
    assert capped.stamp(1, MB, now=0.0) == pytest.approx(0.8)


def test_a_cut_link_refuses_to_stamp_until_it_has_a_rate_again():
    from netem.userspace import LinkCutError
    s = shaper()
    s.stamp(1, MB, now=0.0)
    s.set_link(1, 0)
    with pytest.raises(LinkCutError, match=r"link 0->1 is cut \(rate 0, a partition\)"):
        s.stamp(1, 100, now=0.5)
    assert issubclass(LinkCutError, ShapingError)
    assert s.queued_s(1, now=0.5) == pytest.approx(0.5)    # what was stamped stays
    assert s.stamp(2, MB, now=0.5) == pytest.approx(0.6)
    s.set_link(1, 8.0)                                     # restored
    assert s.stamp(1, MB, now=10.0) == pytest.approx(11.010)


def test_delay_only_mode_stamps_nothing_even_when_cut():
    s = shaper("delay-only")
    s.set_link(1, 0, latency_ms=5.0)
    assert s.stamp(1, MB, now=0.0) is None


def rx_shaper(mode="userspace"):
    """Worker 0 receiving from 1 at 8 Mbit/s + 10 ms (and in delay-only mode 20 ms of delay)."""
    return LinkShaper(0, mode, {1: (8.0, 10.0)}, {1: 20.0} if mode == "delay-only" else {},
                      rx_links={1: (8.0, 10.0)}, sleep=[].append)


def test_set_rx_link_widens_the_bound_and_never_narrows_it():
    s = rx_shaper()
    slack = 0.5 + 0.25                                     # max_queue_s + RELEASE_SLACK_S
    assert s.latest_release_s(1, MB, arrival=0.0) == pytest.approx(0.010 + 1.0 + slack)
    s.set_rx_link(1, 4.0, 100.0)                           # slower, later: the new values
    assert s.latest_release_s(1, MB, arrival=0.0) == pytest.approx(0.100 + 2.0 + slack)
    # faster and sooner: messages stamped under the old values may still arrive
    s.set_rx_link(1, 80.0, 0.0)
    assert s.latest_release_s(1, MB, arrival=0.0) == pytest.approx(0.100 + 2.0 + slack)
    s.set_rx_link(1, 0)                                    # a cut stamps nothing new
    assert s.latest_release_s(1, MB, arrival=0.0) == pytest.approx(0.100 + 2.0 + slack)
    # a sender the shaper was not told about gets a bound from its first values
    s.set_rx_link(2, 1.0, 30.0)
    assert s.latest_release_s(2, MB, arrival=1.0) == pytest.approx(1.0 + 0.030 + 8.0 + slack)


def test_set_rx_link_moves_the_release_delay_in_delay_only_mode_only():
    now = [3.0]
    s = rx_shaper("delay-only")
    rq = ReleaseQueue(s, clock=lambda: now[0])
    assert rq.push(1, None, 3.0, "old") == pytest.approx(3.020)
    s.set_rx_link(1, None, 50.0)
    assert rq.push(1, None, 3.0, "new") == pytest.approx(3.050)
    s.set_rx_link(1, None, 5.0)                            # the delay may shrink, the bound not
    assert s.release_at(1, None, arrival=3.0) == pytest.approx(3.005)
    assert s.latest_release_s(1, 0, arrival=3.0) == pytest.approx(3.0 + 0.050 + 0.75)
    now[0] = 3.03
    assert [item for _, item, _ in rq.pop_due()] == ["old"]     # held ones keep their times
    u = rx_shaper()                                        # userspace: latency is in the stamp
    u.set_rx_link(1, None, 50.0)
    assert u.release_at(1, deliver_at=None, arrival=3.0) == 3.0


@pytest.mark.parametrize("call, message", [
    (lambda s: s.set_link(1, -1.0), r"link 0->1 rate_mbit = -1.0 is out of range; expected "
                                    r"None \(unshaped\), 0 \(cut\) or a finite rate > 0"),
    (lambda s: s.set_link(1, float("nan")), "rate_mbit = nan is out of range"),
    (lambda s: s.set_link(1, float("inf")), "rate_mbit = inf is out of range"),
    (lambda s: s.set_link(1, "5"), "rate_mbit = '5' is out of range"),
    (lambda s: s.set_link(1, True), "rate_mbit = True is out of range"),
    (lambda s: s.set_link(1, 5.0, -1.0), r"link 0->1 latency_ms = -1.0 is out of range; "
                                         r"expected a value in \[0, 60000\]"),
    (lambda s: s.set_link(1, 5.0, 60_001), "latency_ms = 60001 is out of range"),
    (lambda s: s.set_link(1, 5.0, float("nan")), "latency_ms = nan is out of range"),
    (lambda s: s.set_link(7, 5.0), "worker 0 has no link to worker 7"),
    (lambda s: s.set_rx_link(1, -2), r"link 1->0 rate_mbit = -2 is out of range"),
    (lambda s: s.set_rx_link(1, 5.0, 1e9), r"link 1->0 latency_ms = 1000000000.0 is out of"),
    (lambda s: s.set_rx_link(0, 5.0), "src = 0 is not a worker that sends to worker 0"),
    (lambda s: s.set_rx_link(-1, 5.0), "src = -1 is not a worker"),
])
def test_bad_link_values_are_refused_naming_the_value(call, message):
    s = rx_shaper()
    with pytest.raises(ShapingError, match=message):
        call(s)
    assert s.stamp(1, MB, now=0.0) == pytest.approx(1.010)   # nothing was changed


def test_set_link_while_another_thread_stamps():
    s = shaper()
    stamps: list[float] = []
    done = threading.Event()

    def sender():
        for _ in range(2000):
            stamps.append(s.stamp(1, 1000, now=0.0))
        done.set()
    th = threading.Thread(target=sender)
    th.start()
    rates = iter(range(10**6))
    while not done.is_set():
        s.set_link(1, 8.0 if next(rates) % 2 else 80.0)
    th.join()
    # one virtual clock, each message after the one before, at one rate or the other
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert all(g == pytest.approx(1e-3) or g == pytest.approx(1e-4) for g in gaps)
