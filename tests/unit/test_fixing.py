"""Leaves, joins and partitions at a time: the rule that fixes each at a round
(``fixing.RoundFixer``), the world that plays them from there (``World.fix``), the virtual
clock's alarms and parked workers, and what is refused before a run."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gasloc_emu.scenario.checks import _alive_during, check_supported
from gasloc_emu.scenario.events import (
    JoinEvent,
    LeaveEvent,
    LinkEvent,
    PartitionEvent,
    ScenarioError,
)
from gasloc_emu.scenario.fixing import Fixing, RoundFixer, timed_items, touch_of
from gasloc_emu.scenario.observed import event_text, round_records
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.world import World, by_round, ring_peers
from gasloc_emu.simulator.virtual_clock import Compute, Done, Park, Start, VirtualClock

ROUNDS = 10


def _scenario(*events, workers: int = 4) -> Scenario:
    return Scenario(tuple(events), workers, ROUNDS)


# ---------------------------------------------------------------- the rule

def test_an_event_is_fixed_one_round_after_the_highest_started():
    fixer = RoundFixer(_scenario(LeaveEvent(at_s=2.0, worker=1)))
    assert fixer.alarms_s == [2.0] and fixer.due(1.9) == []
    for t in (0, 1, 3, 2):   # workers start rounds out of step
        fixer.started(t)
    assert fixer.due(2.0) == [Fixing(0, "start", 2.0, 4)]
    assert fixer.alarms_s == [] and not fixer.pending and fixer.due(99.0) == []


def test_one_time_shares_a_round_and_later_times_never_do():
    fixer = RoundFixer(_scenario(LeaveEvent(at_s=1.0, worker=1), LeaveEvent(at_s=1.0, worker=2),
                                 JoinEvent(at_s=1.5, worker=1)))
    fixer.started(0)
    # nothing started in between, yet the join at a later time takes the next round
    assert [(f.index, f.round) for f in fixer.due(1.5)] == [(0, 1), (1, 1), (2, 2)]


def test_a_partition_end_is_fixed_on_its_own_and_before_a_start_at_its_time():
    sc = _scenario(PartitionEvent(at_s=1.0, end_s=2.0, groups=((0,), (1,))),
                   PartitionEvent(at_s=2.0, groups=((2,), (3,))))
    assert timed_items(sc) == [(1.0, 0, "start"), (2.0, 0, "end"), (2.0, 1, "start")]
    fixer = RoundFixer(sc)
    fixer.started(3)
    assert fixer.due(1.0) == [Fixing(0, "start", 1.0, 4)]
    fixer.started(6)
    assert fixer.due(2.0) == [Fixing(0, "end", 2.0, 7), Fixing(1, "start", 2.0, 7)]


def test_events_by_round_are_not_the_fixers():
    assert timed_items(_scenario(LeaveEvent(round=3, worker=1),
                                 LinkEvent(at_s=1.0, links=((0, 1),), rate_mbit=5.0))) == []


def test_a_fixing_round_trips_through_json_and_junk_is_refused():
    f = Fixing(2, "end", 1.5, 7)
    assert Fixing.from_json(f.to_json()) == f
    for bad in ({"index": 0, "part": "middle", "at_s": 1.0, "round": 2},
                {"index": -1, "part": "start", "at_s": 1.0, "round": 2},
                {"index": 0, "part": "start", "at_s": 1.0, "round": -2}):
        with pytest.raises(ValueError, match="not a fixing"):
            Fixing.from_json(bad)


def _rounds(fixer: RoundFixer, now_s: float) -> dict[tuple[int, str], int]:
    return {(f.index, f.part): f.round for f in fixer.due(now_s)}


def test_crashes_of_different_workers_share_rounds_and_each_restart_follows_its_crash():
    # three crashes, each back 0.5 s later, all due before any new round starts: one change a
    # round would take rounds 1-6; the leaves share round 1 and the joins round 2
    crashes = [ev for w, t in ((0, 1.0), (1, 1.1), (2, 1.2))
               for ev in (LeaveEvent(at_s=t, worker=w), JoinEvent(at_s=t + 0.5, worker=w))]
    fixer = RoundFixer(_scenario(*crashes))
    fixer.started(0)
    assert _rounds(fixer, 9.0) == {(0, "start"): 1, (2, "start"): 1, (4, "start"): 1,
                                   (1, "start"): 2, (3, "start"): 2, (5, "start"): 2}


def test_a_worker_s_own_events_and_its_named_donor_keep_their_order():
    fixer = RoundFixer(_scenario(LeaveEvent(at_s=1.0, worker=3), LeaveEvent(at_s=1.5, worker=2),
                                 JoinEvent(at_s=2.0, worker=3, from_worker=1),
                                 LeaveEvent(at_s=2.5, worker=1), JoinEvent(at_s=3.0, worker=2)))
    fixer.started(4)
    # 2's leave shares 3's round; 1 gives 3 its parameters at round 6, so it leaves after it;
    # 2's join follows 2's leave only
    assert _rounds(fixer, 9.0) == {(0, "start"): 5, (1, "start"): 5, (2, "start"): 6,
                                   (3, "start"): 7, (4, "start"): 6}


def test_a_later_leave_may_come_first_while_a_worker_remains_and_a_joiner_has_a_donor():
    # 0 leaves and comes back, then 1 leaves: on three workers 1's leave shares 0's round
    # (2 stays); on two it would leave nobody there, and next to 0's join no donor for it
    events = (LeaveEvent(at_s=1.0, worker=0), JoinEvent(at_s=2.0, worker=0),
              LeaveEvent(at_s=3.0, worker=1))
    assert _rounds(RoundFixer(_scenario(*events, workers=3)), 9.0) == {
        (0, "start"): 0, (1, "start"): 1, (2, "start"): 0}
    sc = _scenario(*events, workers=2)
    assert _rounds(RoundFixer(sc), 9.0) == {(0, "start"): 0, (1, "start"): 1, (2, "start"): 2}
    for leave_round, words in ((0, "no worker would be alive"), (1, "no worker alive both")):
        with pytest.raises(ScenarioError, match=words):
            by_round(sc, [Fixing(0, "start", 1.0, 0), Fixing(1, "start", 2.0, 1),
                          Fixing(2, "start", 3.0, leave_round)])


def test_a_partition_is_ordered_against_every_event():
    fixer = RoundFixer(_scenario(
        LeaveEvent(at_s=1.0, worker=0), PartitionEvent(at_s=1.5, end_s=2.5, groups=((1,), (2,))),
        LeaveEvent(at_s=2.0, worker=3), JoinEvent(at_s=3.0, worker=0), workers=5))
    fixer.started(1)
    assert _rounds(fixer, 9.0) == {(0, "start"): 2, (1, "start"): 3, (2, "start"): 4,
                                   (1, "end"): 5, (3, "start"): 6}


def test_an_unplanned_event_is_ordered_against_its_workers():
    sc = _scenario(LeaveEvent(at_s=0.5, worker=1), JoinEvent(at_s=1.0, worker=4),
                   JoinEvent(at_s=2.5, worker=1), LeaveEvent(at_s=2.5, worker=3), workers=5)
    fixer = RoundFixer(sc)
    fixer.started(0)
    assert _rounds(fixer, 1.0) == {(0, "start"): 1, (1, "start"): 1}
    assert fixer.fixed_unplanned(2.0, ranks=[2, 3]) == 1   # it touches neither 1 nor 4
    # 3's leave comes after it; 1's join, at the same time, after 1's leave: one round
    assert _rounds(fixer, 2.5) == {(2, "start"): 2, (3, "start"): 2}
    assert fixer.fixed_unplanned(3.5) == 3                  # every worker: after everything
    assert fixer.round_at(3.5, touch_of(LeaveEvent(at_s=3.5, worker=0))) == 3
    assert fixer.round_at(3.6, touch_of(LeaveEvent(at_s=3.6, worker=0))) == 4
    for bad in ([], [-1], [True]):
        with pytest.raises(ValueError, match="expected at least one worker rank"):
            fixer.fixed_unplanned(4.0, ranks=bad)


def test_a_host_loss_decided_before_the_events_due_then_orders_them_as_at_its_time():
    # the conductor fixes a loss at the clock's now before it fixes an event due earlier: that
    # event counts as at the loss's time, so it shares no round before the loss's
    fixer = RoundFixer(_scenario(LeaveEvent(at_s=1.0, worker=1)))
    assert fixer.fixed_unplanned(2.0, ranks=[1]) == 0
    assert fixer.due(2.0) == [Fixing(0, "start", 1.0, 0)]
    fixer = RoundFixer(_scenario(LeaveEvent(at_s=1.0, worker=1), LeaveEvent(at_s=3.0, worker=2)))
    assert fixer.fixed_unplanned(2.0) == 0 and _rounds(fixer, 2.5) == {(0, "start"): 0}
    assert _rounds(fixer, 3.0) == {(1, "start"): 1}


def test_the_launcher_fixes_a_lost_host_against_its_workers_only():
    from gasloc_emu.emulator.conductor import Conductor
    world = World(_scenario(LeaveEvent(at_s=0.5, worker=0), JoinEvent(at_s=1.0, worker=0),
                            workers=6), 6, 20, 0.5, ring_peers, armed=True)
    now = [1.0]
    conductor = Conductor(world, None, 20, lambda: now[0], lambda rank, msg: None)
    world.fixer.started(3)
    conductor.fix_due([])
    assert [f.round for f in world.fixings] == [4, 5]
    now[0] = 1.5
    loss = conductor.lose_host(1, "h1", [2, 3], {2: 2, 3: 3})
    # round 4, with 0's leave, not after 0's join at round 5: it concerns workers 2 and 3
    assert loss.round == 4 and world.alive(4) == {1, 4, 5} and world.alive(5) == {0, 1, 4, 5}


# ---------------------------------------------------------------- the rule, on random timelines

def _old_rounds(items, ops) -> dict[tuple[int, str], int]:
    """The rule before, written out: every event one round after the highest started and at
    least one after the event fixed before it at an earlier time."""
    out, highest, last, k = {}, -1, None, 0
    for op, value in ops:
        if op == "start":
            highest = max(highest, value)
            continue
        while k < len(items) and items[k][0] <= value:
            at_s, index, part = items[k]
            r = highest + 1 if last is None else max(highest + 1,
                                                     last[1] + (at_s > last[0]))
            out[index, part], last, k = r, (at_s, r), k + 1
    return out


def _workers_of(ev) -> set[int] | None:
    """Whom an event concerns, written out: None for a partition (everyone)."""
    if isinstance(ev, PartitionEvent):
        return None
    return {ev.worker} | ({ev.from_worker} - {None} if isinstance(ev, JoinEvent) else set())


@st.composite
def _timelines(draw):
    """A scenario's leaves, joins (some from a named donor) and partitions at times that the
    scenario accepts, on 2-5 workers (the last may be new), some at one time."""
    workers = draw(st.integers(2, 5))
    newcomer = draw(st.booleans())
    alive = set(range(workers - newcomer))
    events, t, cut_end = [], 0.0, 0.0
    for _ in range(draw(st.integers(1, 16))):
        t = round(t + draw(st.sampled_from([0.0, 0.1, 0.3, 1.0])), 3)
        kind = draw(st.sampled_from(["leave", "join", "partition"]))
        gone = sorted(set(range(workers)) - alive)
        if kind == "leave" and len(alive) > 1:
            w = draw(st.sampled_from(sorted(alive)))
            alive.discard(w)
            events.append(LeaveEvent(at_s=t, worker=w))
        elif kind == "join" and gone:
            w = draw(st.sampled_from(gone))
            donor = draw(st.sampled_from([None, *sorted(alive)])) if t >= cut_end else None
            alive.add(w)
            events.append(JoinEvent(at_s=t, worker=w, from_worker=donor))
        elif kind == "partition" and t >= cut_end and len(alive) > 1:
            members = draw(st.permutations(sorted(alive)))
            k = draw(st.integers(1, len(members) - 1))
            end_s = draw(st.sampled_from([None, 0.1, 0.5, 2.0]))
            end_s = None if end_s is None else round(t + end_s, 3)
            events.append(PartitionEvent(at_s=t, end_s=end_s, groups=(tuple(members[:k]),
                                                                       tuple(members[k:]))))
            cut_end = end_s if end_s is not None else math.inf
    try:
        sc = Scenario(tuple(events), workers, draw(st.sampled_from([6, 40])))
        check_supported(sc)
    except ScenarioError:   # events at one time it refuses (a donor changes or is cut then)
        assume(False)
    return sc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(sc=_timelines(), data=st.data())
def test_on_random_timelines_the_rule_keeps_every_order_and_is_never_later(sc, data):
    fixer = RoundFixer(sc)
    ops, now_s, fixings = [], 0.0, []
    for _ in range(data.draw(st.integers(1, 30))):
        if data.draw(st.booleans()):   # a worker starts a round, out of step with the others
            ops.append(("start", max(fixer.highest_started, 0) + data.draw(st.integers(-2, 3))))
            fixer.started(ops[-1][1])
        else:
            now_s += data.draw(st.sampled_from([0.05, 0.1, 0.5, 2.0]))
            ops.append(("due", now_s))
            new = fixer.due(now_s)
            # no event is fixed at a round any worker has started
            assert all(f.round > fixer.highest_started for f in new)
            fixings += new
    ops.append(("due", math.inf))
    fixings += fixer.due(math.inf)
    assert not fixer.pending and len(fixings) == len(timed_items(sc))
    got = {(f.index, f.part): f.round for f in fixings}
    old = _old_rounds(timed_items(sc), ops)
    assert all(got[k] <= old[k] for k in got)   # never later than one change a round
    items = timed_items(sc)
    for a_s, a, a_part in items:
        for b_s, b, b_part in items:
            if a_s >= b_s:
                continue
            wa, wb = _workers_of(sc.events[a]), _workers_of(sc.events[b])
            # a worker's own events (a join's donor among them), and a partition against
            # everything, keep their time order in rounds
            if wa is None or wb is None or wa & wb:
                assert got[a, a_part] < got[b, b_part], (a, a_part, b, b_part)
    # what the fixings make of the scenario is one it allows: a worker alive in every round,
    # each join with a donor alive in the round before and its own, one cut at a time (the
    # scenario by round checks them all); and every worker can plan every round
    world = World(sc, sc.workers, sc.rounds, 0.5, ring_peers)
    world.fix(fixings)
    for t in range(sc.rounds):
        assert world.alive(t)
        for rank in world.alive(t) - (world.alive(t - 1) if t else world.alive(0)):
            plan = world.plan(rank, t)
            assert plan.join_from is None or plan.join_from in world.alive(t - 1) & plan.alive
    # a cut whose groups hold every worker alive while it lasts (DiLoCo's check, on times)
    # holds every worker alive in its rounds
    for index, p in enumerate(sc.events):
        named = set(p.groups[0] + p.groups[1]) if isinstance(p, PartitionEvent) else None
        if named is None or any(alive - named for _, alive in _alive_during(sc, p, sc.rounds)):
            continue
        end = got.get((index, "end"), sc.rounds)
        assert all(world.alive(t) <= named for t in range(got[index, "start"],
                                                            min(end, sc.rounds)))


# ---------------------------------------------------------------- the world

def _world(*events, workers: int = 4) -> World:
    return World(_scenario(*events, workers=workers), workers, ROUNDS, 0.5, ring_peers)


def test_a_world_plays_what_is_fixed_and_nothing_before():
    world = _world(LeaveEvent(at_s=1.0, worker=2), JoinEvent(at_s=3.0, worker=2))
    assert world.fixer is not None and world.alive(9) == {0, 1, 2, 3}
    world.fix([Fixing(0, "start", 1.0, 4)])
    assert world.alive(3) == {0, 1, 2, 3} and world.alive(4) == {0, 1, 3}
    assert world.plan(2, 4).leaving and world.plan(1, 4).detect_s == 0.5
    assert world.awaits_join(2, 5)   # its join is not fixed yet
    assert world.left_and_joined() == [{"type": "leave", "worker": 2, "round": 4, "at_s": 1.0}]
    assert round_records(world, 4)[0] | {"detected_by": None} == {
        "type": "leave", "round": 4, "at_s": 1.0, "worker": 2, "detected_by": None}
    assert event_text(round_records(world, 4)[0]) == "round 4 (at_s 1): worker 2 leaves"
    assert world.not_fired() == [{"type": "join", "part": "start", "at_s": 3.0, "worker": 2}]
    world.fix([Fixing(0, "start", 1.0, 4), Fixing(1, "start", 3.0, 7)])   # repeats ignored
    assert len(world.fixings) == 2 and world.alive(7) == {0, 1, 2, 3}
    assert not world.awaits_join(2, 5) and world.plan(2, 7).join_from == 0   # lowest living
    assert world.not_fired() == []


@pytest.mark.parametrize("leave_round, restores", [(1, False), (2, False), (3, True)])
def test_a_join_at_a_time_from_a_checkpoint_takes_one_only_where_its_worker_wrote_one(
        leave_round, restores):
    """Checkpoints every 3 rounds end rounds 2, 5, 8: a worker that leaves at round 1 or 2
    took part in none of them and comes back from a donor; one that leaves at round 3 took
    part in round 2 and comes back from its checkpoint. Every worker can tell which from the
    rounds alone."""
    world = World(_scenario(LeaveEvent(at_s=1.0, worker=2),
                            JoinEvent(at_s=3.0, worker=2, from_checkpoint=True)),
                  4, ROUNDS, 0.5, ring_peers, checkpoint_every=3)
    world.fix([Fixing(0, "start", 1.0, leave_round), Fixing(1, "start", 3.0, 7)])
    plan = world.plan(2, 7)
    assert plan.join_checkpoint is restores
    assert plan.join_from == (None if restores else 0)    # the lowest living worker
    assert world.plan(0, 7).donate_to == (() if restores else (2,))
    assert round_records(world, 7)[0].get("from_worker") == plan.join_from


def test_a_new_worker_is_absent_until_its_join_is_fixed():
    world = _world(JoinEvent(at_s=2.0, worker=3))
    assert world.alive(0) == {0, 1, 2} and world.alive(9) == {0, 1, 2}
    assert world.awaits_join(3, 0) and not world.awaits_join(1, 0)
    world.fix([Fixing(0, "start", 2.0, ROUNDS)])   # at a round the run does not have
    assert not world.awaits_join(3, 5) and world.alive(9) == {0, 1, 2}
    assert world.not_fired() == [{"type": "join", "part": "start", "at_s": 2.0, "worker": 3}]


def test_a_partition_at_a_time_cuts_from_its_start_until_its_end_is_fixed():
    world = _world(PartitionEvent(at_s=1.0, end_s=2.0, groups=((0, 1), (2, 3))))
    world.fix([Fixing(0, "start", 1.0, 3)])
    assert world.cut_edges(2) == frozenset() and (1, 2) in world.cut_edges(9)
    assert world.plan(1, 3).detect_s == 0.5    # it loses neighbour 2
    world.fix([Fixing(0, "end", 2.0, 5)])
    assert (1, 2) in world.cut_edges(4) and world.cut_edges(5) == frozenset()
    assert world.heals(5)
    part = [r for r in round_records(world, 3) if r["type"] == "partition"][0]
    assert (part["at_s"], part["end_s"], part["end_round"]) == (1.0, 2.0, 5)


# ---------------------------------------------------------------- refusals

def test_leaves_joins_and_partitions_use_one_clock():
    sc = _scenario(LeaveEvent(at_s=1.0, worker=1), PartitionEvent(round=2, groups=((0,), (2,))))
    with pytest.raises(ScenarioError, match=r"leave event at 1 s and partition event at round 2: "
                                            r"leave, join and partition events must all use"):
        check_supported(sc)
    check_supported(_scenario(LeaveEvent(at_s=1.0, worker=1),
                              LinkEvent(round=2, links=((0, 2),), rate_mbit=5.0)))


def test_a_join_at_a_time_from_a_donor_cut_off_then_is_refused():
    # the joiner may be in a group of a partition that starts with its join
    part = PartitionEvent(at_s=2.0, end_s=3.0, groups=((0, 1), (2, 3)))
    events = (LeaveEvent(at_s=0.5, worker=3), part)
    with pytest.raises(ScenarioError, match=r"join of worker 3 at 2 s from worker 1: the "
                                            r"partition at 2 s cuts them apart then"):
        check_supported(_scenario(*events, JoinEvent(at_s=2.0, worker=3, from_worker=1)))
    check_supported(_scenario(*events, JoinEvent(at_s=2.0, worker=3, from_worker=2)))


def test_a_world_takes_only_fixings_of_its_own_events_at_a_time():
    world = _world(LeaveEvent(at_s=1.0, worker=2), LinkEvent(at_s=0.5, links=((0, 1),),
                                                            rate_mbit=5.0))
    for bad in (Fixing(1, "start", 0.5, 3), Fixing(0, "end", 1.0, 3), Fixing(7, "start", 1.0, 3)):
        with pytest.raises(ValueError, match="the scenario has no such leave, join or partition"):
            world.fix([bad])
    assert world.fixings == []
    assert World(_scenario(LeaveEvent(round=2, worker=1)), 4, ROUNDS, 0.5,
                 ring_peers).fixer is None


# ---------------------------------------------------------------- the virtual clock

class _Alarms:
    """A timed world for the clock alone: records what happens when."""

    def __init__(self, times, clock_ref):
        self.times, self.clock_ref, self.log = list(times), clock_ref, []

    def next_alarm_s(self):
        return self.times[0] if self.times else None

    def alarm(self, now_s):
        self.log.append(("alarm", now_s, dict(self.starts)))
        self.times.pop(0)
        if len(self.clock_ref[0].lanes) > 1:
            self.clock_ref[0].unpark(1)

    starts: dict = {}

    def started(self, rank, t):
        self.starts = self.starts | {rank: t}
        self.log.append(("start", rank, t))

    def released(self):
        self.log.append(("released",))


def test_the_clock_fixes_at_an_alarm_before_a_round_starts_at_that_time():
    ref = [None]
    tw = _Alarms([1.0], ref)
    clock = ref[0] = VirtualClock(1, None, 1.0, timed_world=tw)
    clock.report(0, Start(0))
    clock.report(0, Compute(1.0, dedicated=True))
    clock.report(0, Start(1))   # at 1.0: the alarm fires first
    assert tw.log == [("start", 0, 0), ("alarm", 1.0, {0: 0}), ("start", 0, 1)]
    assert clock.lanes[0].started == 1


def test_a_parked_worker_waits_for_an_alarm_without_holding_up_the_clock():
    ref = [None]
    tw = _Alarms([2.5], ref)
    clock = ref[0] = VirtualClock(2, None, 2.0, timed_world=tw)
    clock.report(1, Park())
    for _ in range(3):
        clock.report(0, Compute(1.0, dedicated=True))
    assert clock.now_s == 2.5 and clock.lanes[1].state == "ready" and clock.lanes[1].woken == 1


def test_an_alarm_before_the_replay_reaches_a_park_wakes_that_worker():
    # worker 1's thread reports its Park while its lane still computes (the replay lags the
    # threads); the alarm at 1.0 that fixes its join comes before the lane reaches the Park:
    # the worker is woken, never parked with no alarm left to wake it
    ref = [None]
    tw = _Alarms([1.0], ref)
    clock = ref[0] = VirtualClock(2, None, 2.0, timed_world=tw)
    clock.report(1, Compute(2.0, dedicated=True))
    clock.report(1, Park())
    clock.report(0, Compute(3.0, dedicated=True))
    assert clock.now_s == 2.0 and tw.log[0][:2] == ("alarm", 1.0)
    assert clock.lanes[1].woken == 1 and clock.lanes[1].state == "ready"


def test_parked_workers_are_released_once_the_others_are_done():
    tw = _Alarms([50.0], [None])
    clock = VirtualClock(2, None, 2.0, timed_world=tw)
    clock.report(1, Park())
    clock.report(0, Compute(1.0, dedicated=True))
    clock.report(0, Done())
    assert clock.lanes[1].released and tw.log == [("released",)]
    clock.report(1, Done())
    assert clock.finished()


@pytest.mark.parametrize("finished", [True, False])
def test_a_released_worker_leaves_no_final_model(finished):
    # released (its join never came) while parked at its own leave round, a worker has not
    # dropped its state: the simulator drops it, as run's released process sends no final
    # report; one that finished its rounds keeps its model
    import threading
    from types import SimpleNamespace

    from gasloc_emu.simulator.simulate import _worker_loop
    errors = []
    driver = SimpleNamespace(worker=object(), run=lambda first: finished)
    life = SimpleNamespace(rank=1, first=0, driver=driver,
                           transport=SimpleNamespace(finish=lambda: None))
    hub = SimpleNamespace(cond=threading.RLock(), take_turn=lambda rank: None,
                          abort=errors.append)
    _worker_loop(life, hub)
    assert not errors and (driver.worker is not None) == finished


def test_diloco_refuses_a_partition_at_a_time_that_leaves_a_living_worker_out():
    from gasloc_emu import config as C
    from gasloc_emu.algorithms import DiLoCo
    from gasloc_emu.scenario.checks import check_with_config
    cfg = C.resolve(overrides={"workers": 4, "algo.name": "diloco", "run.rounds": ROUNDS})
    joins_late = (LeaveEvent(at_s=0.5, worker=3), JoinEvent(at_s=2.0, worker=3))
    part = PartitionEvent(at_s=1.0, end_s=3.0, groups=((0, 1), (2,)))
    with pytest.raises(ScenarioError, match=r"partition at 1 s: worker 3 is alive at 2 s and in "
                                            r"neither group"):
        check_with_config(_scenario(*joins_late, part), cfg, DiLoCo)
    ends_first = PartitionEvent(at_s=1.0, end_s=2.0, groups=((0, 1), (2,)))
    check_with_config(_scenario(*joins_late, ends_first), cfg, DiLoCo)


# ---------------------------------------------------------------- in simulate

CRASHES = """
[faults]
seed = 3
horizon_s = 1.8

[[faults.crash]]
mtbf_s = 0.8
duration_median_s = 0.1
"""


def _simulate_crashes(tmp_path, algo: str, out: str) -> tuple[dict, list[dict]]:
    from gasloc_emu import config as C
    from gasloc_emu.plan import build_plan
    from gasloc_emu.simulator.simulate import simulate
    (tmp_path / "s.toml").write_text(CRASHES)
    cfg = C.resolve(overrides={
        "workers": 4, "algo.name": algo, "topology.name": "ring", "algo.local_steps": 3,
        "run.rounds": 12, "run.eval_every": 4, "run.scenario": str(tmp_path / "s.toml"),
        "run.dashboard": "off", "run.failure_detect_s": 0.05, "compute.step_time_s": 0.05})
    summary = simulate(build_plan(cfg), tmp_path / out)
    return summary, summary["membership"]["changes"]


@pytest.mark.integration
@pytest.mark.parametrize("algo", ["gasloc", "diloco"])
def test_simulate_fires_more_of_a_crash_heavy_timeline_than_one_change_a_round(
        tmp_path, monkeypatch, algo):
    """Crashes every 0.2 s on average (4 workers, MTBF 0.8 s, back after 0.1 s) against
    rounds of 0.15 s: one membership change a round (every event touching every worker, the
    rule before) plays fewer of them than fixing each against its own workers."""
    from gasloc_emu.scenario import fixing
    summary, changes = _simulate_crashes(tmp_path, algo, "now")
    with monkeypatch.context() as m:
        m.setattr(fixing, "touch_of", lambda ev: None)
        before, before_changes = _simulate_crashes(tmp_path, algo, "before")
    assert summary["status"] == before["status"] == "ok"
    leaves = [c for c in changes if c["type"] == "leave"]
    rounds = [c["round"] for c in changes]
    assert len(leaves) > sum(c["type"] == "leave" for c in before_changes)
    assert len(set(rounds)) < len(rounds)   # some round has several leaves and joins
    assert sorted(c["round"] for c in before_changes) == sorted(
        set(c["round"] for c in before_changes))   # before: one a round
    # each worker's leaves and joins alternate, in rounds as in time
    for w in {c["worker"] for c in changes}:
        mine = [c for c in changes if c["worker"] == w]
        assert [c["type"] for c in mine] == ["leave", "join"] * (len(mine) // 2) + (
            ["leave"] if len(mine) % 2 else [])
        assert [c["round"] for c in mine] == sorted({c["round"] for c in mine})
        assert [c["at_s"] for c in mine] == sorted(c["at_s"] for c in mine)
    if algo == "diloco":   # joiners of one round took over their donors' state: one model
        assert summary["consensus_distance"] == 0.0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(sc=_timelines(), data=st.data())
def test_hosts_lost_and_back_amid_random_timelines_keep_a_valid_world(sc, data):
    """Node 0's decisions among the scenario's events at times, as the launcher takes them:
    hosts (sets of workers) lost without warning and back, between rounds started and times
    reached. Every world is a scenario its own check accepts (or the loss that would leave no
    worker is refused, the world unchanged); a lost worker is absent from its loss's round to
    its return's; what is left out is said; and the rounds before a decision stay as they
    were, as every worker has played them."""
    from gasloc_emu.scenario.hostloss import HostBack, HostLoss
    from gasloc_emu.scenario.world import World, ring_peers
    w = World(sc, sc.workers, sc.rounds, 0.0, ring_peers, armed=True)
    now_s, rows = 0.0, dict.fromkeys(range(sc.workers), -1)
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["start", "due", "lose", "back"]))
        started = w.fixer.highest_started
        before = [w.alive(t) for t in range(started + 1)]
        if op == "start":
            w.fixer.started(max(started, 0) + data.draw(st.integers(0, 2)))
            rows = {r: w.fixer.highest_started - 1 for r in rows}
        elif op == "due":   # with the hosts lost, the scenario's leaves may leave nobody
            now_s += data.draw(st.sampled_from([0.05, 0.3, 1.0]))
            new = w.fixer.due(now_s)
            try:
                w.fix(new)
            except ScenarioError:
                assert not set(new) & set(w.fixings) and w.losses
                return
        elif op == "lose":
            ranks = data.draw(st.sets(st.sampled_from(range(sc.workers)), min_size=1))
            ranks -= w.lost_now()
            if not ranks or started < 0:
                continue
            now_s += 0.01   # decided later than anything before (node 0 serves in between)
            at = w.fixer.round_at(now_s, frozenset(ranks))
            loss = HostLoss(1, "h", tuple(ranks), at, now_s, {r: rows[r] for r in ranks})
            try:
                w.lose(loss)
                w.fixer.fixed_unplanned(now_s, ranks)
            except ScenarioError:
                assert loss not in w.losses
        elif w.lost_now():
            now_s += 0.01
            ranks = data.draw(st.sets(st.sampled_from(sorted(w.lost_now())), min_size=1))
            ret = HostBack(1, "h", tuple(ranks), w.fixer.fixed_unplanned(now_s, ranks), now_s)
            w.back(ret)
        assert [w.alive(t) for t in range(started + 1)] == before
        for t in range(sc.rounds):
            assert w.alive(t)
            for r in w.lost_now() | {r for x in w.losses for r in x.ranks}:
                lost_at = [x.round for x in w.losses if r in x.ranks and x.round <= t]
                back_at = [x.round for x in w.backs if r in x.ranks and x.round <= t]
                if lost_at and (not back_at or max(back_at) <= max(lost_at)):
                    assert r not in w.alive(t), (r, t)
    assert all(s["why"] for s in w.skipped)
