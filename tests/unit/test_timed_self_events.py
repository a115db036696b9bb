"""Speed and pause events at a time: one worker's own, taken at its first inner phase that
starts at or after their time, by the emulator's clock or the simulator's virtual one."""
from __future__ import annotations

import pytest

from gasloc_emu import config as C
from gasloc_emu.algorithms import GASLoC
from gasloc_emu.scenario.checks import check_supported, check_with_config
from gasloc_emu.scenario.events import PauseEvent, ScenarioError, SpeedEvent
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.world import SelfTimeline, World, ring_peers
from gasloc_emu.simulator.virtual_clock import Compute, Done, Mark, VirtualClock


def test_self_timeline_hands_out_each_due_event_once_in_time_order():
    tl = SelfTimeline([PauseEvent(at_s=3.0, worker=1, seconds=0.5),
                       SpeedEvent(at_s=1.0, worker=1, speed=0.5),
                       SpeedEvent(at_s=2.0, worker=1, speed=0.25),
                       PauseEvent(at_s=2.5, worker=1, seconds=1.0)])
    assert tl.due(0.9) == (None, 0.0)
    assert tl.due(2.7) == (0.25, 1.0)   # the later speed wins; the pause is taken
    assert tl.due(2.7) == (None, 0.0)   # once
    assert tl.due(10.0) == (None, 0.5)


def test_world_gives_each_worker_its_own_timed_events():
    sc = Scenario((SpeedEvent(at_s=1.0, worker=1, speed=0.5),
                   PauseEvent(at_s=2.0, worker=2, seconds=1.0)), 4, 6)
    check_supported(sc)
    world = World(sc, 4, 6, 0.5, ring_peers)
    assert world.timed_self(0) is None
    assert world.timed_self(1).due(5.0) == (0.5, 0.0)
    assert world.timed_self(2).due(5.0) == (None, 1.0)
    assert world.plan(1, 3).speed is None   # not a round's: the runner's clock decides


def test_a_worker_s_speed_at_rounds_and_at_a_time_is_refused():
    sc = Scenario((SpeedEvent(round=2, worker=1, speed=0.5),
                   SpeedEvent(at_s=3.0, worker=1, speed=0.25)), 4, 6)
    with pytest.raises(ScenarioError, match="worker 1's speed is set both at rounds and at a"):
        check_supported(sc)
    check_supported(Scenario((SpeedEvent(round=2, worker=1, speed=0.5),
                              SpeedEvent(at_s=3.0, worker=2, speed=0.25)), 4, 6))


def test_a_speed_at_a_time_with_a_time_budget_is_refused():
    sc = Scenario((SpeedEvent(at_s=3.0, worker=1, speed=0.5),), 4, 6)
    cfg = C.resolve(overrides={"workers": 4, "compute.step_time_s": 0.1,
                               "compute.inner_budget_s": 1.0})
    with pytest.raises(ScenarioError, match="compute.inner_budget_s = 1: the steps"):
        check_with_config(sc, cfg, GASLoC)
    check_with_config(Scenario((PauseEvent(at_s=3.0, worker=1, seconds=1.0),), 4, 6), cfg,
                      GASLoC)


def _replay(events, rounds: int = 4, compute_s: float = 1.0, base_speed: float = 1.0):
    """Worker 0 computes ``compute_s`` per round; returns its rows as the clock emits them."""
    rows = []
    clock = VirtualClock(1, None, 1.0, rows.append,
                         timed_self={0: (SelfTimeline(events), base_speed)})
    for t in range(rounds):
        clock.report(0, Compute(compute_s, dedicated=True))
        clock.report(0, Mark({"worker": 0, "round": t, "speed": base_speed,
                              "compute_s": compute_s}))
    clock.report(0, Done())
    return rows


def test_clock_applies_a_timed_speed_from_the_first_compute_at_or_after_its_time():
    rows = _replay([SpeedEvent(at_s=1.5, worker=0, speed=0.5)])
    # rounds start at 0, 1, 2 (>= 1.5: at half speed from here), 4
    assert [r["time_s"] for r in rows] == [1.0, 2.0, 4.0, 6.0]
    assert [r["speed"] for r in rows] == [1.0, 1.0, 0.5, 0.5]
    assert [r["compute_s"] for r in rows] == [1.0, 1.0, 2.0, 2.0]


def test_clock_stands_a_lane_still_for_a_timed_pause_before_its_compute():
    rows = _replay([PauseEvent(at_s=0.5, worker=0, seconds=0.75)])
    assert [r["time_s"] for r in rows] == [1.0, 2.75, 3.75, 4.75]
    assert all(r["compute_s"] == 1.0 and r["speed"] == 1.0 for r in rows)


def test_clock_scales_from_the_thread_s_own_speed():
    # the thread computes at 0.5 (its profile's speed): a timed speed of 0.25 doubles the work
    rows = _replay([SpeedEvent(at_s=0.0, worker=0, speed=0.25)], rounds=2, base_speed=0.5)
    assert [r["time_s"] for r in rows] == [2.0, 4.0] and rows[0]["speed"] == 0.25
