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
  stop it for their seconds at the start of that round. At a time (``at_s``) they concern that
  worker alone, so no other worker has to agree on a round: each takes effect at the start of
  the worker's first inner phase that starts at or after at_s (``SelfTimeline``; the emulator
  reads its clock at the start of each round, the simulator's virtual clock applies them to the
  lane when that phase's compute begins). A worker's speed events all take one trigger, and a
  speed at a time is refused with a time budget (the steps it allows would depend on how fast
  the run goes). Link events may come at a time too (``at_s``, and a link trace's rows:
  ``TimedLinks``).
- Leaves, joins and partitions at a time change whom everyone mixes with, so every worker must
  play them at the same round: each is fixed at a round as the run goes (``fixing.RoundFixer``:
  one round after the highest any worker has started when a clock reaches its time), and
  ``World.fix`` plays it from there; rounds before it come out as they were. Until then a new
  worker, or a departed one whose join is at a time, is absent (``awaits_join``). They all take
  one clock: by round, or all at a time (``check_supported``).

Links (docs/NETWORK.md, "Scenarios"); ``LinkSchedule`` plays the scenario's ``Timeline`` on a
round-only clock, so the values in force, partition cuts and restores are the Timeline's:

- A ``link`` event at round R sets the (rate, latency) of its directed links for the messages of
  rounds >= R; a message belongs to the round in its key (``(dst, src, round, kind)``). The
  simulator's link model times each message with the values of its round; under the userspace
  shaper each worker applies its sending links at the start of its round R (before it sends
  anything of R); under tc the launcher changes the classes when the first worker reports round
  R-1, so messages of R-1 still in flight may see the new rate. ``loss_pct`` is refused: neither
  the simulator nor the userspace shaper models loss.
- A ``partition`` at round R cuts every link between its two groups for rounds R..end_round-1
  (to the end without one); at end_round the Timeline's restore events set the links back to
  the values in force (a link event that fell inside the cut arrives with the restore). For the
  algorithms a cut link is an absent edge: gossip mixes over the living graph minus the cut
  edges (Metropolis–Hastings weights over the remaining degrees, matchings drawn without them),
  and DiLoCo's ring All-Reduce runs within each group over its living members (a partition that
  leaves a living worker in neither group is refused for DiLoCo). In the first round of a cut,
  a worker that loses a neighbour of its previous round spends ``failure_detect_s`` noticing it,
  as for a departure. A join whose donor is cut from the joiner is refused; the default donor
  is chosen among the workers it can reach.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from .fixing import TIMED_KINDS, Fixing, RoundFixer, timed_items
from .scenario import (
    Event,
    JoinEvent,
    LeaveEvent,
    LinkEvent,
    LinkTrace,
    PartitionEvent,
    PauseEvent,
    Scenario,
    ScenarioError,
    SpeedEvent,
    Timeline,
    as_record,
    load_link_trace,
    load_scenario,
)
from .topology import LivingGraph

# the largest rate a link can have (netem.profiles.RATE_RANGE_MBIT): an unshaped link's value on
# the Timeline, whose restores must be valid link events; read back as None (unshaped)
UNSHAPED_MBIT = 100_000.0
Pair = tuple[int, int]
LinkState = tuple[float | None, float]   # (rate_mbit: None unshaped, 0.0 cut; latency_ms)
BaseLink = Callable[[int, int], LinkState]

# peers(rank, t, alive[, cut=edges]): the workers ``rank`` exchanges with in round t when
# ``alive`` live and the (undirected, sorted) edges ``cut`` are cut; ``cut`` is passed only
# when a partition holds in round t
PeersFn = Callable[..., list]


def unshaped_link(src: int, dst: int) -> LinkState:
    """A link no profile shapes: unlimited rate, no latency."""
    return (None, 0.0)


class LinkSchedule:
    """The round-triggered link and partition events of a scenario, per round.

    The scenario's ``Timeline`` is played once, round by round, on a clock that never moves
    (events at a time are refused), so the values in force, cuts and restores are exactly its
    own. ``base_link(src, dst)`` is a link's (rate_mbit or None, latency_ms) before any event.
    """

    def __init__(self, scenario: Scenario, rounds: int, base_link: BaseLink = unshaped_link,
                 trace: LinkTrace | None = None):
        self._base, self._rounds, self._trace = base_link, rounds, trace
        self.build(scenario)

    def build(self, scenario: Scenario) -> None:
        """Play ``scenario`` (again: a partition at a time was fixed at a round, ``World.fix``;
        the rounds already played come out the same)."""
        rounds, base_link, trace = self._rounds, self._base, self._trace
        timeline = Timeline(scenario, self._timeline_base, lambda: 0.0)
        self.fired: dict[int, list[Event]] = {}
        self.changes: dict[int, dict[Pair, LinkState]] = {}
        self._cuts: list[frozenset] = []
        self._history: dict[Pair, list[tuple[int, LinkState]]] = {}
        self.timed = TimedLinks.of(scenario, trace, base_link)
        for t in range(rounds):
            events = [ev for ev in timeline.due(t)
                      if isinstance(ev, (LinkEvent, PartitionEvent)) and ev.by_round]
            cut = timeline.cut_links()
            self._cuts.append(cut)
            touched = _touched(events)
            if events:
                self.fired[t] = events
            if touched:
                self.changes[t] = {link: self._state(timeline, link, cut) for link in touched}
                for link, state in self.changes[t].items():
                    self._history.setdefault(link, []).append((t, state))

    def _timeline_base(self, src: int, dst: int) -> tuple[float, float, float]:
        rate, latency = self._base(src, dst)
        return (UNSHAPED_MBIT if rate is None else rate, latency, 0.0)

    def _state(self, timeline: Timeline, link: Pair, cut: frozenset) -> LinkState:
        rate, latency, _ = timeline.link_values(*link)
        if link in cut:
            return (0.0, latency)
        unshaped = rate == UNSHAPED_MBIT and self._base(*link)[0] is None
        return (None if unshaped else rate, latency)

    def cut(self, t: int) -> frozenset:
        """The directed links cut in round t."""
        return self._cuts[t] if 0 <= t < len(self._cuts) else frozenset()

    def cut_edges(self, t: int) -> frozenset:
        """The undirected edges (sorted pairs) cut in round t, as the algorithms see them."""
        return frozenset(_edge(a, b) for a, b in self.cut(t))

    def in_force(self, src: int, dst: int, t: int) -> LinkState:
        """(rate_mbit, latency_ms) of src -> dst for the messages of round t by the
        round-triggered events alone (rate None: unshaped; 0.0: cut)."""
        state = self._base(src, dst)
        for r, values in self._history.get((src, dst), ()):
            if r > t:
                break
            state = values
        return state

    def at(self, src: int, dst: int, t: int, now_s: float) -> LinkState:
        """(rate_mbit, latency_ms) of src -> dst for a message of round t sent ``now_s``
        seconds after the run's start: cut while a partition cuts it in round t, else the
        time-triggered value in force then (``TimedLinks``), else the round's."""
        state = self.in_force(src, dst, t)
        if self.timed is None or (src, dst) in self.cut(t):
            return state
        timed = self.timed.in_force(src, dst, now_s)
        return state if timed is None else timed

    def slowest_mbit(self) -> dict[int, float]:
        """Per sender, the slowest rate any event (by round or by time) gives one of its links
        (cuts and unshaped values aside)."""
        rates = [(src, state[0]) for changed in self.changes.values()
                 for (src, _), state in changed.items()]
        if self.timed is not None:
            rates += [(src, state[0]) for (src, _), steps in self.timed.steps.items()
                      for _, state in steps]
        out: dict[int, float] = {}
        for src, rate in rates:
            if rate:   # None: unshaped; 0.0: cut
                out[src] = min(out.get(src, math.inf), rate)
        return out

    @property
    def changes_links(self) -> bool:
        """Whether any link's rate or latency changes (not only partitions' cuts)."""
        return self.timed is not None or any(
            isinstance(ev, LinkEvent) and ev.source != "restore"   # a partition's end
            for evs in self.fired.values() for ev in evs)


class TimedLinks:
    """The time-triggered link changes: a scenario's link events at ``at_s`` and a link trace's
    rows, as per-link steps (at_s, (rate_mbit, latency_ms)) on the run's clock (seconds since
    its start). A field an event leaves out keeps its value.

    A message takes the values in force when its sender sends it: the simulator's link model
    at the send's virtual time, the userspace shaper when it stamps the message (at the
    sender's clock); under tc the launcher changes the class at that time, so bytes already
    queued on the link feel the change too. A link changed by time may not also be changed by
    round (which came later would depend on the run's speed): that is refused before the run.
    """

    def __init__(self, events: list[LinkEvent], base_link: BaseLink):
        self.events = sorted(events, key=lambda ev: ev.at_s)
        self.steps: dict[Pair, list[tuple[float, LinkState]]] = {}
        for ev in self.events:
            for link in ev.links:
                steps = self.steps.setdefault(link, [])
                rate, latency = steps[-1][1] if steps else base_link(*link)
                steps.append((ev.at_s, (rate if ev.rate_mbit is None else ev.rate_mbit,
                                        latency if ev.latency_ms is None else ev.latency_ms)))

    @classmethod
    def of(cls, scenario: Scenario, trace: LinkTrace | None,
           base_link: BaseLink) -> TimedLinks | None:
        """The time-triggered link changes of a scenario and a trace; None when there are
        none."""
        events = [ev for ev in scenario.time_events if isinstance(ev, LinkEvent)]
        events += trace.changes_between(0.0, math.inf) if trace is not None else []
        return cls(events, base_link) if events else None

    def in_force(self, src: int, dst: int, now_s: float) -> LinkState | None:
        """The link's values at ``now_s``; None before its first time-triggered change."""
        steps = self.steps.get((src, dst), ())
        k = bisect_right(steps, now_s, key=lambda step: step[0])
        return steps[k - 1][1] if k else None

    def due(self, after_s: float, upto_s: float) -> list[LinkEvent]:
        """The changes with after_s < at_s <= upto_s, in time order."""
        return [ev for ev in self.events if after_s < ev.at_s <= upto_s]

    def values(self, src: int, dst: int) -> list[LinkState]:
        """Every value the link takes by time (the receivers' bounds take them all in)."""
        return [state for _, state in self.steps.get((src, dst), ())]

    def applied(self, ev: LinkEvent) -> list[dict]:
        """The values ``ev`` put in force on each of its links (events.jsonl)."""
        return [applied_row(link, self.in_force(*link, ev.at_s)) for link in ev.links]


def _touched(events: list) -> list[Pair]:
    """The links whose values the events of one round set (held ones wait for their restore)."""
    out: dict[Pair, None] = {}
    for ev in events:
        links = ev.cut_links() if isinstance(ev, PartitionEvent) else ev.links
        out.update(dict.fromkeys(links))
    return sorted(out)



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


class SelfTimeline:
    """One worker's speed and pause events at a time (``at_s``), each taken once, in order,
    when its clock (the run's, or the simulator's virtual one) reaches it: ``due(now_s)``."""

    def __init__(self, events):
        self.events = sorted(events, key=lambda ev: ev.at_s)
        self.next = 0

    def due(self, now_s: float) -> tuple[float | None, float]:
        """(the speed from now on, None when unchanged; seconds to pause now) of the events
        with at_s <= now_s not taken yet."""
        speed, pause_s = None, 0.0
        while self.next < len(self.events) and self.events[self.next].at_s <= now_s:
            ev = self.events[self.next]
            if isinstance(ev, SpeedEvent):
                speed = ev.speed
            else:
                pause_s += ev.seconds
            self.next += 1
        return speed, pause_s


class World:
    """A scenario's rounds as seen by every worker. ``peers(rank, t, alive)`` is the exchange
    partners of the algorithm (the living graph's, or DiLoCo's ring); ``neighbours(rank)``
    the full graph's neighbours, used to pick a joiner's donor."""

    def __init__(self, scenario: Scenario | None, workers: int, rounds: int,
                 failure_detect_s: float, peers: PeersFn,
                 neighbours: Callable[[int], list] | None = None,
                 base_link: BaseLink = unshaped_link, trace: LinkTrace | None = None):
        if not (math.isfinite(failure_detect_s) and 0.0 <= failure_detect_s <= 3600.0):
            raise ScenarioError(f"run.failure_detect_s = {failure_detect_s!r} is out of range; "
                                "expected [0, 3600] seconds")
        self.scenario, self.workers, self.rounds = scenario, workers, rounds
        self.failure_detect_s, self._peers = failure_detect_s, peers
        self._neighbours = neighbours or (lambda rank: [])
        if scenario is not None:
            check_supported(scenario, trace)
        # leaves, joins and partitions at a time, fixed at rounds as the run goes (``fix``)
        self.fixer = RoundFixer(scenario) if scenario and timed_items(scenario) else None
        self.fixings: list[Fixing] = []
        self.view = scenario   # the scenario by round: what is fixed so far, in rounds
        self._fixed_at_s: dict = {}
        self.links = (LinkSchedule(scenario, rounds, base_link, trace)
                      if scenario is not None else None)
        if self.fixer is not None:
            self._refix()
        if scenario is not None:
            self._check_donors()

    def fix(self, fixings: list[Fixing]) -> None:
        """Play leaves, joins and partitions at a time from the rounds they were fixed at
        (``fixing.RoundFixer``); rounds before them come out as before."""
        items = {(index, part) for _, index, part in (self.fixer.items if self.fixer else ())}
        for f in fixings:   # they may come over the control plane: each must be one of ours
            if (f.index, f.part) not in items:
                raise ValueError(f"fixing of event {f.index} ({f.part}): the scenario has no "
                                 "such leave, join or partition at a time")
        known = {(f.index, f.part) for f in self.fixings}
        new = [f for f in fixings if (f.index, f.part) not in known]
        if new:
            self.fixings.extend(new)
            self._refix()

    def _refix(self) -> None:
        self.view, self._fixed_at_s = by_round(self.scenario, self.fixings)
        self.__dict__.pop("_by_round", None)
        self.links.build(self.view)

    @property
    def churns(self) -> bool:
        """Whether workers leave or join: the algorithms then mix over the living."""
        return self.scenario is not None and churns(self.scenario)

    @property
    def partitions(self) -> bool:
        """Whether a partition cuts links: the algorithms then mix without the cut edges."""
        return self.scenario is not None and any(
            isinstance(ev, PartitionEvent) for ev in self.scenario.events)

    @property
    def reshapes(self) -> bool:
        """Whether the algorithms must follow the world round by round (who lives, what is
        cut), instead of the full graph or ring."""
        return self.churns or self.partitions

    @property
    def changes_links(self) -> bool:
        """Whether link events change rates or latencies (a shaper or link model must apply
        them)."""
        return self.links is not None and self.links.changes_links

    def cut_edges(self, t: int) -> frozenset:
        """The undirected edges a partition cuts in round t."""
        return self.links.cut_edges(t) if self.links is not None else frozenset()

    def heals(self, t: int) -> bool:
        """Whether links a partition cut in round t-1 are back in round t."""
        return t > 0 and bool(self.cut_edges(t - 1) - self.cut_edges(t))

    def ring_members(self, rank: int) -> Callable[[int], frozenset]:
        """``members(t)`` for worker ``rank``'s DiLoCo ring: the living workers it is not cut
        from (its group during a partition; everyone alive otherwise)."""
        def members(t: int) -> frozenset:
            alive = self.alive(t)
            cut = self.cut_edges(t)
            return frozenset(w for w in alive if _edge(rank, w) not in cut)
        return members

    def _peers_at(self, rank: int, t: int, alive: frozenset) -> list:
        cut = self.cut_edges(t)
        return self._peers(rank, t, alive, cut=cut) if cut else self._peers(rank, t, alive)

    def _check_donors(self) -> None:
        """A joiner's donor must be reachable: refuse a named donor that a partition cuts."""
        for ev in self.view.round_events:
            if isinstance(ev, JoinEvent) and ev.from_worker is not None and \
                    _edge(ev.worker, ev.from_worker) in self.cut_edges(ev.round):
                raise ScenarioError(
                    f"{self.scenario.source}: join of worker {ev.worker} at round {ev.round} "
                    f"from worker {ev.from_worker}: a partition cuts them apart in that round; "
                    "name a donor in the joiner's group")

    @cached_property
    def _by_round(self) -> dict[int, list]:
        out: dict[int, list] = {}
        for ev in (self.view.round_events if self.view else ()):
            out.setdefault(ev.round, []).append(ev)
        return out

    @property
    def _initial(self) -> frozenset:
        """Who is alive before round 0: everyone but the scenario's new workers."""
        return self.scenario.initial if self.scenario else frozenset(range(self.workers))

    def alive(self, t: int) -> frozenset:
        """The workers taking part in round t."""
        if self.scenario is None:
            return frozenset(range(self.workers))
        return self.view.membership_at(t)

    def plan(self, rank: int, t: int) -> RoundPlan:
        """What worker ``rank`` does at the start of round t."""
        alive = self.alive(t)
        was = self.alive(t - 1) if t > 0 else self._initial
        joins = self._donors(t, was & alive)
        return RoundPlan(
            alive=alive, active=rank in alive, leaving=rank in was - alive,
            join_from=joins.get(rank), donate_to=tuple(j for j, d in joins.items() if d == rank),
            detect_s=self._detect_s(rank, t, was, alive), speed=self._speed(rank, t),
            pause_s=self._pause_s(rank, t))

    def _events(self, t: int, cls: type) -> list:
        return [ev for ev in self._by_round.get(t, ()) if isinstance(ev, cls)]

    def _donors(self, t: int, stay: frozenset) -> dict[int, int]:
        """{joiner: donor} for the joins of round t; donors are alive in rounds t-1 and t
        (the parameters of the end of t-1, sent at the start of t)."""
        return {ev.worker: self.donor(ev, stay) for ev in self._events(t, JoinEvent)}

    def donor(self, ev: JoinEvent, stay: frozenset) -> int:
        """The scenario's ``from_worker``, else the lowest-ranked living neighbour, else the
        lowest-ranked living worker; during a partition, among those the joiner can reach."""
        if ev.from_worker is not None:
            return ev.from_worker
        cut = self.cut_edges(ev.round) if ev.round is not None else frozenset()
        reach = {w for w in stay if _edge(ev.worker, w) not in cut} or set(stay)
        near = sorted(set(self._neighbours(ev.worker)) & reach)
        return near[0] if near else min(reach)

    def _detect_s(self, rank: int, t: int, was: frozenset, alive: frozenset) -> float:
        """``failure_detect_s`` when a peer of ``rank``'s in round t-1 is gone in round t, or
        cut from it by a partition that starts in round t."""
        if t == 0 or rank not in alive or rank not in was:
            return 0.0
        lost = (was - alive) | self._newly_cut(rank, t)
        return self.failure_detect_s if lost & set(self._peers_at(rank, t - 1, was)) else 0.0

    def _newly_cut(self, rank: int, t: int) -> set[int]:
        """The workers a partition cuts from ``rank`` in round t but not in round t-1."""
        new = self.cut_edges(t) - self.cut_edges(t - 1)
        return {b if a == rank else a for a, b in new if rank in (a, b)}

    def _speed(self, rank: int, t: int) -> float | None:
        speeds = [ev.speed for ev in self._events(t, SpeedEvent) if ev.worker == rank]
        return speeds[-1] if speeds else None

    def _pause_s(self, rank: int, t: int) -> float:
        return sum(ev.seconds for ev in self._events(t, PauseEvent) if ev.worker == rank)

    def records(self, t: int) -> list[dict]:
        """The events of round t as events.jsonl objects (``scenario.as_record``), a join with
        the donor it took, a departure with the peers that spend time noticing it; link and
        partition events as the Timeline fired them (restores included), with the values
        ``applied`` to each directed link for the messages of round t on."""
        out = []
        for ev in self._by_round.get(t, ()):
            if isinstance(ev, (LinkEvent, PartitionEvent)):
                continue   # from the schedule below, as fired
            rec = as_record(ev) | self._fixed(ev)
            if isinstance(ev, JoinEvent):
                rec["from_worker"] = self.plan(ev.worker, t).join_from
            if isinstance(ev, LeaveEvent):
                rec["detected_by"] = sorted(r for r in self.alive(t)
                                            if self.plan(r, t).detect_s > 0)
            out.append(rec)
        return out + self._link_records(t)

    def _link_records(self, t: int) -> list[dict]:
        if self.links is None:
            return []
        out = []
        for ev in self.links.fired.get(t, ()):
            rec = as_record(ev) | self._fixed(ev)
            if rec.get("source") == "restore":   # per-link values (unshaped: null) in applied
                rec |= {"rate_mbit": None, "latency_ms": None, "loss_pct": None}
            links = ev.cut_links() if isinstance(ev, PartitionEvent) else ev.links
            rec["applied"] = [applied_row(link, self.links.changes[t][link]) for link in links]
            if isinstance(ev, PartitionEvent):
                rec["detected_by"] = sorted(r for r in self.alive(t)
                                            if self.plan(r, t).detect_s > 0)
            out.append(rec)
        return out

    def _fixed(self, ev: Event) -> dict:
        """An event at a time fixed at its round: its time too (``at_s``), for the record."""
        return self._fixed_at_s.get(ev, {})

    def timed_self(self, rank: int) -> SelfTimeline | None:
        """Worker ``rank``'s speed and pause events at a time, or None when it has none."""
        events = [ev for ev in (self.scenario.time_events if self.scenario else ())
                  if isinstance(ev, (SpeedEvent, PauseEvent)) and ev.worker == rank]
        return SelfTimeline(events) if events else None

    def departed(self) -> frozenset:
        """Workers that leave at some round and are not back at the end."""
        return frozenset(range(self.workers)) - self.alive(self.rounds - 1)

    def left_and_joined(self) -> list[dict]:
        """Who left and joined, in which round (for the run record's summary)."""
        out = []
        for ev in (self.view.round_events if self.view else ()):
            if isinstance(ev, (LeaveEvent, JoinEvent)):
                change = {"type": ev.kind, "worker": ev.worker, "round": ev.round}
                out.append(change | self._fixed(ev))
        return out

    def awaits_join(self, rank: int, t: int) -> bool:
        """Whether ``rank`` is absent in round t until a join at a time that is not fixed yet
        (none of its joins is fixed at a later round)."""
        if self.fixer is None or rank in self.alive(t) or self.join_round(rank, t + 1) is not None:
            return False
        fixed = {f.index for f in self.fixings}
        return any(isinstance(ev, JoinEvent) and ev.worker == rank and not ev.by_round
                   and i not in fixed for i, ev in enumerate(self.scenario.events))

    def sits_out(self, rank: int, t: int) -> bool:
        """Whether ``rank`` has no part in round t: absent in it and not leaving at it."""
        return rank not in self.alive(t) and (t == 0 or rank not in self.alive(t - 1))

    def join_round(self, rank: int, after: int) -> int | None:
        """The first round >= ``after`` at which ``rank`` joins, as far as fixed; None: none."""
        rounds = [ev.round for ev in (self.view.round_events if self.view else ())
                  if isinstance(ev, JoinEvent) and ev.worker == rank and ev.round >= after]
        return min(rounds) if rounds else None

    def not_fired(self) -> list[dict]:
        """Leaves, joins and partitions at a time that the run did not reach (or fixed at a
        round it does not have)."""
        fired = {(f.index, f.part) for f in self.fixings if f.round < self.rounds}
        return [{"type": ev.kind, "part": part, "at_s": at_s} | (
                    {"groups": [list(g) for g in ev.groups]} if isinstance(ev, PartitionEvent)
                    else {"worker": ev.worker})
                for at_s, i, part in (self.fixer.items if self.fixer else ())
                for ev in [self.scenario.events[i]] if (i, part) not in fired]


def by_round(scenario: Scenario, fixings: list[Fixing]) -> tuple[Scenario, dict]:
    """``scenario`` with its leaves, joins and partitions at a time at the rounds they were
    fixed at, those not fixed yet left out (a new worker stays absent until its join is fixed);
    and {such event at its round: its times, ``at_s`` and a partition's ``end_s``}. Fixings at
    a round the run does not have fire never, and a partition whose end is not fixed lasts so
    far."""
    rounds = {(f.index, f.part): f.round for f in fixings if f.round < scenario.rounds}
    events, at_s = [], {}
    for i, ev in enumerate(scenario.events):
        if ev.by_round or not isinstance(ev, TIMED_KINDS):
            events.append(ev)
        elif (i, "start") in rounds:
            fixed = dataclasses.replace(ev, round=rounds[(i, "start")], at_s=None, **(
                {"end_s": None, "end_round": rounds.get((i, "end"))}
                if isinstance(ev, PartitionEvent) else {}))
            events.append(fixed)
            at_s[fixed] = {"at_s": ev.at_s} | (
                {"end_s": ev.end_s} if isinstance(ev, PartitionEvent) else {})
    view = Scenario(tuple(events), scenario.workers, scenario.rounds, scenario.source,
                    absent=scenario.newcomers)
    return view, {ev: at_s[old] for ev, old in zip(view.events, events, strict=True)
                  if old in at_s}


def applied_row(link: Pair, state: LinkState) -> dict:
    """One link's values in force, for events.jsonl (rate_mbit null: unshaped; 0: cut)."""
    rate, latency = state
    return {"src": link[0], "dst": link[1], "rate_mbit": rate, "latency_ms": latency}


def _edge(a: int, b: int) -> Pair:
    return (a, b) if a < b else (b, a)


def churns(scenario: Scenario) -> bool:
    """Whether the scenario's workers leave or join."""
    return any(isinstance(ev, (LeaveEvent, JoinEvent)) for ev in scenario.events)


def check_supported(scenario: Scenario, trace: LinkTrace | None = None) -> None:
    """Refuse, before the run, what the runners cannot do yet (one line, exit 2)."""
    _check_one_clock(scenario)
    _check_timed_donors(scenario)
    for ev in scenario.events:
        if isinstance(ev, LinkEvent) and ev.loss_pct is not None:
            raise ScenarioError(f"{scenario.source}: link event at {ev.when()}: loss_pct = "
                                f"{ev.loss_pct:g} is not applied (neither the simulator nor the "
                                "userspace shaper models loss); give only rate_mbit and "
                                "latency_ms")
        if isinstance(ev, JoinEvent) and ev.worker >= scenario.workers:
            raise ScenarioError(f"{scenario.source}: join of worker {ev.worker}: the run has "
                                f"ids 0..{scenario.workers - 1}; count a new worker in workers "
                                f"(workers = {ev.worker + 1}): a worker whose first event is a "
                                "join is absent from the start until then")
    _check_one_clock_per_link(scenario, trace)
    _check_one_trigger_per_speed(scenario)


def _check_one_trigger_per_speed(scenario: Scenario) -> None:
    """A worker's speed set both at rounds and at times would take whichever came last, which
    depends on how fast the run goes: refused."""
    by_round = {ev.worker for ev in scenario.round_events if isinstance(ev, SpeedEvent)}
    for ev in scenario.time_events:
        if isinstance(ev, SpeedEvent) and ev.worker in by_round:
            raise ScenarioError(f"{scenario.source}: worker {ev.worker}'s speed is set both at "
                                f"rounds and at a time ({ev.when()}); give its speed events "
                                "one trigger")


def _check_one_clock_per_link(scenario: Scenario, trace: LinkTrace | None) -> None:
    """A link changed both at rounds and at times would take whichever came last, which
    depends on how fast the run goes: refused."""
    by_round = {link for ev in scenario.round_events if isinstance(ev, LinkEvent)
                for link in ev.links}
    timed = [(link, ev) for ev in scenario.time_events if isinstance(ev, LinkEvent)
             for link in ev.links]
    timed += [(link, None) for link in (trace.points if trace is not None else ())]
    for link, ev in timed:
        if link in by_round:
            what = f"a link event at {ev.when()}" if ev is not None else trace.source
            raise ScenarioError(f"{scenario.source}: link {link[0]}->{link[1]} is changed both "
                                f"by round and by time ({what}); use one clock per link")


def from_config(cfg, topo, algo, link_plan) -> World | None:
    """The world of a resolved config (the run plan builds it once): None without a scenario
    or a link trace. ``topo``: the full gossip graph (None for an algorithm without one, whose
    exchange partners are its ring's neighbours); ``algo``: the algorithm's class, whose traits
    decide what a scenario may do with it; ``link_plan``: the bandwidth profile's."""
    if not (cfg.run.scenario or cfg.net.link_trace):
        return None
    scenario = (load_scenario(cfg.run.scenario, cfg.workers, cfg.run.rounds)
                if cfg.run.scenario else Scenario((), cfg.workers, cfg.run.rounds, "no scenario"))
    trace = (load_link_trace(cfg.net.link_trace, scenario.total_workers)
             if cfg.net.link_trace else None)
    check_with_config(scenario, cfg, algo, trace)
    base = base_link(cfg, link_plan)
    if topo is None:
        return World(scenario, cfg.workers, cfg.run.rounds, cfg.run.failure_detect_s,
                     ring_peers, base_link=base, trace=trace)
    return World(scenario, cfg.workers, cfg.run.rounds, cfg.run.failure_detect_s,
                 graph_peers(topo),
                 lambda rank: sorted(j for e in topo.possible_edges if rank in e
                                     for j in e if j != rank), base_link=base, trace=trace)


def graph_peers(topo) -> PeersFn:
    """Gossip's exchange partners: the living graph's neighbours without the cut edges."""
    def peers(rank: int, t: int, alive: frozenset, cut: frozenset = frozenset()) -> list[int]:
        return LivingGraph(topo, lambda _t: alive, lambda _t: cut).peers(rank, t)
    return peers


def ring_peers(rank: int, t: int, alive: frozenset,
               cut: frozenset = frozenset()) -> list[int]:
    """DiLoCo's exchange partners: its neighbours on the ring over the living workers it is
    not cut from (its group during a partition), in rank order."""
    ring = sorted(w for w in alive if _edge(rank, w) not in cut) if rank in alive else []
    if rank not in alive or len(ring) < 2:
        return []
    k = ring.index(rank)
    return sorted({ring[k - 1], ring[(k + 1) % len(ring)]} - {rank})


def _check_one_clock(scenario: Scenario) -> None:
    """Leaves, joins and partitions all by round or all at a time: an event at a time is fixed
    at a round only as the run goes, so its order against one by round is not known before."""
    kinds = {ev.by_round: ev for ev in scenario.events if isinstance(ev, TIMED_KINDS)}
    if len(kinds) == 2:
        timed, by_round_ev = kinds[False], kinds[True]
        raise ScenarioError(f"{scenario.source}: {timed.kind} event at {timed.when()} and "
                            f"{by_round_ev.kind} event at {by_round_ev.when()}: leave, join and "
                            "partition events must all use round or all use at_s (a time is "
                            "fixed at a round only as the run goes)")


def _check_timed_donors(scenario: Scenario) -> None:
    """A join at a time whose named donor a partition cuts from it at that time is refused."""
    parts = [ev for ev in scenario.time_events if isinstance(ev, PartitionEvent)]
    for ev in scenario.time_events:
        if not isinstance(ev, JoinEvent) or ev.from_worker is None:
            continue
        for p in parts:
            holds = p.at_s <= ev.at_s and (p.end_s is None or ev.at_s < p.end_s)
            if holds and _edge(ev.worker, ev.from_worker) in {_edge(*link)
                                                              for link in p.cut_links()}:
                raise ScenarioError(
                    f"{scenario.source}: join of worker {ev.worker} at {ev.when()} from worker "
                    f"{ev.from_worker}: the partition at {p.when()} cuts them apart then; name a "
                    "donor in the joiner's group")


def check_with_config(scenario: Scenario, cfg, algo, trace: LinkTrace | None = None) -> None:
    """What a scenario (and a link trace) cannot be combined with (one line, exit 2)."""
    if trace is not None and cfg.net.shaper == "none":
        raise ScenarioError(f"{trace.source} with net.shaper = 'none' would not be applied; "
                            "choose net.shaper = 'auto' or 'userspace'")
    churn = churns(scenario)
    why = algo.scenario_refusal(cfg, churn)
    if why:
        raise ScenarioError(f"{scenario.source}: {why}")
    _check_partitions_for(scenario, cfg, algo)
    timed_speed = [ev for ev in scenario.time_events if isinstance(ev, SpeedEvent)]
    if timed_speed and cfg.compute.inner_budget_s > 0:
        raise ScenarioError(f"{scenario.source}: speed event at {timed_speed[0].when()} with "
                            f"compute.inner_budget_s = {cfg.compute.inner_budget_s:g}: the steps "
                            "a budget allows would depend on how fast the run goes; give it a "
                            "round (round = R)")
    if churn and cfg.fault.worker >= 0:
        raise ScenarioError(f"{scenario.source}: workers leave or join, and fault.worker = "
                            f"{cfg.fault.worker} injects a failure too; use one or the other")


def _check_partitions_for(scenario: Scenario, cfg, algo) -> None:
    """An algorithm that all-reduces within each group (DiLoCo): a living worker in neither
    group would have no ring (it reaches both sides, which cannot reach each other). Link
    events need a shaper."""
    for ev in scenario.events:
        if isinstance(ev, LinkEvent) and cfg.net.shaper == "none":
            raise ScenarioError(f"{scenario.source}: link event at {ev.when()} with "
                                "net.shaper = 'none' would not be applied; choose net.shaper = "
                                "'auto' or 'userspace'")
        if not isinstance(ev, PartitionEvent) or not algo.groups_all_reduce():
            continue
        named = set(ev.groups[0] + ev.groups[1])
        for when, alive in _alive_during(scenario, ev, cfg.run.rounds):
            stray = sorted(alive - named)
            if stray:
                raise ScenarioError(f"{scenario.source}: partition at {ev.when()}: worker "
                                    f"{stray[0]} is alive {when} and in neither group; "
                                    f"with {algo.name} every living worker must be in one "
                                    "group")


def _alive_during(scenario: Scenario, p: PartitionEvent, rounds: int):
    """(when, who is alive then) over a partition: each of its rounds, or (at a time) each
    membership the scenario's leaves and joins at a time give while it holds."""
    if p.by_round:
        end = p.end_round if p.end_round is not None else rounds
        yield from ((f"in round {t}", scenario.membership_at(t)) for t in range(p.round, end))
        return
    end_s = math.inf if p.end_s is None else p.end_s
    spans = [(0.0, scenario.initial), *scenario.time_members]
    for k, (start_s, alive) in enumerate(spans):
        next_s = spans[k + 1][0] if k + 1 < len(spans) else math.inf
        if start_s < end_s and next_s > p.at_s:
            yield f"at {max(start_s, p.at_s):g} s", alive


def membership_summary(world: World) -> dict:
    """Who left and joined, and who is alive at the end (the run record's summary)."""
    return {"changes": world.left_and_joined(),
            # new workers: absent from the start until their first join
            "new_workers": sorted(world.scenario.newcomers) if world.scenario else [],
            "alive_at_end": sorted(world.alive(world.rounds - 1)),
            "failure_detect_s": world.failure_detect_s} | (
                {"not_fired": world.not_fired()} if world.fixer is not None else {})


def link_changes(links) -> list[dict]:
    """Every link change a run applies (``world.LinkSchedule``), in order: the round-triggered
    ones (cuts and restores included), then each link of each time-triggered one; with the
    values configured (rate_mbit None: unshaped; 0.0: cut), not yet observed."""
    out = [_change(src, dst, state, round_idx=t)
           for t, changed in sorted(links.changes.items())
           for (src, dst), state in sorted(changed.items())]
    if links.timed is not None:
        out += [_change(*link, links.timed.in_force(*link, ev.at_s), at_s=ev.at_s)
                for ev in links.timed.events for link in ev.links]
    return out


def _change(src: int, dst: int, state: tuple, *, round_idx: int | None = None,
            at_s: float | None = None) -> dict:
    rate_mbit, latency_ms = state
    return {"src": src, "dst": dst, "round": round_idx, "at_s": at_s, "rate_mbit": rate_mbit,
            "latency_ms": latency_ms}


OBSERVE_ROUNDS = 3   # rows read per change: the first can hold a transient (see below)


def observed_link_changes(changes: list[dict], rows: list[dict]) -> list[dict]:
    """``changes`` (``link_changes``), each with the rate its link delivered afterwards.

    ``rows``: {worker, round, recv_links} of metrics rows (``worker.link_row``). A change is
    read in the first ``OBSERVE_ROUNDS`` rows (by round) of its destination that have messages
    from its source sent after it (of a round >= its round, or whose earliest message was sent
    at or after its time) and before the link's next change. Each reading is the bytes over
    their wire time: the summed transfer times less one configured latency per message, so
    that it compares with the configured rate. ``observed_mbit`` is their median: under tc a
    change applied while a message is in flight leaves the next one queued behind its rest
    (measured: 3.8 Mbit/s in the first round after 50 -> 5, then 5.03 and 4.88), and the
    median of three sees through one such round. A cut carries nothing and is not observed;
    without such a row the observation is None.
    """
    by_worker: dict[int, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["round"]):
        by_worker.setdefault(row["worker"], []).append(row)
    out = []
    for i, change in enumerate(changes):
        link = (change["src"], change["dst"])
        after = next((c for c in changes[i + 1:] if (c["src"], c["dst"]) == link), None)
        out.append(change | _observation(change, after, by_worker.get(change["dst"], [])))
    return out


def _observation(change: dict, after: dict | None, rows: list[dict]) -> dict:
    """observed_mbit (the median reading), observed_round (the first row read) and the
    readings of one change, from its destination's rows."""
    readings: list[tuple[int, float | None]] = []
    for row in rows if change["rate_mbit"] != 0.0 else ():   # a cut carries no message
        use = row["recv_links"].get(str(change["src"]))
        if use is None or not _sent_after(change, row["round"], use["sent_s"]):
            continue
        if after is not None and _sent_after(after, row["round"], use["sent_s"]):
            break
        readings.append((row["round"], _observed_mbit(use, change["latency_ms"])))
        if len(readings) == OBSERVE_ROUNDS:
            break
    known = [m for _, m in readings if m is not None]
    return {"observed_mbit": statistics.median(known) if known else None,
            "observed_round": readings[0][0] if readings else None,
            "observed_each_mbit": [m for _, m in readings]}


def _sent_after(change: dict, round_idx: int, sent_s: float) -> bool:
    if change["round"] is not None:
        return round_idx >= change["round"]
    return sent_s >= change["at_s"]


def _observed_mbit(use: dict, latency_ms: float | None) -> float | None:
    """Mbit/s over the wire time; None when the latency accounts for all of the transfer (a
    link too fast to tell apart from its latency)."""
    wire_s = use["transfer_s"] - use["messages"] * (latency_ms or 0.0) / 1e3
    return round(use["bytes"] * 8 / 1e6 / wire_s, 4) if wire_s > 0 else None


class EventFeed:
    """Hands each round's scenario events to ``sink`` once, when the first metrics row of that
    round (or a later one) reaches the runner; ``logged_at_s`` is that row's ``time_s``."""

    def __init__(self, world: World, sink: Callable[[dict], None], shaper: str | None = None):
        self.world, self.sink, self.next_round, self.shaper = world, sink, 0, shaper
        self.timed_upto_s = -math.inf   # time-triggered changes up to here are logged
        # speed and pause events at a time, logged with the first row of their worker at or
        # past their time (they apply from its next round)
        self.self_timed = [ev for ev in (world.scenario.time_events if world.scenario else ())
                           if isinstance(ev, (SpeedEvent, PauseEvent))]

    def row(self, row: dict) -> None:
        t = row.get("round")
        if type(t) is not int or row.get("kind") not in (None, "metric"):
            return
        while self.next_round <= min(t, self.world.rounds - 1):
            for rec in self.world.records(self.next_round):
                self._log(self._with_timed(rec, self.next_round, row), row)
            self.next_round += 1
        self._timed(row)
        self._self_timed(row)

    def _self_timed(self, row: dict) -> None:
        now_s = self._now_s(row)
        if not self.self_timed or now_s is None:
            return
        due = [ev for ev in self.self_timed if ev.worker == row.get("worker") and
               ev.at_s <= now_s]
        for ev in due:
            self._log(as_record(ev), row)
            self.self_timed.remove(ev)

    def _now_s(self, row: dict) -> float | None:
        now_s = row.get("time_s")
        return now_s if isinstance(now_s, (int, float)) else None

    def _with_timed(self, rec: dict, t: int, row: dict) -> dict:
        """A round's record whose links include some changed by time (a restore brings back
        the value in force then): their ``applied`` values at the row's time."""
        links, now_s = self.world.links, self._now_s(row)
        if "applied" not in rec or links is None or links.timed is None or now_s is None:
            return rec
        return rec | {"applied": [applied_row((a["src"], a["dst"]),
                                              links.at(a["src"], a["dst"], t, now_s))
                                  for a in rec["applied"]]}

    def _timed(self, row: dict) -> None:
        """The time-triggered link changes up to the row's time (the run's clock); links a
        partition holds cut in the row's round are ``held`` (their restore brings the value)."""
        timed = self.world.links.timed if self.world.links is not None else None
        now_s = self._now_s(row)
        if timed is None or now_s is None:
            return
        cut = self.world.links.cut(row["round"])
        for ev in timed.due(self.timed_upto_s, now_s):
            rec = as_record(ev) | {"applied": [a for a in timed.applied(ev)
                                               if (a["src"], a["dst"]) not in cut]}
            held = [list(link) for link in ev.links if link in cut]
            self._log(rec | ({"held": held} if held else {}), row)
        self.timed_upto_s = max(self.timed_upto_s, now_s)

    def _log(self, rec: dict, row: dict) -> None:
        if "applied" in rec and self.shaper is not None:
            rec["applied_by"] = self.shaper
        self.sink(rec | {"logged_at_s": row.get("time_s")})


def event_text(rec: dict) -> str:
    """One line for the dashboard or the log: ``round 3: worker 2 leaves``."""
    what = {"leave": "worker {worker} leaves",
            "join": "worker {worker} joins from worker {from_worker}",
            "speed": "worker {worker} runs at speed {speed:g}",
            "pause": "worker {worker} pauses for {seconds:g} s",
            "link": "links {links} change",
            "partition": "partition {groups}"}.get(rec["type"], rec["type"])
    when = f"round {rec['round']}" if rec.get("round") is not None else f"{rec['at_s']:g} s"
    if rec.get("round") is not None and rec.get("at_s") is not None:   # fixed at that round
        when += f" (at_s {rec['at_s']:g})"
    return f"{when}: " + what.format(**rec)


def event_feed(world: World | None, rec, progress=None,
               shaper: str | None = None) -> EventFeed | None:
    """The runner's feed: each event into the record's events.jsonl and onto the display;
    ``shaper`` names what applies link changes (recorded with each one as ``applied_by``)."""
    if world is None:
        return None

    def sink(event: dict) -> None:
        rec.event(event)
        if progress is not None:
            progress({"kind": "event", "text": event_text(event)})
    return EventFeed(world, sink, shaper)


def base_link(cfg, link_plan) -> Callable[[int, int], LinkState]:
    """(src, dst) -> (rate_mbit or None, latency_ms) of each link before any scenario event:
    the profile's link rate in ``link_plan`` (its caps apart, see ``netplan.link_caps``), or
    unshaped."""
    if not cfg.net.bw_profile or cfg.net.shaper == "none":
        return unshaped_link
    plan = link_plan

    def base(src: int, dst: int) -> LinkState:
        link = plan.links.get((src, dst))
        return (None, 0.0) if link is None else (link.rate_mbit, link.latency_ms)
    return base
