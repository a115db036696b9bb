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
  at least one round after the highest any worker has started when a clock reaches its time,
  after the changes of its own workers before it), and
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
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from gasloc_emu.scenario.checks import (
    check_supported,
    check_with_config,
    checkpoint_rounds_before,
    churns,
)
from gasloc_emu.scenario.events import (
    Event,
    JoinEvent,
    LeaveEvent,
    LinkEvent,
    PartitionEvent,
    PauseEvent,
    ScenarioError,
    SpeedEvent,
    as_record,
)
from gasloc_emu.scenario.fixing import TIMED_KINDS, Fixing, RoundFixer, timed_items
from gasloc_emu.scenario.hostloss import (
    HostBack,
    HostLoss,
    HostLossError,
    dead_in,
    lost_spans,
    sent_to_dead,
    still_lost,
)
from gasloc_emu.scenario.links import (
    BaseLink,
    LinkSchedule,
    base_link,
    edge_key,
    unshaped_link,
)
from gasloc_emu.scenario.load import load_scenario
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.trace import LinkTrace, load_link_trace
from gasloc_emu.topology import LivingGraph

# peers(rank, t, alive[, cut=edges]): the workers ``rank`` exchanges with in round t when
# ``alive`` live and the (undirected, sorted) edges ``cut`` are cut; ``cut`` is passed only
# when a partition holds in round t
PeersFn = Callable[..., list]


@dataclass(frozen=True)
class RoundPlan:
    """What one worker does at the start of round t."""

    alive: frozenset          # the workers taking part in round t
    active: bool              # this worker takes part in round t
    leaving: bool = False     # it leaves now (its process is killed before the round)
    join_from: int | None = None  # it joins now, from this donor's parameters
    join_checkpoint: bool = False  # it joins now, from its own last checkpoint
    donate_to: tuple = ()     # joiners of round t that start from this worker's parameters
    joined: frozenset = frozenset()  # every worker that joins at round t (a new process)
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
                 base_link: BaseLink = unshaped_link, trace: LinkTrace | None = None,
                 checkpoint_every: int = 0, armed: bool = False, join_messages: int = 1):
        """``checkpoint_every``: the run's checkpoint period, so a join from a checkpoint
        knows which checkpoint rounds its worker took part in. ``armed``: a host may be lost
        without warning and the others go on (``run.on_worker_loss = continue``;
        ``scenario.hostloss``): every worker asks for the round's fixings and mixes over the
        living graph, as with leaves at a time. ``join_messages``: how many messages a donor
        sends a joiner (its parameters, and the algorithm's ``handover_kinds``)."""
        if not (math.isfinite(failure_detect_s) and 0.0 <= failure_detect_s <= 3600.0):
            raise ScenarioError(f"run.failure_detect_s = {failure_detect_s!r} is out of range; "
                                "expected [0, 3600] seconds")
        self.scenario, self.workers, self.rounds = scenario, workers, rounds
        self.failure_detect_s, self._peers = failure_detect_s, peers
        self.checkpoint_every, self.join_messages = checkpoint_every, join_messages
        self._neighbours = neighbours or (lambda rank: [])
        if scenario is not None:
            check_supported(scenario, trace)
        # leaves, joins and partitions at a time, fixed at rounds as the run goes (``fix``)
        self.armed = armed and scenario is not None
        self.fixer = RoundFixer(scenario) if scenario and (
            timed_items(scenario) or self.armed) else None
        self.fixings: list[Fixing] = []
        self.losses: list[HostLoss] = []   # hosts lost without warning, as decided
        self.backs: list[HostBack] = []    # lost hosts that came back, as decided
        self.view = scenario   # the scenario by round: what is fixed so far, in rounds
        # the scenario's events that workers lost with their hosts could not play (records)
        self.skipped: list[dict] = []
        self._fixed_at_s: dict = {}
        self.links = (LinkSchedule(scenario, rounds, base_link, trace)
                      if scenario is not None else None)
        if self.fixer is not None:
            self._refix()
        if scenario is not None:
            self._check_donors()

    def fix(self, fixings: list[Fixing]) -> None:
        """Play leaves, joins and partitions at a time from the rounds they were fixed at
        (``fixing.RoundFixer``); rounds before them come out as before. A ScenarioError, the
        world as it was, when with the hosts lost so far they would leave no worker alive
        (the scenario's own check held them with the lost workers there)."""
        items = {(index, part) for _, index, part in (self.fixer.items if self.fixer else ())}
        for f in fixings:   # they may come over the control plane: each must be one of ours
            if (f.index, f.part) not in items:
                raise ValueError(f"fixing of event {f.index} ({f.part}): the scenario has no "
                                 "such leave, join or partition at a time")
        known = {(f.index, f.part) for f in self.fixings}
        new = [f for f in fixings if (f.index, f.part) not in known]
        if new:
            self._decided(self.fixings, *new)

    def lose(self, loss: HostLoss) -> bool:
        """Play a host lost without warning: its workers leave at ``loss.round`` (node 0's
        decision, ``scenario.hostloss``); rounds before it come out as before. False when it
        was played already (the same decision may reach a worker twice)."""
        if not self.armed:
            raise ValueError(f"a host loss (node {loss.node}) in a run that does not go on "
                             "without a lost host (run.on_worker_loss is not 'continue')")
        loss.check(self.workers, self.rounds)
        if loss in self.losses:
            return False
        early = [r for r in loss.ranks for b in self.backs
                 if r in b.ranks and b.round >= loss.round]
        if early:
            raise HostLossError(f"host loss of worker {early[0]} at round {loss.round}: it comes "
                                "back at that round or later")
        self._decided(self.losses, loss)
        return True

    def back(self, back: HostBack) -> bool:
        """Play a lost host's return: its workers join at ``back.round`` (node 0's decision,
        ``scenario.hostloss``), each from its checkpoint or a living neighbour's parameters;
        rounds before it come out as before. False when it was played already."""
        if back in self.backs:
            return False
        back.check(self.workers, self.losses, self.backs)
        self._decided(self.backs, back)
        return True

    def _decided(self, into: list, *decisions) -> None:
        """Play fixings, a loss or a return, or raise the ScenarioError of the world they
        would make (no worker left) with the world as it was."""
        into.extend(decisions)
        try:
            self._refix()
        except ScenarioError:
            del into[-len(decisions):]
            self._refix()
            raise

    def peers(self, rank: int, t: int) -> list:
        """Whom ``rank`` exchanges with in round t (the living graph without cut edges, or
        DiLoCo's ring)."""
        return self._peers_at(rank, t, self.alive(t))

    def sends(self, rank: int, peer: int, t: int) -> int:
        """How many messages ``rank`` sends ``peer`` in round t: 2(n - 1) to its next worker
        on a ring All-Reduce of n (``ring_peers``' exchange), one to each gossip neighbour;
        and a donor's ``join_messages`` to the worker joining from it."""
        donated = self.join_messages if self.plan(peer, t).join_from == rank else 0
        if peer not in self.peers(rank, t):
            return donated
        count = getattr(self._peers, "sends", None)   # a plain peers function: one each
        return donated + (1 if count is None else count(rank, peer, self.ring_members(rank)(t)))

    def sent_to_dead(self) -> dict[int, int]:
        """{survivor: n}: its messages to workers lost with their hosts, in the rounds they
        were members but dead (``hostloss.sent_to_dead``), over every loss."""
        out: dict[int, int] = {}
        for loss in self.losses:
            for rank, n in sent_to_dead(loss, self.rounds, self.sends, self.alive).items():
                out[rank] = out.get(rank, 0) + n
        return out

    def lost_now(self) -> frozenset[int]:
        """The workers lost with their hosts and not back (those a return takes back)."""
        return still_lost(self.losses, self.backs)

    def dead_in(self, src: int, t: int) -> bool:
        """Whether ``src`` is dead in round t, as a lost host's worker that had not come back
        (the run has no row of it then)."""
        return dead_in(src, t, self.losses, self.backs)

    def replay(self, fixings: list[Fixing]) -> None:
        """Play a run's fixings (its record's ``membership.fixings``) and fix nothing on this
        clock: the same rounds, so the same losses (``simulate --replay``)."""
        if self.fixer is None:
            raise ValueError("the scenario has no leave, join or partition at a time to replay")
        self.fix(fixings)
        self.fixer.close()

    def _refix(self) -> None:
        self.view, self._fixed_at_s, self.skipped = by_round(
            self.scenario, self.fixings, self.losses, self.backs)
        self.__dict__.pop("_by_round", None)
        self.links.build(self.view)

    @property
    def churns(self) -> bool:
        """Whether workers leave or join: the algorithms then mix over the living."""
        return self.scenario is not None and churns(self.scenario)

    @property
    def joins(self) -> bool:
        """Whether a worker joins (or comes back) during the run."""
        return self.scenario is not None and any(
            isinstance(ev, JoinEvent) for ev in self.scenario.events)

    @property
    def partitions(self) -> bool:
        """Whether a partition cuts links: the algorithms then mix without the cut edges."""
        return self.scenario is not None and any(
            isinstance(ev, PartitionEvent) for ev in self.scenario.events)

    @property
    def reshapes(self) -> bool:
        """Whether the algorithms must follow the world round by round (who lives, what is
        cut), instead of the full graph or ring."""
        return self.churns or self.partitions or self.armed

    @property
    def changes_links(self) -> bool:
        """Whether link events change rates or latencies (a shaper or link model must apply
        them)."""
        return self.links is not None and self.links.changes_links

    @property
    def plays_links(self) -> bool:
        """Whether the network must change links during the run: link events, a link trace,
        or a partition's cuts and restores."""
        return self.links is not None and (bool(self.links.changes) or self.partitions
                                           or self.links.timed is not None)

    def cut_edges(self, t: int) -> frozenset:
        """The undirected edges a partition cuts in round t."""
        return self.links.cut_edges(t) if self.links is not None else frozenset()

    def heals(self, t: int) -> bool:
        """Whether links a partition cut in round t-1 are back in round t, or a host lost
        without warning leaves at round t (DiLoCo's survivors then merge states that the lost
        workers' gap may have split: ``algorithms.diloco``)."""
        return t > 0 and (bool(self.cut_edges(t - 1) - self.cut_edges(t))
                          or any(loss.round == t for loss in self.losses))

    def ring_members(self, rank: int) -> Callable[[int], frozenset]:
        """``members(t)`` for worker ``rank``'s DiLoCo ring: the living workers it is not cut
        from (its group during a partition; everyone alive otherwise)."""
        def members(t: int) -> frozenset:
            alive = self.alive(t)
            cut = self.cut_edges(t)
            return frozenset(w for w in alive if edge_key(rank, w) not in cut)
        return members

    def _peers_at(self, rank: int, t: int, alive: frozenset) -> list:
        cut = self.cut_edges(t)
        return self._peers(rank, t, alive, cut=cut) if cut else self._peers(rank, t, alive)

    def _check_donors(self) -> None:
        """A joiner's donor must be reachable: refuse a named donor that a partition cuts."""
        for ev in self.view.round_events:
            if isinstance(ev, JoinEvent) and ev.from_worker is not None and \
                    edge_key(ev.worker, ev.from_worker) in self.cut_edges(ev.round):
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
            joined=alive - was,
            join_checkpoint=any(ev.worker == rank and self._restores(ev, t)
                                for ev in self._events(t, JoinEvent)),
            detect_s=self._detect_s(rank, t, was, alive), speed=self._speed(rank, t),
            pause_s=self._pause_s(rank, t))

    def _events(self, t: int, cls: type) -> list:
        return [ev for ev in self._by_round.get(t, ()) if isinstance(ev, cls)]

    def _donors(self, t: int, stay: frozenset) -> dict[int, int]:
        """{joiner: donor} for the joins of round t; donors are alive in rounds t-1 and t
        (the parameters of the end of t-1, sent at the start of t). A join from a checkpoint
        has no donor."""
        return {ev.worker: self.donor(ev, stay) for ev in self._events(t, JoinEvent)
                if not self._restores(ev, t)}

    def _restores(self, ev: JoinEvent, t: int) -> bool:
        """Whether the join of round t comes from the joiner's own checkpoint: it asks to,
        and it took part in a checkpoint round before t. A join at a time lands on a round
        known only as the run goes, so where its worker wrote no checkpoint before it, it
        joins from a donor instead, as every worker can tell from the rounds alone (a join
        by round without one is refused before the run: ``checks``)."""
        return ev.from_checkpoint and bool(self.restore_rounds(ev.worker, t))

    def restore_rounds(self, rank: int, t: int) -> list[int]:
        """The checkpoint rounds before t whose files ``rank`` wrote: those it took part in,
        but not those it was a member of while dead with a lost host (it wrote none then)."""
        return [r for r in checkpoint_rounds_before(self.view, rank, t, self.checkpoint_every)
                if not self.dead_in(rank, r)]

    def donor(self, ev: JoinEvent, stay: frozenset) -> int:
        """The scenario's ``from_worker``, else the lowest-ranked living neighbour, else the
        lowest-ranked living worker; during a partition, among those the joiner can reach."""
        if ev.from_worker is not None:
            return ev.from_worker
        cut = self.cut_edges(ev.round) if ev.round is not None else frozenset()
        reach = {w for w in stay if edge_key(ev.worker, w) not in cut} or set(stay)
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

    def fixed_time(self, ev: Event) -> dict:
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
                out.append(change | self.fixed_time(ev))
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


# why a lost worker's own scenario events are not played, by the loss's cause
LOST_WHY = {"host": "lost with its host", "worker": "its process was lost"}


def by_round(scenario: Scenario, fixings: list[Fixing], losses: list[HostLoss] = (),
             backs: list[HostBack] = ()) -> tuple[Scenario, dict, list[dict]]:
    """``scenario`` with its leaves, joins and partitions at a time at the rounds they were
    fixed at, those not fixed yet left out (a new worker stays absent until its join is fixed);
    {such event at its round: its times, ``at_s`` and a partition's ``end_s``}; and the
    scenario's events that workers lost with their hosts could not play (``_around_losses``),
    as records. Fixings at a round the run does not have fire never, and a partition whose end
    is not fixed lasts so far."""
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
    skipped: list[dict] = []
    if losses:
        events, skipped = _around_losses(scenario, events, at_s, losses, backs)
    view = Scenario(tuple(events), scenario.workers, scenario.rounds, scenario.source,
                    absent=scenario.newcomers)
    return view, {ev: at_s[old] for ev, old in zip(view.events, events, strict=True)
                  if old in at_s}, skipped


def _around_losses(scenario: Scenario, events: list, at_s: dict, losses: list[HostLoss],
                   backs: list[HostBack]) -> tuple[list, list[dict]]:
    """The events of a world with hosts lost without warning (``scenario.hostloss``): the
    scenario's, by round, then each loss's leaves and each return's joins, with what the lost
    workers cannot play left out (docs/ALGORITHM.md, "A host lost without warning").

    Walking the rounds in order with who is alive, in each round: a loss's workers leave (those
    alive then: one the scenario had made leave before is gone already) and a return's workers
    join; then the scenario's changes and its events that name workers, except
    - a leave or join of a worker while its host is lost (from the loss's round to its
      return's), or in the round its host is lost or back in: that worker's process is dead, or
      its host's return is its join ("lost with its host");
    - a join of a worker alive then, or a leave of one absent: the return brought it back, or
      the loss took it, before the scenario's change ("not alive" / "alive already");
    - a leave that would leave no worker alive in both that round and the one before: the
      scenario's own check held it with the lost workers there ("last worker");
    - a partition group, link pair or worker's speed or pause that names a worker absent then
      (a partition with a group left empty is left out);
    and a join whose named donor is absent takes the world's default donor. The scenario's own
    rounds are kept otherwise: without losses this returns them as given. The records say what
    was left out, and why."""
    gone = lost_spans(losses, backs)

    def lost(r: int, t: int) -> str | None:
        """Why ``r`` cannot change in round t: lost then, or its host lost or back in it."""
        return next((LOST_WHY[loss.cause] for loss, back in gone.get(r, ())
                     if loss.round <= t <= back), None)

    # round -> ([(rank, its loss)], [(rank, its return)]) of the decisions at that round
    hosts: dict[int, tuple[list, list]] = {}
    for side, decisions in ((0, losses), (1, backs)):
        for x in decisions:
            if x.round < scenario.rounds:
                hosts.setdefault(x.round, ([], []))[side].extend((r, x) for r in x.ranks)
    by_t: dict[int, list[int]] = {}
    for k, ev in enumerate(events):
        if ev.by_round:
            by_t.setdefault(ev.round, []).append(k)
    kept: dict[int, Any] = dict(enumerate(events))
    extra_leaves, extra_joins, skipped = [], [], []

    def skip(k: int, why: str) -> None:
        ev = kept.pop(k)
        skipped.append((ev.round, k, as_record(ev) | at_s.get(ev, {}) | {"why": why}))

    alive = set(scenario.initial)
    for t in sorted(set(by_t) | set(hosts)):
        before = set(alive)
        leaving, returning = hosts.get(t, ([], []))
        for r, loss in sorted(leaving, key=lambda rx: rx[0]):
            if r in alive:
                alive.discard(r)
                extra_leaves.append((r, loss))
        for r, back in returning:
            alive.add(r)
            extra_joins.append((r, back))
        changes = [k for k in by_t.get(t, ()) if isinstance(events[k], (LeaveEvent, JoinEvent))]
        for k in sorted(changes, key=lambda k: isinstance(events[k], JoinEvent)):
            ev = events[k]
            why = _unplayable(ev, t, lost, alive, before)
            if why is not None:
                skip(k, why)
            elif isinstance(ev, LeaveEvent):
                alive.discard(ev.worker)
            else:
                alive.add(ev.worker)
                if ev.from_worker is not None and ev.from_worker not in before & alive:
                    kept[k] = _moved(at_s, ev, dataclasses.replace(ev, from_worker=None))
        for k in by_t.get(t, ()):
            if k in kept and k not in changes:
                trimmed = _within(events[k], alive)
                if trimmed is None:
                    skip(k, "names workers lost with their host")
                elif trimmed != events[k]:
                    kept[k] = _moved(at_s, events[k], trimmed)
    out = [kept[k] for k in sorted(kept)]
    for r, loss in extra_leaves:
        out.append(LeaveEvent(worker=r, round=loss.round))
        at_s[out[-1]] = {"at_s": loss.at_s, "reason": loss.reason, "node": loss.node}
    for r, back in extra_joins:
        out.append(JoinEvent(worker=r, round=back.round, from_checkpoint=back.from_checkpoint))
        at_s[out[-1]] = {"at_s": back.at_s, "reason": "host back", "node": back.node}
    return out, [record for _, _, record in sorted(skipped, key=lambda s: s[:2])]


def _unplayable(ev, t: int, lost: Callable[[int, int], str | None], alive: set,
                before: set) -> str | None:
    """Why the scenario's leave or join ``ev`` of round t cannot be played in a world with
    lost hosts (``_around_losses``), or None."""
    w = ev.worker
    if (why := lost(w, t)) is not None:
        return why
    if isinstance(ev, JoinEvent):
        return "alive already" if w in alive else None
    if w not in alive:
        return "not alive"
    return None if before & (alive - {w}) else "last worker"


def _within(ev, alive: set):
    """``ev`` with only the workers in ``alive`` named: a partition's groups and a link
    event's pairs trimmed; None when nothing of it is left (a group emptied, no pair, a
    speed or pause of an absent worker)."""
    if isinstance(ev, PartitionEvent):
        groups = tuple(tuple(w for w in g if w in alive) for g in ev.groups)
        return dataclasses.replace(ev, groups=groups) if all(groups) else None
    if isinstance(ev, LinkEvent):
        links = tuple(p for p in ev.links if set(p) <= alive)
        if (ev.worker is not None and ev.worker not in alive) or not links:
            return None
        return dataclasses.replace(ev, links=links)
    if isinstance(ev, (SpeedEvent, PauseEvent)) and ev.worker not in alive:
        return None
    return ev


def _moved(at_s: dict, old, new):
    """``new`` in place of ``old``, with its times for the record."""
    if old in at_s:
        at_s[new] = at_s[old]
    return new


def from_config(cfg, topo, algo, link_plan, faults=None) -> World | None:
    """The world of a resolved config (the run plan builds it once): None without a scenario
    or a link trace. ``topo``: the full gossip graph (None for an algorithm without one, whose
    exchange partners are its ring's neighbours); ``algo``: the algorithm's class, whose traits
    decide what a scenario may do with it; ``link_plan``: the bandwidth profile's;
    ``faults``: a run record's random faults, played instead of drawing the scenario's."""
    armed = cfg.run.on_worker_loss == "continue"
    if not (cfg.run.scenario or cfg.net.link_trace or armed):
        return None
    scenario = (load_scenario(cfg.run.scenario, cfg.workers, cfg.run.rounds, faults)
                if cfg.run.scenario else Scenario((), cfg.workers, cfg.run.rounds, "no scenario"))
    trace = (load_link_trace(cfg.net.link_trace, scenario.total_workers)
             if cfg.net.link_trace else None)
    check_with_config(scenario, cfg, algo, trace)
    base = base_link(cfg, link_plan)
    if topo is None:
        return World(scenario, cfg.workers, cfg.run.rounds, cfg.run.failure_detect_s,
                     ring_peers, base_link=base, trace=trace,
                     checkpoint_every=cfg.run.checkpoint_every, armed=armed,
                     join_messages=1 + len(algo.handover_kinds))
    return World(scenario, cfg.workers, cfg.run.rounds, cfg.run.failure_detect_s,
                 graph_peers(topo), GraphNeighbours(topo), base_link=base, trace=trace,
                 checkpoint_every=cfg.run.checkpoint_every, armed=armed,
                 join_messages=1 + len(algo.handover_kinds))


def living_graph(topo, world: World | None):
    """The gossip graph the algorithm mixes over: the full one (``topo``), or its view over the
    workers ``world`` keeps alive in each round, without the edges a partition cuts."""
    if topo is None or world is None or not world.reshapes:
        return topo
    return LivingGraph(topo, world.alive, world.cut_edges)


def graph_peers(topo) -> PeersFn:
    """Gossip's exchange partners: the living graph's neighbours without the cut edges."""
    return GraphPeers(topo)


@dataclass(frozen=True)
class GraphPeers:
    """``graph_peers(topo)``: a value, not a closure, so a run plan holding its world pickles
    (the launcher hands the plan to its workers that way)."""

    topo: Any

    def __call__(self, rank: int, t: int, alive: frozenset,
                 cut: frozenset = frozenset()) -> list[int]:
        return LivingGraph(self.topo, lambda _t: alive, lambda _t: cut).peers(rank, t)


@dataclass(frozen=True)
class GraphNeighbours:
    """Every worker ``rank`` may ever exchange with on the full graph, sorted."""

    topo: Any

    def __call__(self, rank: int) -> list[int]:
        return sorted(j for e in self.topo.possible_edges if rank in e for j in e if j != rank)


class RingPeers:
    """DiLoCo's exchange partners: its neighbours on the ring over the living workers it is
    not cut from (its group during a partition), in rank order. A value, as ``GraphPeers``."""

    def __call__(self, rank: int, t: int, alive: frozenset,
                 cut: frozenset = frozenset()) -> list[int]:
        ring = sorted(w for w in alive if edge_key(rank, w) not in cut) if rank in alive else []
        if rank not in alive or len(ring) < 2:
            return []
        k = ring.index(rank)
        return sorted({ring[k - 1], ring[(k + 1) % len(ring)]} - {rank})

    @staticmethod
    def sends(rank: int, peer: int, members: frozenset) -> int:
        """Messages ``rank`` sends ``peer`` in a ring All-Reduce over ``members``: 2(n - 1)
        to the next worker on the ring (``transport.base.ring_steps``), none to the one
        before."""
        ring = sorted(members)
        return 2 * (len(ring) - 1) if ring[(ring.index(rank) + 1) % len(ring)] == peer else 0


ring_peers = RingPeers()
