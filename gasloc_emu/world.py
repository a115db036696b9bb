"""What a scenario means for each worker in each round: who is alive, who joins from whom, who
spends time noticing a departure, speeds and pauses.

Pure rules, no torch and no sockets: the worker loop of the simulator and of an emulator process
both ask ``World.plan(rank, t)`` at the start of round t, so they take the same steps and mix
with the same peers, and ``run`` equals ``simulate`` (docs/ARCHITECTURE.md, "Scenarios").

The rules (docs/ALGORITHM.md, "Churn"):

- Membership comes from the scenario's round-triggered leaves and joins
  (``Scenario.membership_at``). A worker leaving at round R takes part in rounds 0..R-1; its
  process is killed at the start of round R, without a word to its peers.
- Its peers in its last round (R-1) find out the way a heartbeat timeout would: they spend
  ``failure_detect_s`` waiting for it in round R's communication, then mix over the survivors
  (Metropolis–Hastings weights of the surviving graph; DiLoCo's ring re-formed over them).
- A worker joining at round R starts from its donor's parameters as they were at the end of
  round R-1 (the scenario's ``from_worker``, else the lowest-ranked living neighbour, else the
  lowest-ranked living worker), with a fresh inner optimizer and outer state, and takes part
  from round R.
- Round-triggered ``speed`` events set a worker's speed from that round on; ``pause`` events
  stop it for their seconds at the start of that round. Time-triggered ones are the runner's to
  apply on its own clock (``time_events``).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from .scenario import (
    JoinEvent,
    LeaveEvent,
    LinkEvent,
    PartitionEvent,
    PauseEvent,
    Scenario,
    ScenarioError,
    SpeedEvent,
    as_record,
    load_scenario,
)
from .topology import LivingGraph

# peers(rank, t, alive): the workers ``rank`` exchanges with in round t when ``alive`` live
PeersFn = Callable[[int, int, frozenset], list]


@dataclass(frozen=True)
class RoundPlan:
    """What one worker does at the start of round t."""

    alive: frozenset          # the workers taking part in round t
    active: bool              # this worker takes part in round t
    leaving: bool = False     # it leaves now (its process is killed before the round)
    join_from: int | None = None  # it joins now, from this donor's parameters
    donate_to: tuple = ()     # joiners of round t that start from this worker's parameters
    detect_s: float = 0.0     # seconds spent noticing departed peers, before communicating
    speed: float | None = None  # its compute speed from this round on (None: unchanged)
    pause_s: float = 0.0      # seconds it stands still at the start of the round


class World:
    """A scenario's rounds as seen by every worker. ``peers(rank, t, alive)`` is the exchange
    partners of the algorithm (the living graph's, or DiLoCo's ring); ``neighbours(rank)``
    the full graph's neighbours, used to pick a joiner's donor."""

    def __init__(self, scenario: Scenario | None, workers: int, rounds: int,
                 failure_detect_s: float, peers: PeersFn,
                 neighbours: Callable[[int], list] | None = None):
        if not (math.isfinite(failure_detect_s) and 0.0 <= failure_detect_s <= 3600.0):
            raise ScenarioError(f"run.failure_detect_s = {failure_detect_s!r} is out of range; "
                                "expected [0, 3600] seconds")
        self.scenario, self.workers, self.rounds = scenario, workers, rounds
        self.failure_detect_s, self._peers = failure_detect_s, peers
        self._neighbours = neighbours or (lambda rank: [])
        if scenario is not None:
            check_supported(scenario)

    @property
    def churns(self) -> bool:
        """Whether workers leave or join: the algorithms then mix over the living."""
        return self.scenario is not None and any(
            isinstance(ev, (LeaveEvent, JoinEvent)) for ev in self.scenario.events)

    @cached_property
    def _by_round(self) -> dict[int, list]:
        out: dict[int, list] = {}
        for ev in (self.scenario.round_events if self.scenario else ()):
            out.setdefault(ev.round, []).append(ev)
        return out

    def alive(self, t: int) -> frozenset:
        """The workers taking part in round t."""
        if self.scenario is None:
            return frozenset(range(self.workers))
        return self.scenario.membership_at(t)

    def plan(self, rank: int, t: int) -> RoundPlan:
        """What worker ``rank`` does at the start of round t."""
        alive = self.alive(t)
        was = self.alive(t - 1) if t > 0 else frozenset(range(self.workers))
        joins = self._donors(t, was)
        return RoundPlan(
            alive=alive, active=rank in alive, leaving=rank in was - alive,
            join_from=joins.get(rank), donate_to=tuple(j for j, d in joins.items() if d == rank),
            detect_s=self._detect_s(rank, t, was, alive), speed=self._speed(rank, t),
            pause_s=self._pause_s(rank, t))

    def _events(self, t: int, cls: type) -> list:
        return [ev for ev in self._by_round.get(t, ()) if isinstance(ev, cls)]

    def _donors(self, t: int, was: frozenset) -> dict[int, int]:
        """{joiner: donor} for the joins of round t; donors are workers alive in round t-1."""
        return {ev.worker: self.donor(ev, was) for ev in self._events(t, JoinEvent)}

    def donor(self, ev: JoinEvent, was: frozenset) -> int:
        """The scenario's ``from_worker``, else the lowest-ranked living neighbour, else the
        lowest-ranked living worker."""
        if ev.from_worker is not None:
            return ev.from_worker
        near = sorted(set(self._neighbours(ev.worker)) & was)
        return near[0] if near else min(was)

    def _detect_s(self, rank: int, t: int, was: frozenset, alive: frozenset) -> float:
        """``failure_detect_s`` when a peer of ``rank``'s in round t-1 is gone in round t."""
        if t == 0 or rank not in alive or rank not in was:
            return 0.0
        gone = was - alive
        return self.failure_detect_s if gone & set(self._peers(rank, t - 1, was)) else 0.0

    def _speed(self, rank: int, t: int) -> float | None:
        speeds = [ev.speed for ev in self._events(t, SpeedEvent) if ev.worker == rank]
        return speeds[-1] if speeds else None

    def _pause_s(self, rank: int, t: int) -> float:
        return sum(ev.seconds for ev in self._events(t, PauseEvent) if ev.worker == rank)

    def records(self, t: int) -> list[dict]:
        """The events of round t as events.jsonl objects (``scenario.as_record``), a join with
        the donor it took, a departure with the peers that spend time noticing it."""
        out = []
        for ev in self._by_round.get(t, ()):
            rec = as_record(ev)
            if isinstance(ev, JoinEvent):
                rec["from_worker"] = self.plan(ev.worker, t).join_from
            if isinstance(ev, LeaveEvent):
                rec["detected_by"] = sorted(r for r in self.alive(t)
                                            if self.plan(r, t).detect_s > 0)
            out.append(rec)
        return out

    def departed(self) -> frozenset:
        """Workers that leave at some round and are not back at the end."""
        return frozenset(range(self.workers)) - self.alive(self.rounds - 1)

    def left_and_joined(self) -> list[dict]:
        """Who left and joined, in which round (for the run record's summary)."""
        out = []
        for ev in (self.scenario.round_events if self.scenario else ()):
            if isinstance(ev, (LeaveEvent, JoinEvent)):
                out.append({"type": ev.kind, "worker": ev.worker, "round": ev.round})
        return out


def check_supported(scenario: Scenario) -> None:
    """Refuse, before the run, what the runners cannot do yet (one line, exit 2)."""
    for ev in scenario.events:
        if not ev.by_round:
            raise ScenarioError(f"{scenario.source}: {ev.kind} event at at_s = {ev.at_s:g}: "
                                "events at a time are not applied by run and simulate yet; "
                                "give it a round (round = R)")
        if isinstance(ev, (LinkEvent, PartitionEvent)):
            raise ScenarioError(f"{scenario.source}: {ev.kind} event at round {ev.round}: link "
                                "and partition events are not applied by run and simulate yet")
        if isinstance(ev, (LeaveEvent, JoinEvent)) and not ev.by_round:
            raise ScenarioError(f"{scenario.source}: {ev.kind} of worker {ev.worker} at "
                                f"at_s = {ev.at_s:g}: leaves and joins are only supported at "
                                "a round (round = R) so far")
        if isinstance(ev, JoinEvent) and ev.worker >= scenario.workers:
            raise ScenarioError(f"{scenario.source}: join of worker {ev.worker}: only departed "
                                f"workers (ids 0..{scenario.workers - 1}) can join so far, "
                                "not new ones")


def from_config(cfg, topo=None) -> World | None:
    """The world of a resolved config: None without ``run.scenario``. ``topo``: the full gossip
    graph (None for DiLoCo, whose exchange partners are its ring's neighbours)."""
    if not cfg.run.scenario:
        return None
    scenario = load_scenario(cfg.run.scenario, cfg.workers, cfg.run.rounds)
    check_with_config(scenario, cfg)
    if topo is None:
        return World(scenario, cfg.workers, cfg.run.rounds, cfg.run.failure_detect_s, ring_peers)
    return World(scenario, cfg.workers, cfg.run.rounds, cfg.run.failure_detect_s,
                 lambda rank, t, alive: LivingGraph(topo, lambda _t: alive).peers(rank, t),
                 lambda rank: sorted(j for e in topo.possible_edges if rank in e
                                     for j in e if j != rank))


def ring_peers(rank: int, t: int, alive: frozenset) -> list[int]:
    """DiLoCo's exchange partners: its neighbours on the ring over the living, in rank order."""
    ring = sorted(alive)
    if rank not in alive or len(ring) < 2:
        return []
    k = ring.index(rank)
    return sorted({ring[k - 1], ring[(k + 1) % len(ring)]} - {rank})


def check_with_config(scenario: Scenario, cfg) -> None:
    """What a scenario cannot be combined with (one line, exit 2)."""
    churn = any(isinstance(ev, (LeaveEvent, JoinEvent)) for ev in scenario.events)
    if churn and cfg.algo.name == "diloco" and cfg.algo.pseudo_grad_mean == "steps":
        raise ScenarioError(f"{scenario.source}: workers leave or join, and "
                            "algo.pseudo_grad_mean = 'steps' weights every worker by a share of "
                            "all of them; use 'plain' with a scenario that changes membership")
    if churn and cfg.fault.worker >= 0:
        raise ScenarioError(f"{scenario.source}: workers leave or join, and fault.worker = "
                            f"{cfg.fault.worker} injects a failure too; use one or the other")


def membership_summary(world: World) -> dict:
    """Who left and joined, and who is alive at the end (the run record's summary)."""
    return {"changes": world.left_and_joined(),
            "alive_at_end": sorted(world.alive(world.rounds - 1)),
            "failure_detect_s": world.failure_detect_s}


class EventFeed:
    """Hands each round's scenario events to ``sink`` once, when the first metrics row of that
    round (or a later one) reaches the runner; ``logged_at_s`` is that row's ``time_s``."""

    def __init__(self, world: World, sink: Callable[[dict], None]):
        self.world, self.sink, self.next_round = world, sink, 0

    def row(self, row: dict) -> None:
        t = row.get("round")
        if type(t) is not int or row.get("kind") not in (None, "metric"):
            return
        while self.next_round <= min(t, self.world.rounds - 1):
            for rec in self.world.records(self.next_round):
                self.sink(rec | {"logged_at_s": row.get("time_s")})
            self.next_round += 1


def event_text(rec: dict) -> str:
    """One line for the dashboard or the log: ``round 3: worker 2 leaves``."""
    what = {"leave": "worker {worker} leaves",
            "join": "worker {worker} joins from worker {from_worker}",
            "speed": "worker {worker} runs at speed {speed:g}",
            "pause": "worker {worker} pauses for {seconds:g} s",
            "link": "links {links} change",
            "partition": "partition {groups}"}.get(rec["type"], rec["type"])
    when = f"round {rec['round']}" if rec.get("round") is not None else f"{rec['at_s']:g} s"
    return f"{when}: " + what.format(**rec)


def event_feed(world: World | None, rec, progress=None) -> EventFeed | None:
    """The runner's feed: each event into the record's events.jsonl and onto the display."""
    if world is None:
        return None

    def sink(event: dict) -> None:
        rec.event(event)
        if progress is not None:
            progress({"kind": "event", "text": event_text(event)})
    return EventFeed(world, sink)
