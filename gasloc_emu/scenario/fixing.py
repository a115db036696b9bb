"""Which round an event at a time falls on: leaves, joins and partitions at ``at_s``.

A departure, a join or a cut changes whom every worker mixes with, so all of them must agree on
the round it starts, while a time falls in different rounds on different workers. The first
time a clock reaches an event's time T, the event is *fixed* at a round R >= R(T), where

    R(T) = 1 + the highest round any worker has started so far.

No round >= R(T) has started when it is fixed, and a worker asks for the fixings at the start of
each round, so every worker plays the event at the same round, R. A partition's start and its
end (``end_s``) are fixed separately. An event fixed at a round the run does not have never
fires. Events are fixed in time order (``timed_items``); R is the least round >= R(T) that keeps
three orders (docs/ALGORITHM.md, "Leaves, joins and partitions at a time"):

1. **Each worker's own events.** An event *touches* workers: a leave its worker, a join its
   worker and its named donor (``from_worker``). An event comes at least one round after every
   event fixed before it at an earlier time that touches one of its workers (at the same round
   as one at the same time).
2. **Partitions against everything.** A partition's start or end touches every worker: it
   comes at least one round after every event fixed before it at an earlier time, and every
   event after it at least one round after it (events at one time share a round).
3. **A leave after the joins before it.** A leave comes at least one round after every join
   fixed before it at an earlier time (at the same round as one at the same time).

Events that touch no worker in common may share a round or land in the other order: the world
plays a round's changes as one set (the round's membership, Metropolis-Hastings weights over
its degrees, DiLoCo's ring over its members; ``World.by_round``), so only which memberships
the rounds show matters. Why every run this rule gives is one the scenario allows (``World``
plays the fixings as a scenario by round, and ``Scenario`` checks that again):

- By (1), each worker's leaves and joins come in its drawn order, each in a round of its own,
  and a named donor is alive in the rounds before and of its join, as it is at the join's time.
- By (2), a partition starts and ends with the membership of its times: its groups are alive at
  its start, one cut holds at a time, and during it each worker is in a state it has during
  the cut (what DiLoCo's check of a cut's groups looked at).
- By (3), no round's membership is below the scenario's. Take a round r and the latest time t'
  of a leave fixed at a round <= r: every join before t' is fixed before that leave, so a worker
  alive both just before and just after t' (in the timeline as drawn) is alive in rounds r - 1
  and r: its last join before t' has a round < r, its leaves in rounds <= r are before that
  join. The scenario's own check makes that set non-empty (a worker must remain after each
  time, and a join at t' needs a donor alive before and after it), so no round is empty and
  every join has a default donor alive in the round before and its own (with no leave fixed up
  to r, every initial worker is). Without (3), on two workers: 0 leaves at 1 s and is back at
  2 s, 1 leaves at 3 s; (1) alone lets 1's leave share the round of 0's, leaving nobody.
- Never later than the rule that put every event one round after the one before it at an
  earlier time (R(T) and nothing else at one time): each order above is one that rule kept, so
  by induction over the fixings no event comes later.

An event not of the scenario (a host lost without warning, ``scenario.hostloss``) is fixed by
the same rule (``fixed_unplanned``): it touches its workers as a leave and as a join both (a
host's workers go and may come back), or every worker when they are not given.

Pure rules with an injected clock: the simulator's virtual clock calls ``due`` when it reaches
each ``alarms_s`` time and ``started`` at each round start; the emulator's launcher does the same
on the wall clock, answering each worker's round-start question with every fixing so far.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gasloc_emu.scenario.events import JoinEvent, LeaveEvent, PartitionEvent
from gasloc_emu.scenario.script import Scenario


@dataclass(frozen=True)
class Fixing:
    """Event number ``index`` of the scenario (0-based, in ``Scenario.events``), its ``part``
    (``start``, or ``end`` for a partition's end_s), time ``at_s``, fixed at round ``round``."""

    index: int
    part: str
    at_s: float
    round: int

    def to_json(self) -> dict:
        return {"index": self.index, "part": self.part, "at_s": self.at_s, "round": self.round}

    @classmethod
    def from_json(cls, obj: dict) -> Fixing:
        fixing = cls(int(obj["index"]), str(obj["part"]), float(obj["at_s"]), int(obj["round"]))
        if fixing.part not in ("start", "end") or fixing.index < 0 or fixing.round < 0:
            raise ValueError(f"not a fixing: {obj!r}")
        return fixing


TIMED_KINDS = (LeaveEvent, JoinEvent, PartitionEvent)


def timed_items(scenario: Scenario) -> list[tuple[float, int, str]]:
    """(at_s, index, part) of every leave, join and partition start or end at a time, in time
    order; at one time a partition's end comes before anything that starts."""
    items = []
    for i, ev in enumerate(scenario.events):
        if not isinstance(ev, TIMED_KINDS) or ev.by_round:
            continue
        items.append((ev.at_s, i, "start"))
        if isinstance(ev, PartitionEvent) and ev.end_s is not None:
            items.append((ev.end_s, i, "end"))
    return sorted(items, key=lambda item: (item[0], item[2] != "end", item[1]))


@dataclass(frozen=True)
class Touch:
    """What an event fixed at a time is ordered against (the module docstring's rule):
    ``workers`` it touches (None: every worker, as a partition), whether it is a ``leave``
    (after the joins before it) and a ``join`` (before the leaves after it)."""

    workers: frozenset[int] | None
    leave: bool = False
    join: bool = False


EVERYONE = Touch(None)


def touch_of(ev) -> Touch:
    """What a leave, join or partition (start or end) of a scenario touches."""
    if isinstance(ev, LeaveEvent):
        return Touch(frozenset({ev.worker}), leave=True)
    if isinstance(ev, JoinEvent):
        return Touch(frozenset({ev.worker} | ({ev.from_worker} - {None})), join=True)
    return EVERYONE


class _After:
    """The earliest round an event may take after some events fixed before it, in time order:
    each one's round plus one when it is at an earlier time, its round when at the same."""

    def __init__(self) -> None:
        self.last_s = float("-inf")
        self.at_last = -1    # the highest round of the events at last_s
        self.earlier = -1    # the highest round of the events before last_s

    def bound(self, at_s: float) -> int:
        if at_s > self.last_s:
            return max(self.at_last, self.earlier) + 1
        return max(self.at_last, self.earlier + 1)

    def add(self, at_s: float, round_idx: int) -> None:
        if at_s > self.last_s:
            self.earlier = max(self.earlier, self.at_last)
            self.last_s, self.at_last = at_s, round_idx
        else:
            self.at_last = max(self.at_last, round_idx)


class RoundFixer:
    """Fixes a scenario's timed leaves, joins and partitions at rounds as a clock reaches them
    (the module docstring's rule)."""

    def __init__(self, scenario: Scenario):
        self.items = timed_items(scenario)
        self.touches = {(i, part): touch_of(scenario.events[i]) for _, i, part in self.items}
        self.next = 0
        self.highest_started = -1
        self.last_s = float("-inf")   # the latest time fixed so far
        self._worker: dict[int, _After] = {}   # the events touching each worker
        self._joins = _After()   # joins (and events not of the scenario)
        self._cuts = _After()    # events touching every worker: partitions
        self._all = _After()     # every event

    @property
    def alarms_s(self) -> list[float]:
        """The times not reached yet, in order."""
        return sorted({at_s for at_s, _, _ in self.items[self.next:]})

    @property
    def pending(self) -> bool:
        return self.next < len(self.items)

    def started(self, round_idx: int) -> None:
        """A worker starts ``round_idx`` (after asking for the fixings due then)."""
        self.highest_started = max(self.highest_started, round_idx)

    def close(self) -> None:
        """Fix nothing more: a replay's fixings (a run record's) are all there are."""
        self.next = len(self.items)

    def due(self, now_s: float) -> list[Fixing]:
        """Fix every event with at_s <= now_s not fixed yet; the new fixings, in order."""
        out = []
        while self.next < len(self.items) and self.items[self.next][0] <= now_s:
            at_s, index, part = self.items[self.next]
            out.append(Fixing(index, part, at_s, self._fix(at_s, self.touches[index, part])))
            self.next += 1
        return out

    def round_at(self, at_s: float, touch: Touch = EVERYONE) -> int:
        """The round an event reached at ``at_s`` that touches ``touch`` would be fixed at now
        (the module docstring's rule; by default one touching every worker)."""
        # an event fixed after one at a later time (a host loss decided at the clock's now,
        # before the events due then) counts as at that time, so times never go back
        at_s = max(at_s, self.last_s)
        if touch.workers is None:
            bounds = [self._all.bound(at_s)]
        else:
            bounds = [self._cuts.bound(at_s)] + [self._worker[w].bound(at_s)
                                                  for w in touch.workers if w in self._worker]
            if touch.leave:
                bounds.append(self._joins.bound(at_s))
        return max(self.highest_started + 1, *bounds)

    def fixed_unplanned(self, at_s: float, ranks: Iterable[int] | None = None) -> int:
        """Fix an event that is none of the scenario's (a host lost) at ``at_s``: its round.
        ``ranks``: the workers it concerns, ordered against as a leave and as a join both;
        None: every worker. Later events are fixed after it as after any other."""
        if ranks is None:
            return self._fix(at_s, EVERYONE)
        workers = frozenset(ranks)
        if not workers or any(isinstance(r, bool) or not isinstance(r, int) or r < 0
                              for r in workers):
            raise ValueError(f"an unplanned event of workers {sorted(workers, key=str)!r}: "
                             "expected at least one worker rank >= 0, or None for every worker")
        return self._fix(at_s, Touch(workers, leave=True, join=True))

    def _fix(self, at_s: float, touch: Touch) -> int:
        round_idx = self.round_at(at_s, touch)
        at_s = self.last_s = max(at_s, self.last_s)
        self._all.add(at_s, round_idx)
        if touch.workers is None:
            self._cuts.add(at_s, round_idx)
        else:
            for w in touch.workers:
                self._worker.setdefault(w, _After()).add(at_s, round_idx)
        if touch.join:
            self._joins.add(at_s, round_idx)
        return round_idx
