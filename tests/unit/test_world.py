"""What a scenario means for each worker in each round (``gasloc_emu.world``), without a run:
membership, leaving, joining and donors, the time spent noticing a departure, speeds, pauses,
what a config may combine with a scenario, and the run record's membership summary.
"""
from __future__ import annotations

import math
import textwrap

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.scenario.events import JoinEvent, LeaveEvent, PauseEvent, ScenarioError, SpeedEvent
from gasloc_emu.scenario.observed import membership_summary
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.world import RoundPlan, World, ring_peers
from gasloc_emu.topology import LivingGraph, Topology
from gasloc_emu.topology import from_config as topology_from_config


def world_of(cfg):
    """The world the run plan derives from ``cfg`` (None without a scenario or a trace)."""
    return build_plan(cfg, data=False).world


FD = 2.5          # failure_detect_s of the hand-built worlds
ROUNDS = 10
ALL4 = frozenset(range(4))


def ring_neighbours(n: int):
    """The full ring's neighbours of a worker (what ``from_config`` derives from the graph)."""
    return lambda rank: sorted({(rank - 1) % n, (rank + 1) % n})


def graph_world(sc: Scenario | None, topo: Topology, rounds: int, fd: float = FD) -> World:
    """A gossip run's world, built as ``from_config`` builds it from the full graph."""
    return World(sc, topo.n, rounds, fd,
                 lambda rank, t, alive: LivingGraph(topo, lambda _t: alive).peers(rank, t),
                 lambda rank: sorted(j for e in topo.possible_edges if rank in e
                                     for j in e if j != rank))


def rejoin_scenario(from_worker: int | None = None) -> Scenario:
    """4 workers: worker 2 leaves at round 3 and joins again at round 6."""
    return Scenario((LeaveEvent(worker=2, round=3),
                     JoinEvent(worker=2, round=6, from_worker=from_worker)), 4, ROUNDS)


def write_scenario(tmp_path, *tables: str):
    path = tmp_path / "scenario.toml"
    path.write_text("\n".join(f"[[event]]\n{textwrap.dedent(t).strip()}\n" for t in tables))
    return path


def cfg_of(path=None, **overrides) -> C.Config:
    base = {"workers": 4, "run.rounds": ROUNDS, "run.dashboard": "off",
            "run.scenario": str(path) if path else ""}
    return C.resolve(overrides=base | overrides)


LEAVE_2_AT_3 = "type = 'leave'\nround = 3\nworker = 2"
JOIN_2_AT_6 = "type = 'join'\nround = 6\nworker = 2"


# ---------------------------------------------------------------- plan on a ring of 4

@pytest.mark.parametrize(("from_worker", "donor"), [(None, 1), (3, 3)])
def test_plan_of_a_leave_and_rejoin_on_a_ring_of_four(from_worker, donor):
    """DiLoCo's ring: worker 2 misses rounds 3..5, its ring peers of round 2 (1 and 3) spend
    failure_detect_s at round 3 only; at round 6 it starts from its donor, the lowest-ranked
    living neighbour of the full ring (1) unless the scenario names one."""
    world = World(rejoin_scenario(from_worker), 4, ROUNDS, FD, ring_peers, ring_neighbours(4))
    assert world.churns
    for t in range(ROUNDS):
        alive = ALL4 - {2} if 3 <= t < 6 else ALL4
        assert world.alive(t) == alive, t
        for rank in range(4):
            plan = world.plan(rank, t)
            assert isinstance(plan, RoundPlan)
            assert plan.alive == alive and plan.active == (rank in alive), (rank, t)
            assert plan.leaving == (rank == 2 and t == 3), (rank, t)
            assert plan.join_from == (donor if (rank, t) == (2, 6) else None), (rank, t)
            assert plan.donate_to == ((2,) if (rank, t) == (donor, 6) else ()), (rank, t)
            want_detect = FD if t == 3 and rank in (1, 3) else 0.0
            assert plan.detect_s == want_detect, (rank, t)
            assert plan.speed is None and plan.pause_s == 0.0, (rank, t)
    # the non-neighbour, the departed and everyone at round 0 notice nothing
    assert world.plan(0, 3).detect_s == 0.0 and world.plan(2, 3).detect_s == 0.0
    assert all(world.plan(r, 0).detect_s == 0.0 for r in range(4))


@pytest.mark.parametrize("from_worker", [None, 3])
def test_a_gossip_ring_from_config_plans_the_same(tmp_path, from_worker):
    """from_config with the full gossip ring: the living graph's peers and neighbours give the
    same plan as DiLoCo's ring on 4 workers (there, both are the two ring neighbours)."""
    extra = f"\nfrom_worker = {from_worker}" if from_worker is not None else ""
    cfg = cfg_of(write_scenario(tmp_path, LEAVE_2_AT_3, JOIN_2_AT_6 + extra),
                 **{"run.failure_detect_s": FD})
    got = world_of(cfg)
    want = World(rejoin_scenario(from_worker), 4, ROUNDS, FD, ring_peers, ring_neighbours(4))
    for t in range(ROUNDS):
        for rank in range(4):
            assert got.plan(rank, t) == want.plan(rank, t), (rank, t)


def test_diloco_from_config_takes_the_lowest_ranked_living_worker_as_donor(tmp_path):
    """No graph for DiLoCo (every worker holds the same outer parameters): the default donor is
    the lowest-ranked worker alive in the round before."""
    cfg = cfg_of(write_scenario(tmp_path, LEAVE_2_AT_3, JOIN_2_AT_6), **{"algo.name": "diloco"})
    world = world_of(cfg)
    assert world.plan(2, 6).join_from == 0 and world.plan(0, 6).donate_to == (2,)
    assert [r for r in range(4) if world.plan(r, 3).detect_s] == [1, 3]
    assert world.plan(1, 3).detect_s == cfg.run.failure_detect_s


def test_peers_that_notice_are_those_of_the_last_round_over_the_living():
    """Ring of 6, worker 2 leaves at round 3, then worker 3 at round 5. At round 5, DiLoCo's ring
    over {0, 1, 3, 4, 5} had 3 between 1 and 4; the gossip ring had lost the edge 2-3, so only 4
    was 3's peer."""
    sc = Scenario((LeaveEvent(worker=2, round=3), LeaveEvent(worker=3, round=5)), 6, ROUNDS)
    diloco = World(sc, 6, ROUNDS, FD, ring_peers)
    gossip = graph_world(sc, Topology("ring", 6), ROUNDS)
    noticing = {name: {t: [r for r in range(6) if w.plan(r, t).detect_s == FD]
                       for t in range(ROUNDS)}
                for name, w in (("diloco", diloco), ("gossip", gossip))}
    quiet = {t: [] for t in range(ROUNDS) if t not in (3, 5)}
    assert noticing["diloco"] == {3: [1, 3], 5: [1, 4]} | quiet
    assert noticing["gossip"] == {3: [1, 3], 5: [4]} | quiet


def test_on_random_matchings_only_the_partner_of_the_last_round_notices(tmp_path):
    """Gossip over per-round matchings: the departed's partner of round R-1, not of round R."""
    cfg = cfg_of(write_scenario(tmp_path, "type = 'leave'\nround = 2\nworker = 5"),
                 **{"workers": 8, "topology.name": "matching"})
    topo = topology_from_config(cfg)
    partner, would_be = topo.peers(5, 1), topo.peers(5, 2)
    assert len(partner) == 1 and partner != would_be   # the case tells the two rounds apart
    world = world_of(cfg)
    for t in range(ROUNDS):
        noticing = [r for r in range(8) if world.plan(r, t).detect_s]
        assert noticing == (partner if t == 2 else []), t
    assert world.plan(partner[0], 2).detect_s == cfg.run.failure_detect_s


def test_a_leave_at_round_zero_is_noticed_by_nobody():
    """Nobody exchanged with a worker that leaves before the first round."""
    sc = Scenario((LeaveEvent(worker=2, round=0),), 4, ROUNDS)
    world = World(sc, 4, ROUNDS, FD, ring_peers, ring_neighbours(4))
    assert world.plan(2, 0).leaving and not world.plan(2, 0).active
    assert not any(world.plan(2, t).leaving for t in range(1, ROUNDS))
    assert all(world.plan(r, t).detect_s == 0.0 for r in range(4) for t in range(ROUNDS))
    assert world.alive(0) == frozenset({0, 1, 3})


def test_without_a_scenario_everyone_is_alive_and_nothing_happens():
    world = World(None, 4, ROUNDS, FD, ring_peers)
    assert not world.churns
    for t in range(ROUNDS):
        for rank in range(4):
            assert world.plan(rank, t) == RoundPlan(alive=ALL4, active=True)


# ---------------------------------------------------------------- speeds and pauses

def test_speed_and_pause_events_show_up_at_their_round_only():
    sc = Scenario((
        SpeedEvent(worker=1, round=2, speed=0.5),
        PauseEvent(worker=2, round=3, seconds=1.0),
        SpeedEvent(worker=1, round=2, speed=0.25),   # same worker and round: the last one wins
        PauseEvent(worker=2, round=3, seconds=2.5),  # same worker and round: pauses add up
        PauseEvent(worker=3, round=3, seconds=0.5),
        SpeedEvent(worker=0, round=4, speed=0.75),
    ), 4, ROUNDS)
    world = World(sc, 4, ROUNDS, FD, ring_peers, ring_neighbours(4))
    assert not world.churns
    speeds = {(1, 2): 0.25, (0, 4): 0.75}
    pauses = {(2, 3): 3.5, (3, 3): 0.5}
    for t in range(ROUNDS):
        for rank in range(4):
            plan = world.plan(rank, t)
            assert plan.speed == speeds.get((rank, t)), (rank, t)
            assert plan.pause_s == pytest.approx(pauses.get((rank, t), 0.0)), (rank, t)
            assert plan.active and plan.detect_s == 0.0 and plan.join_from is None


def test_speed_and_pause_of_a_rejoined_worker_come_with_its_join():
    sc = Scenario((LeaveEvent(worker=2, round=3), JoinEvent(worker=2, round=6),
                   SpeedEvent(worker=2, round=6, speed=0.5),
                   PauseEvent(worker=2, round=6, seconds=4.0)), 4, ROUNDS)
    plan = World(sc, 4, ROUNDS, FD, ring_peers, ring_neighbours(4)).plan(2, 6)
    assert (plan.active, plan.join_from, plan.speed, plan.pause_s) == (True, 1, 0.5, 4.0)


# ---------------------------------------------------------------- from_config and its refusals

def test_from_config_without_a_scenario_is_none():
    assert world_of(cfg_of()) is None
    assert world_of(cfg_of()) is None


def test_from_config_with_a_scenario_is_a_world(tmp_path):
    path = write_scenario(tmp_path, LEAVE_2_AT_3, JOIN_2_AT_6,
                          "type = 'speed'\nround = 4\nworker = 1\nspeed = 0.5")
    cfg = cfg_of(path, **{"run.failure_detect_s": 7.0})
    world = world_of(cfg)
    assert isinstance(world, World)
    assert (world.workers, world.rounds, world.failure_detect_s) == (4, ROUNDS, 7.0)
    assert world.scenario.source == "scenario scenario.toml"
    assert world.alive(4) == frozenset({0, 1, 3}) and world.plan(1, 4).speed == 0.5


@pytest.mark.parametrize(("tables", "overrides", "match"), [
    (("type = 'join'\nround = 4\nworker = 4",), {},
     r"^scenario scenario\.toml: join of worker 4: the run has ids 0\.\.3; count a new worker "
     r"in workers \(workers = 5\): a worker whose first event is a join is absent from the "
     r"start until then$"),
    ((LEAVE_2_AT_3,), {"algo.name": "diloco", "algo.pseudo_grad_mean": "steps"},
     r"^scenario scenario\.toml: workers leave or join, and algo\.pseudo_grad_mean = 'steps' "
     r"weights every worker .*use 'plain'"),
    ((LEAVE_2_AT_3,), {"fault.worker": 1},
     r"^scenario scenario\.toml: workers leave or join, and fault\.worker = 1 injects a "
     r"failure too; use one or the other$"),
    ((LEAVE_2_AT_3, JOIN_2_AT_6), {"fault.worker": 0, "fault.round": 5}, r"fault\.worker = 0"),
])
def test_from_config_refuses_what_cannot_run_yet(tmp_path, tables, overrides, match):
    cfg = cfg_of(write_scenario(tmp_path, *tables), **overrides)
    with pytest.raises(ScenarioError, match=match) as info:
        world_of(cfg)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("tables", "overrides"), [
    ((LEAVE_2_AT_3,), {"algo.name": "diloco", "algo.pseudo_grad_mean": "plain"}),
    (("type = 'speed'\nround = 2\nworker = 1\nspeed = 0.5",),
     {"algo.name": "diloco", "algo.pseudo_grad_mean": "steps"}),
    (("type = 'pause'\nround = 2\nworker = 1\nseconds = 1.0",), {"fault.worker": 1}),
])
def test_from_config_allows_the_combinations_that_work(tmp_path, tables, overrides):
    """The refusals above are for churn only: without a leave or join they do not apply."""
    cfg = cfg_of(write_scenario(tmp_path, *tables), **overrides)
    assert isinstance(world_of(cfg), World)


@pytest.mark.parametrize("fd", [-0.001, 3600.001, math.inf, -math.inf, math.nan])
def test_failure_detect_s_out_of_range_is_refused(fd):
    with pytest.raises(ScenarioError, match=r"^run\.failure_detect_s = .* is out of range; "
                                            r"expected \[0, 3600\] seconds$"):
        World(None, 4, ROUNDS, fd, ring_peers)


@pytest.mark.parametrize("fd", [0.0, 3600.0])
def test_failure_detect_s_at_its_bounds_is_allowed(fd):
    world = World(rejoin_scenario(), 4, ROUNDS, fd, ring_peers)
    assert world.plan(1, 3).detect_s == fd


def test_unsupported_scenarios_are_refused_by_world_itself():
    sc = Scenario((LeaveEvent(worker=2, round=3), JoinEvent(worker=4, round=5)), 4, ROUNDS)
    with pytest.raises(ScenarioError, match="join of worker 4: the run has ids 0..3"):
        World(sc, 4, ROUNDS, FD, ring_peers)


# ---------------------------------------------------------------- summary and departed

def test_membership_summary_and_departed_of_a_rejoin():
    world = World(rejoin_scenario(3), 4, ROUNDS, FD, ring_peers)
    assert membership_summary(world) == {
        "changes": [{"type": "leave", "worker": 2, "round": 3},
                    {"type": "join", "worker": 2, "round": 6}],
        "new_workers": [], "alive_at_end": [0, 1, 2, 3], "failure_detect_s": FD}
    assert world.departed() == frozenset()


def test_membership_summary_and_departed_of_leaves_in_round_order():
    sc = Scenario((LeaveEvent(worker=0, round=9),          # the last round: still departed
                   SpeedEvent(worker=1, round=1, speed=0.5),
                   JoinEvent(worker=2, round=7),
                   LeaveEvent(worker=2, round=2),
                   LeaveEvent(worker=3, round=4)), 4, ROUNDS)
    world = World(sc, 4, ROUNDS, 0.0, ring_peers)
    assert membership_summary(world) == {
        "changes": [{"type": "leave", "worker": 2, "round": 2},
                    {"type": "leave", "worker": 3, "round": 4},
                    {"type": "join", "worker": 2, "round": 7},
                    {"type": "leave", "worker": 0, "round": 9}],
        "new_workers": [], "alive_at_end": [1, 2], "failure_detect_s": 0.0}
    assert world.departed() == frozenset({0, 3})


def test_membership_summary_without_churn():
    for sc in (None, Scenario((SpeedEvent(worker=1, round=1, speed=0.5),), 4, ROUNDS)):
        world = World(sc, 4, ROUNDS, FD, ring_peers)
        assert membership_summary(world) == {"changes": [], "new_workers": [],
                                             "alive_at_end": [0, 1, 2, 3],
                                             "failure_detect_s": FD}
        assert world.departed() == frozenset() and not world.churns


# ---------------------------------------------------------------- ring_peers

@pytest.mark.parametrize(("rank", "alive", "want"), [
    (1, {0, 1, 2, 3}, [0, 2]),
    (0, {0, 1, 2, 3}, [1, 3]),         # the ring wraps
    (3, {0, 1, 3}, [0, 1]),            # 2 gone: 3 sits between 1 and 0
    (1, {0, 1, 3}, [0, 3]),
    (4, {1, 4, 6}, [1, 6]),
    (0, {0, 1}, [1]),                  # two alive: one neighbour, not twice
    (1, {0, 1}, [0]),
    (2, {2}, []),                      # alone
    (2, {0, 1, 3}, []),                # dead
    (5, {0, 1}, []),
])
def test_ring_peers_over_the_living(rank, alive, want):
    assert ring_peers(rank, 7, frozenset(alive)) == want


@settings(max_examples=100, deadline=None)
@given(alive=st.sets(st.integers(0, 11), min_size=1))
def test_ring_peers_form_one_ring_over_the_living(alive):
    """Each living worker's ring peers are the previous and next living ranks; the relation is
    symmetric, and with 3 or more alive following 'next' visits everyone once."""
    alive = frozenset(alive)
    for rank in range(12):
        peers = ring_peers(rank, 0, alive)
        assert peers == sorted(set(peers)) and set(peers) <= alive - {rank}
        assert len(peers) == (0 if rank not in alive else min(2, len(alive) - 1))
        assert all(rank in ring_peers(p, 0, alive) for p in peers)


# ---------------------------------------------------------------- the property

GRAPHS = [("ring", n) for n in range(4, 9)] + [("torus", n) for n in (4, 6, 8)]


@st.composite
def churn(draw):
    """A random round-triggered leave/join scenario on a ring or torus of 4..8 workers, and a
    world for DiLoCo's ring or for gossip over the graph. A join's ``from_worker``, when drawn,
    is a worker alive before and after its round (validation refuses any other)."""
    name, n = draw(st.sampled_from(GRAPHS))
    rounds = draw(st.integers(2, 9))
    alive, events = set(range(n)), []
    for t in range(rounds):
        if not draw(st.booleans()):
            continue
        leaving = draw(st.sets(st.sampled_from(sorted(alive)), max_size=len(alive) - 1)) \
            if len(alive) > 1 else set()
        departed = sorted(set(range(n)) - alive)
        joining = sorted(draw(st.sets(st.sampled_from(departed)))) if departed else []
        stay = sorted(alive - leaving)
        for w in sorted(leaving):
            events.append(LeaveEvent(worker=w, round=t))
        for w in joining:
            donor = draw(st.none() | st.sampled_from(stay)) if stay else None
            events.append(JoinEvent(worker=w, round=t, from_worker=donor))
        alive = (alive - leaving) | set(joining)
    events = draw(st.permutations(events))   # the file's order must not matter
    sc = Scenario(tuple(events), n, rounds)
    topo = Topology(name, n)
    if draw(st.booleans()):
        return sc, topo, World(sc, n, rounds, FD, ring_peers), "diloco"
    return sc, topo, graph_world(sc, topo, rounds), "gossip"


def _full_neighbours(topo: Topology, rank: int) -> set[int]:
    return {j for e in topo.possible_edges if rank in e for j in e if j != rank}


def _peers_before(kind: str, topo: Topology, rank: int, was: frozenset) -> set[int]:
    """``rank``'s exchange partners in a round whose living workers are ``was``."""
    if kind == "gossip":
        return _full_neighbours(topo, rank) & was
    ring = sorted(was)
    k = ring.index(rank)
    return {ring[k - 1], ring[(k + 1) % len(ring)]} - {rank}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=churn())
def test_world_follows_the_scenario_round_by_round(case):
    sc, topo, world, kind = case
    n = topo.n
    joins = {(e.round, e.worker): e for e in sc.events if isinstance(e, JoinEvent)}
    leaves = {(e.round, e.worker) for e in sc.events if isinstance(e, LeaveEvent)}
    for t in range(sc.rounds):
        alive = world.alive(t)
        was = world.alive(t - 1) if t else frozenset(range(n))
        assert alive == sc.membership_at(t), t
        join_from: dict[int, int] = {}
        donate_to: dict[int, int] = {}
        for rank in range(n):
            plan = world.plan(rank, t)
            assert plan.alive == alive
            assert plan.active == (rank in alive), (rank, t)
            assert plan.leaving == ((t, rank) in leaves), (rank, t)
            assert (plan.join_from is not None) == ((t, rank) in joins), (rank, t)
            if plan.join_from is not None:
                stay = was & alive   # holds round t-1's parameters and sends them in t
                ev, near = joins[t, rank], _full_neighbours(topo, rank) & stay
                assert plan.active and plan.join_from != rank
                assert plan.join_from in stay, (rank, t, plan.join_from)
                if ev.from_worker is not None:
                    assert plan.join_from == ev.from_worker
                elif kind == "gossip" and near:
                    assert plan.join_from == min(near)
                else:
                    assert plan.join_from == min(stay)
                join_from[rank] = plan.join_from
            donate_to |= {j: rank for j in plan.donate_to}
            gone = was - alive
            noticing = rank in alive and rank in was and t > 0 and \
                bool(gone & _peers_before(kind, topo, rank, was))
            assert plan.detect_s == (FD if noticing else 0.0), (rank, t)
        assert donate_to == join_from, t   # donate_to is the inverse of join_from


def _case(events: tuple) -> tuple:
    """A gossip ring of 4 over 8 rounds, as ``churn`` draws them."""
    sc = Scenario(events, 4, 8)
    return sc, Topology("ring", 4), graph_world(sc, Topology("ring", 4), 8), "gossip"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=churn())
@example(case=_case((LeaveEvent(worker=2, round=2), JoinEvent(worker=2, round=5),
                     LeaveEvent(worker=1, round=5))))
def test_every_joiners_donor_is_alive_before_and_in_its_round(case):
    sc, topo, world, _ = case
    for t in range(1, sc.rounds):
        for rank in range(topo.n):
            donor = world.plan(rank, t).join_from
            if donor is not None:
                assert donor in world.alive(t - 1) and donor in world.alive(t), (rank, t, donor)


# -- a donor leaving, or joining, in the joining round

def test_the_default_donor_is_not_a_worker_leaving_in_the_joining_round():
    sc = Scenario((LeaveEvent(worker=2, round=2), JoinEvent(worker=2, round=5),
                   LeaveEvent(worker=1, round=5)), 4, ROUNDS)
    world = World(sc, 4, ROUNDS, FD, ring_peers, ring_neighbours(4))
    assert world.plan(1, 5).leaving
    assert world.plan(1, 5).donate_to == ()
    assert world.plan(2, 5).join_from == 3   # the lowest-ranked neighbour still alive


@pytest.mark.parametrize("events", [
    # worker 2 joins in round 5 itself: it has no parameters of the end of round 4
    (LeaveEvent(worker=2, round=2), LeaveEvent(worker=3, round=2),
     JoinEvent(worker=2, round=5), JoinEvent(worker=3, round=5, from_worker=2)),
    # worker 2 leaves in round 5: its process is killed before it could send them
    (LeaveEvent(worker=3, round=2), LeaveEvent(worker=2, round=5),
     JoinEvent(worker=3, round=5, from_worker=2)),
], ids=["joining", "leaving"])
def test_a_donor_joining_or_leaving_in_the_same_round_is_refused(events):
    with pytest.raises(ScenarioError, match="from_worker 2 must be alive both before and at "
                                            "round 5"):
        Scenario(events, 4, ROUNDS)


def test_a_join_with_no_worker_staying_is_refused():
    events = (LeaveEvent(worker=1, round=2), LeaveEvent(worker=2, round=2),
              LeaveEvent(worker=3, round=2), JoinEvent(worker=1, round=4),
              LeaveEvent(worker=0, round=4))
    with pytest.raises(ScenarioError, match="no worker alive both before and at round 4"):
        Scenario(events, 4, ROUNDS)
