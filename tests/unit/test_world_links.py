"""Round-triggered link and partition events (``world.LinkSchedule``, ``World``'s cuts,
``topology.LivingGraph``'s cut edges, ``netplan.RoundLinkModel``): pure and fast."""
from __future__ import annotations

import numpy as np
import pytest
from test_world import world_of

from gasloc_emu import config as C
from gasloc_emu.netplan import LinkCut, RoundLinkModel
from gasloc_emu.scenario.events import (
    JoinEvent,
    LeaveEvent,
    LinkEvent,
    PartitionEvent,
    ScenarioError,
)
from gasloc_emu.scenario.links import LinkSchedule
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.world import World, graph_peers, ring_peers
from gasloc_emu.simulator.virtual_clock import Done, Recv, Send, VirtualClock
from gasloc_emu.topology import LivingGraph, Topology

ALL4 = frozenset(range(4))


def shaped_base(src, dst):
    return (10.0, 5.0)


def partition_world(rounds=8, peers=None, topo=None, extra=()):
    sc = Scenario((PartitionEvent(round=3, end_round=6, groups=((0, 1), (2, 3))), *extra),
                  4, rounds)
    topo = topo or Topology("ring", 4)
    return World(sc, 4, rounds, 0.5, peers or graph_peers(topo))


def test_a_link_event_sets_the_values_for_its_round_and_later():
    sc = Scenario((LinkEvent(round=3, links=((0, 1),), rate_mbit=2.0),), 4, 6)
    links = LinkSchedule(sc, 6, shaped_base)
    assert [links.in_force(0, 1, t) for t in (0, 2, 3, 5)] == \
        [(10.0, 5.0), (10.0, 5.0), (2.0, 5.0), (2.0, 5.0)]
    assert links.in_force(1, 0, 5) == (10.0, 5.0)     # the other direction is another link
    assert links.changes_links


def test_an_unshaped_link_changed_then_restored_reads_back_unshaped():
    sc = Scenario((PartitionEvent(round=2, end_round=4, groups=((0,), (1,))),
                   LinkEvent(round=3, links=((2, 3),), latency_ms=40.0)), 4, 6)
    links = LinkSchedule(sc, 6)
    assert links.in_force(0, 1, 1) == (None, 0.0)
    assert links.in_force(0, 1, 2) == (0.0, 0.0) and links.cut(2) == {(0, 1), (1, 0)}
    assert links.in_force(0, 1, 4) == (None, 0.0) and links.cut(4) == frozenset()
    assert links.in_force(2, 3, 3) == (None, 40.0)


def test_a_change_inside_a_cut_is_held_until_the_restore():
    sc = Scenario((PartitionEvent(round=2, end_round=4, groups=((0,), (1,))),
                   LinkEvent(round=3, links=((0, 1),), rate_mbit=3.0)), 2, 6)
    links = LinkSchedule(sc, 6, shaped_base)
    assert links.in_force(0, 1, 3) == (0.0, 5.0)
    assert links.in_force(0, 1, 4) == (3.0, 5.0)


def test_cut_edges_are_absent_from_the_living_graph():
    ring = Topology("ring", 4)
    cut = {3: {(2, 1), (0, 3)}}
    g = LivingGraph(ring, lambda t: ALL4, lambda t: cut.get(t, ()))
    assert g.peers(1, 3) == [0] and g.peers(2, 3) == [3]
    assert g.row(1, 3) == (0.5, {0: 0.5})          # MH over the remaining degrees
    w = g.mixing_matrix(3)
    assert np.allclose(w.sum(0), 1) and np.allclose(w, w.T)
    assert np.array_equal(g.mixing_matrix(2), ring.mixing_matrix(2))   # nothing cut: the same


@pytest.mark.parametrize("name", ["matching", "matching2"])
def test_matchings_are_drawn_without_cut_edges(name):
    topo = Topology(name, 6, seed=1)
    cut = frozenset((a, b) for a in (0, 1, 2) for b in (3, 4, 5))
    g = LivingGraph(topo, lambda t: frozenset(range(6)), lambda t: cut if t % 2 else ())
    for t in range(8):
        if t % 2:
            assert not g.edges(t) & cut and g.edges(t)
        else:
            assert g.edges(t) == topo.edges(t)


def test_the_first_round_of_a_cut_costs_failure_detection_to_who_loses_a_neighbour():
    world = partition_world()
    assert [world.plan(r, 3).detect_s for r in range(4)] == [0.5] * 4   # ring 0-1-2-3-0
    assert all(world.plan(r, t).detect_s == 0 for r in range(4) for t in (2, 4, 6))
    assert world.plan(1, 3).alive == ALL4
    star = Topology("ring", 4)
    w2 = World(Scenario((PartitionEvent(round=3, groups=((0,), (2,))),), 4, 8), 4, 8, 0.5,
               graph_peers(star))
    assert [w2.plan(r, 3).detect_s for r in range(4)] == [0.0] * 4   # 0 and 2 are not peers


def test_diloco_rings_are_the_groups_during_a_partition():
    world = partition_world(peers=ring_peers)
    assert world.ring_members(2)(4) == {2, 3} and world.ring_members(0)(4) == {0, 1}
    assert world.ring_members(2)(6) == ALL4
    assert ring_peers(0, 4, ALL4, cut=world.cut_edges(4)) == [1]


def test_a_named_donor_across_the_cut_is_refused_and_the_default_stays_on_its_side():
    extra = (LeaveEvent(round=4, worker=2), JoinEvent(round=5, worker=2, from_worker=0))
    with pytest.raises(ScenarioError, match="from worker 0: a partition cuts them apart"):
        partition_world(extra=extra)
    ok = partition_world(extra=(LeaveEvent(round=4, worker=2), JoinEvent(round=5, worker=2)))
    assert ok.plan(2, 5).join_from == 3     # its ring neighbours are 1 and 3; 1 is cut


def test_a_partition_costs_nothing_to_the_graph_without_cuts():
    """Without a partition the world's living graph is the full one (bit for bit)."""
    sc = Scenario((LinkEvent(round=1, links=((0, 1),), rate_mbit=3.0),), 4, 4)
    world = World(sc, 4, 4, 0.5, graph_peers(Topology("ring", 4)))
    assert not world.reshapes and world.cut_edges(2) == frozenset()


def write(tmp_path, text):
    p = tmp_path / "s.toml"
    p.write_text(text)
    return str(p)


def cfg(tmp_path, text, **over):
    return C.resolve(overrides={"workers": 4, "run.rounds": 8, "run.dashboard": "off",
                                "run.scenario": write(tmp_path, text)} | over)


PART_2 = "[[event]]\ntype='partition'\nround=2\ngroups=[[0,1],[2]]\n"


def test_diloco_refuses_a_living_worker_in_neither_group(tmp_path):
    with pytest.raises(ScenarioError, match="worker 3 is alive in round 2 and in neither group"):
        world_of(cfg(tmp_path, PART_2, **{"algo.name": "diloco"}))
    assert world_of(cfg(tmp_path, PART_2)).partitions   # gossip: 3 keeps both sides


def test_loss_and_an_explicit_no_shaper_are_refused(tmp_path):
    loss = "[[event]]\ntype='link'\nround=2\nlink=[0,1]\nloss_pct=1.0\n"
    with pytest.raises(ScenarioError, match="loss_pct = 1 is not applied"):
        world_of(cfg(tmp_path, loss))
    rate = "[[event]]\ntype='link'\nround=2\nlink=[0,1]\nrate_mbit=1.0\n"
    with pytest.raises(ScenarioError, match="net.shaper = 'none' would not be applied"):
        world_of(cfg(tmp_path, rate, **{"net.shaper": "none"}))


def test_the_round_link_model_times_each_message_by_its_round():
    sc = Scenario((LinkEvent(round=3, links=((0, 1),), rate_mbit=2.0),
                   PartitionEvent(round=5, groups=((0,), (1,)))), 2, 6)
    model = RoundLinkModel(LinkSchedule(sc, 6), lambda s, d: (None, 4.0))
    assert model.at_round(0, 1, 10**6, 2) == (2.0, 0.0)        # unshaped but the 4 Mbit/s cap
    assert model.at_round(0, 1, 10**6, 3) == (4.0, 0.0)
    with pytest.raises(LinkCut, match="round 5 from worker 0 to worker 1"):
        model.at_round(0, 1, 1, 5)
    clock = VirtualClock(2, model, slots=2)
    for rnd in (2, 3):
        clock.report(0, Send((1, 0, rnd, "z"), 10**6))
    clock.report(0, Done())
    for rnd in (2, 3):
        clock.report(1, Recv((1, 0, rnd, "z")))
    clock.report(1, Done())
    assert clock.now_s == pytest.approx(2.0 + 4.0)   # round 2 at 4 Mbit/s, round 3 at 2


@pytest.mark.parametrize(("scenario", "plays"), [
    (None, False),
    ("[[event]]\ntype = 'partition'\ngroups = [[0, 1], [2, 3]]\nround = 2\nend_round = 4\n",
     True),
    ("[[event]]\ntype = 'link'\nlink = [0, 1]\nround = 2\nrate_mbit = 5\n", True),
    ("[[event]]\ntype = 'speed'\nworker = 1\nround = 2\nspeed = 0.5\n", False),
])
def test_a_multi_host_run_takes_tc_only_when_no_link_changes_during_the_run(
        tmp_path, scenario, plays):
    """Host tc does not change its classes mid-run: a scenario that would is given the
    userspace shaper under auto, and refused under tc, before anything starts."""
    from gasloc_emu.netplan import multi_host_decision
    from gasloc_emu.plan import build_plan
    from netem.capabilities import CapabilityError
    sets = {"workers": 4, "run.rounds": 6, "net.bw_profile": "uniform", "net.rate_mbit": 10.0}
    if scenario is not None:
        (tmp_path / "s.toml").write_text(scenario)
        sets["run.scenario"] = str(tmp_path / "s.toml")
    plan = build_plan(C.resolve(overrides=sets), data=False)
    got = plan.world is not None and plan.world.plays_links
    assert got == plays
    auto = multi_host_decision(plan.cfg, plan.link_plan, {0: "", 1: ""}, got)
    assert auto.shaper == ("userspace" if plays else "tc")
    tc = C.replace(plan.cfg, **{"net.shaper": "tc"})
    if plays:
        with pytest.raises(CapabilityError, match="not possible across hosts: the scenario "
                                                  "changes links during the run"):
            multi_host_decision(tc, plan.link_plan, {0: "", 1: ""}, got)
    else:
        assert multi_host_decision(tc, plan.link_plan, {0: "", 1: ""}, got).shaper == "tc"


@pytest.mark.parametrize("delay", ["packet-line", "netem"])
def test_a_multi_host_run_refuses_a_delay_mode_on_packets(delay):
    """Across hosts the receivers hold the latency: a packet delay asked for is refused,
    naming it, rather than silently replaced by the release queue."""
    from gasloc_emu.netplan import multi_host_decision
    from gasloc_emu.plan import build_plan
    from netem.delay import DelayModeError
    sets = {"workers": 4, "run.rounds": 6, "net.bw_profile": "uniform", "net.rate_mbit": 10.0,
            "net.latency_ms": 20.0}
    plan = build_plan(C.resolve(overrides=sets), data=False)
    assert multi_host_decision(plan.cfg, plan.link_plan, {0: "", 1: ""}).delay == \
        "release-queue"
    asked = C.replace(plan.cfg, **{"net.delay": delay})
    with pytest.raises(DelayModeError, match=f"net.delay = '{delay}' is not possible across "
                                             r"hosts.*\['auto', 'release-queue'\]"):
        multi_host_decision(asked, plan.link_plan, {0: "", 1: ""})
    rq = C.replace(plan.cfg, **{"net.delay": "release-queue"})
    assert multi_host_decision(rq, plan.link_plan, {0: "", 1: ""}).shaper == "tc"
