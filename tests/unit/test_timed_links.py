"""Time-triggered link changes: scenario ``link`` events at ``at_s`` and link traces
(``world.TimedLinks``, ``LinkSchedule.at``, the refusals of ``check_supported``, the simulator's
``RoundLinkModel`` and ``VirtualClock``, the worker's ``LinkApplier`` on a userspace shaper, the
runner's ``EventFeed`` and the launcher's ``Conductor.change_links_by_time``): pure and fast."""
from __future__ import annotations

import math
import textwrap

import pytest
from test_world import world_of

from gasloc_emu import config as C
from gasloc_emu.emulator.worker_process import LinkApplier
from gasloc_emu.netplan import RoundLinkModel
from gasloc_emu.scenario.checks import check_supported
from gasloc_emu.scenario.events import LeaveEvent, LinkEvent, PartitionEvent, ScenarioError
from gasloc_emu.scenario.links import LinkSchedule, TimedLinks
from gasloc_emu.scenario.observed import EventFeed
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.trace import LinkTrace, TracePoint, load_link_trace
from gasloc_emu.scenario.world import World, ring_peers
from gasloc_emu.simulator.virtual_clock import Compute, Done, Mark, Recv, Send, VirtualClock
from netem.userspace import LinkShaper

MB = 1_000_000          # bytes: 1 s on the wire at 8 Mbit/s, 8 s at 1 Mbit/s
T0 = 1000.0             # a run's start on the time.time() clock (stamps pass their own now)


def shaped_base(src, dst):
    return (8.0, 5.0)


def no_caps(src, dst):
    return (None, None)


def write_trace(tmp_path, *rows: str, latency: bool = False):
    header = "time_s,src,dst,rate_mbit" + (",latency_ms" if latency else "")
    path = tmp_path / "trace.csv"
    path.write_text("\n".join((header, *rows)) + "\n")
    return path


def write_scenario(tmp_path, *tables: str):
    path = tmp_path / "scenario.toml"
    path.write_text("\n".join(f"[[event]]\n{textwrap.dedent(t).strip()}\n" for t in tables))
    return path


def cfg_of(path=None, **overrides) -> C.Config:
    base = {"workers": 4, "run.rounds": 6, "run.dashboard": "off",
            "run.scenario": str(path) if path else ""}
    return C.resolve(overrides=base | overrides)


def timed(*events, workers=4, rounds=6, trace=None, base=shaped_base) -> TimedLinks:
    out = TimedLinks.of(Scenario(tuple(events), workers, rounds), trace, base)
    assert out is not None
    return out


# ---------------------------------------------------------------- TimedLinks

def test_fields_an_event_leaves_out_keep_their_value():
    tl = timed(LinkEvent(at_s=2.0, links=((0, 1),), rate_mbit=3.0),
               LinkEvent(at_s=5.0, links=((0, 1),), latency_ms=40.0))
    assert tl.steps[(0, 1)] == [(2.0, (3.0, 5.0)), (5.0, (3.0, 40.0))]   # base latency 5 kept
    assert tl.values(0, 1) == [(3.0, 5.0), (3.0, 40.0)]
    assert tl.values(1, 0) == []                       # the other direction is another link


def test_in_force_is_none_before_the_first_step_and_piecewise_constant_after():
    tl = timed(LinkEvent(at_s=5.0, links=((0, 1),), latency_ms=40.0),
               LinkEvent(at_s=2.0, links=((0, 1),), rate_mbit=3.0))   # out of order: sorted
    at = [tl.in_force(0, 1, t) for t in (0.0, 1.999, 2.0, 4.9, 5.0, 1e6)]
    assert at == [None, None, (3.0, 5.0), (3.0, 5.0), (3.0, 40.0), (3.0, 40.0)]
    assert tl.in_force(2, 3, 10.0) is None             # a link no event changes


def test_unshaped_base_link_keeps_none_rate_under_a_latency_only_change():
    tl = timed(LinkEvent(at_s=1.0, links=((0, 1),), latency_ms=20.0),
               base=lambda s, d: (None, 0.0))
    assert tl.in_force(0, 1, 1.0) == (None, 20.0)


def test_due_is_half_open_after_exclusive_upto_inclusive():
    a = LinkEvent(at_s=1.0, links=((0, 1),), rate_mbit=3.0)
    b = LinkEvent(at_s=2.0, links=((1, 0),), rate_mbit=4.0)
    c = LinkEvent(at_s=3.0, links=((0, 1),), rate_mbit=5.0)
    tl = timed(c, a, b)
    assert tl.due(1.0, 3.0) == [b, c]
    assert tl.due(0.0, 1.0) == [a]
    assert tl.due(-math.inf, math.inf) == [a, b, c]
    assert tl.due(1.0, 1.0) == [] and tl.due(3.0, 10.0) == []


def test_a_worker_event_at_a_time_covers_every_link_of_that_worker():
    tl = timed(LinkEvent(at_s=1.0, worker=1, rate_mbit=2.0), workers=3)
    assert sorted(tl.steps) == [(0, 1), (1, 0), (1, 2), (2, 1)]
    assert all(tl.in_force(*link, 1.0) == (2.0, 5.0) for link in tl.steps)
    assert tl.in_force(0, 2, 1.0) is None


def test_trace_rows_are_steps(tmp_path):
    path = write_trace(tmp_path, "0,0,1,8,5", "10,0,1,1,5", "4,2,3,6,30", latency=True)
    trace = load_link_trace(path, 4)
    tl = timed(trace=trace)
    assert tl.steps[(0, 1)] == [(0.0, (8.0, 5.0)), (10.0, (1.0, 5.0))]
    assert tl.steps[(2, 3)] == [(4.0, (6.0, 30.0))]
    assert [ev.source for ev in tl.events] == ["trace"] * 3
    assert tl.in_force(0, 1, 9.9) == (8.0, 5.0) and tl.in_force(0, 1, 10.0) == (1.0, 5.0)


def test_trace_rows_without_latency_keep_the_base_latency():
    trace = LinkTrace({(0, 1): (TracePoint(3.0, 2.0),)})
    tl = timed(trace=trace)
    assert tl.in_force(0, 1, 3.0) == (2.0, 5.0)


def test_no_timed_change_means_no_timed_links():
    sc = Scenario((LinkEvent(round=1, links=((0, 1),), rate_mbit=3.0),), 4, 6)
    assert TimedLinks.of(sc, None, shaped_base) is None
    assert LinkSchedule(sc, 6, shaped_base).timed is None


def test_applied_rows_are_the_values_in_force_at_the_event():
    ev = LinkEvent(at_s=2.0, links=((0, 1), (1, 0)), rate_mbit=3.0)
    tl = timed(ev)
    assert tl.applied(ev) == [{"src": 0, "dst": 1, "rate_mbit": 3.0, "latency_ms": 5.0},
                              {"src": 1, "dst": 0, "rate_mbit": 3.0, "latency_ms": 5.0}]


# ---------------------------------------------------------------- LinkSchedule.at

def test_a_partition_by_round_cuts_a_timed_link_and_the_timed_value_wins_outside():
    sc = Scenario((PartitionEvent(round=2, end_round=4, groups=((0,), (1,))),
                   LinkEvent(at_s=1.0, links=((0, 1),), rate_mbit=3.0)), 2, 6)
    links = LinkSchedule(sc, 6, shaped_base)
    assert links.at(0, 1, 0, 0.5) == (8.0, 5.0)        # before the change: the round's value
    assert links.at(0, 1, 1, 1.5) == (3.0, 5.0)        # after it: the timed value
    assert links.at(0, 1, 2, 1.5)[0] == 0.0            # cut in rounds 2..3
    assert links.at(0, 1, 3, 99.0)[0] == 0.0
    assert links.at(0, 1, 4, 1.5) == (3.0, 5.0)        # restored: the timed value again
    assert links.at(1, 0, 2, 1.5)[0] == 0.0            # the untimed direction is cut too


def test_a_link_without_timed_steps_takes_its_round_value():
    sc = Scenario((LinkEvent(round=2, links=((1, 0),), rate_mbit=2.0),
                   LinkEvent(at_s=1.0, links=((0, 1),), rate_mbit=3.0)), 2, 6)
    links = LinkSchedule(sc, 6, shaped_base)
    for t, now in ((0, 0.0), (1, 5.0), (2, 5.0), (5, 100.0)):
        assert links.at(1, 0, t, now) == links.in_force(1, 0, t)
    assert links.at(1, 0, 3, 100.0) == (2.0, 5.0)
    assert links.at(0, 1, 3, 100.0) == (3.0, 5.0)


def test_timed_changes_alone_change_links():
    sc = Scenario((LinkEvent(at_s=1.0, links=((0, 1),), rate_mbit=3.0),), 2, 6)
    links = LinkSchedule(sc, 6, shaped_base)
    assert links.changes == {} and links.changes_links
    assert World(sc, 2, 6, 0.5, ring_peers).changes_links
    only_part = Scenario((PartitionEvent(round=1, groups=((0,), (1,))),), 2, 6)
    assert not LinkSchedule(only_part, 6).changes_links


def test_delays_says_whether_any_event_gives_a_link_a_latency():
    no_latency = lambda src, dst: (10.0, 0.0)  # noqa: E731
    rate_only = Scenario((LinkEvent(round=2, links=((0, 1),), rate_mbit=3.0),), 2, 6)
    assert not LinkSchedule(rate_only, 6, no_latency).delays
    by_round = Scenario((LinkEvent(round=2, links=((0, 1),), latency_ms=20.0),), 2, 6)
    assert LinkSchedule(by_round, 6, no_latency).delays
    by_time = Scenario((LinkEvent(at_s=1.0, links=((0, 1),), latency_ms=20.0),), 2, 6)
    assert LinkSchedule(by_time, 6, no_latency).delays


def test_a_trace_alone_changes_links():
    trace = LinkTrace({(0, 1): (TracePoint(3.0, 2.0),)})
    links = LinkSchedule(Scenario((), 2, 6), 6, shaped_base, trace)
    assert links.changes_links and links.at(0, 1, 0, 3.0) == (2.0, 5.0)


# ---------------------------------------------------------------- refusals

def test_a_timed_link_event_with_loss_is_refused():
    sc = Scenario((LinkEvent(at_s=2.0, links=((0, 1),), loss_pct=1.0),), 4, 6)
    with pytest.raises(ScenarioError, match=r"link event at 2 s: loss_pct = 1 is not applied"):
        check_supported(sc)


def test_a_timed_link_event_alone_is_accepted():
    sc = Scenario((LinkEvent(at_s=2.0, links=((0, 1),), rate_mbit=3.0, latency_ms=10.0),), 4, 6)
    check_supported(sc)
    world = World(sc, 4, 6, 0.5, ring_peers)
    assert world.links.timed is not None and world.links.at(0, 1, 0, 2.0) == (3.0, 10.0)


def test_a_link_changed_by_round_and_by_time_is_refused():
    sc = Scenario((LinkEvent(round=2, links=((0, 1),), rate_mbit=2.0),
                   LinkEvent(at_s=3.0, links=((2, 3), (0, 1)), rate_mbit=3.0)), 4, 6)
    with pytest.raises(ScenarioError, match=r"link 0->1 is changed both by round and by time "
                                            r"\(a link event at 3 s\); use one clock per link"):
        check_supported(sc)
    with pytest.raises(ScenarioError, match="one clock per link"):
        World(sc, 4, 6, 0.5, ring_peers)


def test_a_worker_event_by_round_and_a_timed_event_on_one_of_its_links_are_refused():
    sc = Scenario((LinkEvent(round=1, worker=2, latency_ms=9.0),
                   LinkEvent(at_s=3.0, links=((3, 2),), rate_mbit=3.0)), 4, 6)
    with pytest.raises(ScenarioError, match="link 3->2 is changed both by round and by time"):
        check_supported(sc)


def test_a_link_changed_by_round_and_by_a_trace_is_refused():
    sc = Scenario((LinkEvent(round=2, links=((1, 0),), rate_mbit=2.0),), 4, 6)
    trace = LinkTrace({(1, 0): (TracePoint(3.0, 2.0),)}, source="link trace t.csv")
    with pytest.raises(ScenarioError, match=r"link 1->0 is changed both by round and by time "
                                            r"\(link trace t.csv\)"):
        check_supported(sc, trace)
    with pytest.raises(ScenarioError, match="one clock per link"):
        World(sc, 4, 6, 0.5, ring_peers, trace=trace)
    check_supported(sc, LinkTrace({(0, 1): (TracePoint(3.0, 2.0),)}))   # another link: fine


def test_from_config_builds_a_world_from_a_trace_alone(tmp_path):
    path = write_trace(tmp_path, "0,0,1,8", "10,0,1,1")
    world = world_of(cfg_of(**{"net.link_trace": str(path), "net.shaper": "userspace"}))
    assert world is not None and world.changes_links
    assert world.links.at(0, 1, 0, 12.0)[0] == 1.0
    assert world.alive(5) == frozenset(range(4))


def test_from_config_refuses_a_trace_without_a_shaper(tmp_path):
    path = write_trace(tmp_path, "0,0,1,8", "10,0,1,1")
    with pytest.raises(ScenarioError, match=r"trace.csv with net.shaper = 'none' would not be "
                                            "applied"):
        world_of(cfg_of(**{"net.link_trace": str(path), "net.shaper": "none"}))


def test_from_config_refuses_a_scenario_and_trace_on_one_link(tmp_path):
    sc = write_scenario(tmp_path, "type = 'link'\nround = 1\nlink = [0, 1]\nrate_mbit = 2")
    path = write_trace(tmp_path, "0,0,1,8")
    with pytest.raises(ScenarioError, match="one clock per link"):
        world_of(cfg_of(sc, **{"net.link_trace": str(path), "net.shaper": "userspace"}))


# ---------------------------------------------------------------- RoundLinkModel

def test_round_link_model_times_a_message_with_the_rate_in_force_when_sent():
    sc = Scenario((LinkEvent(at_s=10.0, links=((0, 1),), rate_mbit=1.0, latency_ms=50.0),),
                  2, 6)
    model = RoundLinkModel(LinkSchedule(sc, 6, shaped_base), no_caps)
    assert model.at_round(0, 1, MB, 0, now_s=5.0) == pytest.approx((MB * 8 / 8e6, 0.005))
    assert model.at_round(0, 1, MB, 0, now_s=15.0) == pytest.approx((MB * 8 / 1e6, 0.05))
    assert model.at_round(0, 1, MB, 0) == pytest.approx((1.0, 0.005))   # default now: 0


def test_round_link_model_keeps_the_caps_under_a_timed_rate():
    sc = Scenario((LinkEvent(at_s=10.0, links=((0, 1),), rate_mbit=1.0),
                   LinkEvent(at_s=20.0, links=((0, 1),), rate_mbit=16.0)), 2, 6)
    model = RoundLinkModel(LinkSchedule(sc, 6, shaped_base), lambda s, d: (4.0, None))
    assert model.at_round(0, 1, MB, 0, now_s=5.0)[0] == pytest.approx(2.0)    # cap 4 < 8
    assert model.at_round(0, 1, MB, 0, now_s=15.0)[0] == pytest.approx(8.0)   # rate 1 < 4
    assert model.at_round(0, 1, MB, 0, now_s=25.0)[0] == pytest.approx(2.0)   # cap 4 < 16


# ---------------------------------------------------------------- VirtualClock

def clock_arrival(at_s: float) -> float:
    """Worker 0 computes 1 s then sends 1 MB to worker 1 (8 Mbit/s, 1 Mbit/s from at_s on);
    worker 1's row is marked when the message arrives."""
    sc = Scenario((LinkEvent(at_s=at_s, links=((0, 1),), rate_mbit=1.0),), 2, 2)
    model = RoundLinkModel(LinkSchedule(sc, 2, lambda s, d: (8.0, 0.0)), no_caps)
    rows = []
    vc = VirtualClock(2, model, slots=2, emit=rows.append)
    key = (1, 0, 0, "params")
    for op in (Compute(1.0), Send(key, MB), Mark({"worker": 0}), Done()):
        vc.report(0, op)
    for op in (Recv(key), Mark({"worker": 1}), Done()):
        vc.report(1, op)
    assert vc.finished()
    return {r["worker"]: r["time_s"] for r in rows}[1]


def test_virtual_clock_sends_at_the_rate_in_force_at_the_send_time():
    assert clock_arrival(0.5) == pytest.approx(1.0 + 8.0)    # changed before the send
    assert clock_arrival(2.0) == pytest.approx(1.0 + 1.0)    # changed after it


# ---------------------------------------------------------------- LinkApplier

def trace_schedule(tmp_path, *rows, latency=False, workers=2):
    trace = load_link_trace(write_trace(tmp_path, *rows, latency=latency), workers)
    return LinkSchedule(Scenario((), workers, 4), 4, shaped_base, trace)


def test_link_applier_paces_a_stamp_at_the_rate_in_force_at_its_time(tmp_path):
    schedule = trace_schedule(tmp_path, "10,0,1,1")           # 0->1 slows 8 -> 1 at 10 s
    shaper = LinkShaper(0, "userspace", {1: (8.0, 5.0)}, {}, sleep=lambda s: None)
    applier = LinkApplier(schedule, 0, shaper, no_caps)
    assert shaper.stamp(1, MB, T0 + 15) == pytest.approx(T0 + 15 + 1.0 + 0.005)   # no start
    applier.start(T0)
    applier.sending(0)
    assert shaper.stamp(1, MB, T0 + 105) == pytest.approx(T0 + 105 + 8.0 + 0.005)
    fresh = LinkShaper(0, "userspace", {1: (8.0, 5.0)}, {}, sleep=lambda s: None)
    LinkApplier(schedule, 0, fresh, no_caps).start(T0)
    assert fresh.stamp(1, MB, T0 + 5) == pytest.approx(T0 + 5 + 1.0 + 0.005)
    assert fresh.stamp(1, MB, T0 + 15) == pytest.approx(T0 + 15 + 8.0 + 0.005)


def test_link_applier_applies_the_downlink_cap_to_a_timed_rate(tmp_path):
    schedule = trace_schedule(tmp_path, "10,0,1,16")
    shaper = LinkShaper(0, "userspace", {1: (8.0, 5.0)}, {}, sleep=lambda s: None)
    LinkApplier(schedule, 0, shaper, lambda s, d: (None, 4.0)).start(T0)
    assert shaper.stamp(1, MB, T0 + 15) == pytest.approx(T0 + 15 + 2.0 + 0.005)


def test_link_applier_bounds_a_userspace_receiver_with_every_timed_value(tmp_path):
    schedule = trace_schedule(tmp_path, "10,0,1,1,5", "20,0,1,8,300", latency=True)
    rx = LinkShaper(1, "userspace", {0: (8.0, 5.0)}, {}, rx_links={0: (8.0, 5.0)})
    before = rx.latest_release_s(0, MB, 0.0)
    assert before == pytest.approx(0.005 + 0.5 + 1.0 + 0.25)
    LinkApplier(schedule, 1, rx, no_caps)                      # before start: up front
    assert rx.latest_release_s(0, MB, 0.0) == pytest.approx(0.3 + 0.5 + 8.0 + 0.25)


def test_link_applier_delay_only_adds_the_latency_in_force_at_arrival(tmp_path):
    schedule = trace_schedule(tmp_path, "10,0,1,8,50", latency=True)
    rx = LinkShaper(1, "delay-only", {0: (None, 5.0)}, {0: 5.0})
    applier = LinkApplier(schedule, 1, rx, no_caps)
    assert rx.release_at(0, None, T0 + 15) == pytest.approx(T0 + 15.005)   # before start
    applier.start(T0)
    assert rx.release_at(0, None, T0 + 5) == pytest.approx(T0 + 5.005)
    assert rx.release_at(0, None, T0 + 15) == pytest.approx(T0 + 15.05)
    assert rx.stamp(0, MB, T0 + 15) is None                    # tc paces, nothing stamped


# ---------------------------------------------------------------- EventFeed

def test_event_feed_logs_each_timed_change_once_in_order(tmp_path):
    schedule_trace = load_link_trace(write_trace(tmp_path, "1,0,1,4", "3,1,0,2", "3,0,1,1"), 2)
    world = World(Scenario((), 2, 4), 2, 4, 0.5, ring_peers, base_link=shaped_base,
                  trace=schedule_trace)
    logged = []
    feed = EventFeed(world, logged.append, shaper="userspace")
    feed.row({"round": 0, "kind": "metric", "time_s": 0.5})
    assert logged == []
    feed.row({"round": 0, "worker": 1, "time_s": 2.0})
    feed.row({"round": 0, "kind": "event", "time_s": 50.0})    # not a metric: ignored
    feed.row({"round": 1, "worker": 0, "time_s": 1.5})          # an earlier time: nothing new
    assert [(ev["at_s"], ev["links"], ev["logged_at_s"]) for ev in logged] == [
        (1.0, [[0, 1]], 2.0)]
    feed.row({"round": 1, "time_s": 3.0})
    feed.row({"round": 2, "time_s": 4.0})
    assert [(ev["at_s"], ev["links"], ev["logged_at_s"]) for ev in logged] == [
        (1.0, [[0, 1]], 2.0), (3.0, [[0, 1]], 3.0), (3.0, [[1, 0]], 3.0)]
    assert logged[0]["applied"] == [{"src": 0, "dst": 1, "rate_mbit": 4.0, "latency_ms": 5.0}]
    assert logged[1]["applied"] == [{"src": 0, "dst": 1, "rate_mbit": 1.0, "latency_ms": 5.0}]
    assert logged[2]["applied"] == [{"src": 1, "dst": 0, "rate_mbit": 2.0, "latency_ms": 5.0}]
    assert all(ev["type"] == "link" and ev["source"] == "trace" and ev["round"] is None
               and ev["applied_by"] == "userspace" for ev in logged)


def test_a_restore_record_shows_the_timed_value_the_link_comes_back_with():
    sc = Scenario((PartitionEvent(round=1, end_round=3, groups=((0,), (1,))),
                   LinkEvent(at_s=0.5, links=((0, 1),), rate_mbit=2.0)), 2, 5)
    world = World(sc, 2, 5, 0.5, ring_peers, base_link=shaped_base)
    logged = []
    feed = EventFeed(world, logged.append)
    for t in range(4):
        feed.row({"round": t, "time_s": 1.0 + t})
    restore = [ev for ev in logged if ev.get("source") == "restore"]
    assert world.links.at(0, 1, 3, 4.0) == (2.0, 5.0)          # what the network is set to
    assert restore[0]["applied"][0] == {"src": 0, "dst": 1, "rate_mbit": 2.0, "latency_ms": 5.0}



def test_a_timed_change_on_a_cut_link_is_logged_as_held():
    sc = Scenario((PartitionEvent(round=1, end_round=3, groups=((0,), (1,))),
                   LinkEvent(at_s=1.5, links=((0, 1), (1, 0)), rate_mbit=2.0)), 2, 5)
    world = World(sc, 2, 5, 0.5, ring_peers, base_link=shaped_base)
    logged = []
    feed = EventFeed(world, logged.append)
    for t in range(2):
        feed.row({"round": t, "time_s": 1.0 + t})
    (timed,) = [ev for ev in logged if ev["at_s"] == 1.5]
    assert timed["applied"] == [] and timed["held"] == [[0, 1], [1, 0]]
    assert timed["logged_at_s"] == 2.0

# ---------------------------------------------------------------- the launcher

class FakeNetwork:
    def __init__(self):
        self.calls = []

    def change_links(self, changes):
        self.calls.append(dict(changes))


def conductor(world, links_round=0, ago_s=15.0, time_scale=1.0):
    """The launcher's scenario player with a fixed clock ``ago_s`` wall seconds into the run."""
    from gasloc_emu.emulator.conductor import Conductor
    sup = Conductor(world, FakeNetwork(), world.rounds, lambda: ago_s, lambda rank, msg: None,
                    time_scale)
    sup.links_round = links_round
    return sup


def test_supervisor_passes_changes_whose_time_has_come_once():
    sc = Scenario((LinkEvent(at_s=5.0, links=((0, 1),), rate_mbit=2.0),
                   LinkEvent(at_s=10.0, links=((0, 1),), latency_ms=30.0),
                   LinkEvent(at_s=60.0, links=((1, 0),), rate_mbit=3.0)), 2, 4)
    sup = conductor(World(sc, 2, 4, 0.5, ring_peers, base_link=shaped_base))
    sup.change_links_by_time()
    sup.change_links_by_time()
    assert sup.network.calls == [{(0, 1): (2.0, 30.0)}]
    assert sup.timed_upto_s == 15.0


def test_under_time_dilation_the_conductor_plays_emulated_times_with_played_values():
    """At K = 4, 60 wall seconds are 15 emulated: the same events fire as at 15 s undilated,
    each handed to the network at rate / 4 and latency x 4, and the next one (60 s emulated)
    is waited for 4 x 45 wall seconds."""
    sc = Scenario((LinkEvent(at_s=5.0, links=((0, 1),), rate_mbit=2.0),
                   LinkEvent(at_s=10.0, links=((0, 1),), latency_ms=30.0),
                   LinkEvent(at_s=60.0, links=((1, 0),), rate_mbit=3.0)), 2, 4)
    sup = conductor(World(sc, 2, 4, 0.5, ring_peers, base_link=shaped_base), ago_s=60.0,
                    time_scale=4.0)
    sup.change_links_by_time()
    assert sup.network.calls == [{(0, 1): (0.5, 120.0)}]
    assert sup.timed_upto_s == 15.0
    assert sup.next_due_s() == pytest.approx(4 * 45.0)


def test_supervisor_skips_a_link_a_round_partition_holds_cut():
    sc = Scenario((PartitionEvent(round=1, end_round=3, groups=((0,), (1,))),
                   LinkEvent(at_s=10.0, links=((0, 1), (0, 2)), rate_mbit=2.0)), 3, 4)
    world = World(sc, 3, 4, 0.5, ring_peers, base_link=shaped_base)
    sup = conductor(world, links_round=2)                 # round 1 is in progress: cut
    sup.change_links_by_time()
    assert sup.network.calls == [{(0, 2): (2.0, 5.0)}]
    sup = conductor(world, links_round=4)                 # restored after round 3
    sup.change_links_by_time()
    assert sup.network.calls == [{(0, 1): (2.0, 5.0), (0, 2): (2.0, 5.0)}]


def test_the_launcher_waits_no_longer_than_the_next_event_at_a_time():
    """A link change and a leave at a time: the launcher's poll ends when the earlier is due
    (so each fires within its poll's millisecond, not the 0.1 s of an idle wait)."""
    sc = Scenario((LinkEvent(at_s=15.25, links=((0, 1),), rate_mbit=2.0),
                   LeaveEvent(worker=2, at_s=15.04)), 3, 4)
    sup = conductor(World(sc, 3, 4, 0.5, ring_peers, base_link=shaped_base))
    assert sup.next_due_s() == pytest.approx(0.04)       # the leave, 15.04 s into the run
    sup.clock = lambda: 15.1
    assert sup.next_due_s() == 0.0                       # overdue: no wait at all
    sup.fix_due([])
    assert sup.next_due_s() == pytest.approx(0.15)       # then the link change
    sup.clock = lambda: 15.26
    sup.change_links_by_time()
    assert sup.network.calls == [{(0, 1): (2.0, 5.0)}] and sup.next_due_s() is None
    assert conductor(World(None, 2, 4, 0.5, ring_peers)).next_due_s() is None  # no scenario
