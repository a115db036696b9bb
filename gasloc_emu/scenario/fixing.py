"""Which round an event at a time falls on: leaves, joins and partitions at ``at_s``.

A departure, a join or a cut changes whom every worker mixes with, so all of them must agree on
the round it starts, while a time falls in different rounds on different workers. The first
time a clock reaches a time T, the events at T are *fixed* at one round R >= R(T), where

    R(T) = 1 + the highest round any worker has started so far.

No round >= R(T) has started when they are fixed, and a worker asks for the fixings at the start
of each round, so every worker plays them at the same round, R. A partition's start and its end
(``end_s``) are fixed separately. An event fixed at a round the run does not have never fires.
Times are fixed in order (``timed_items``), each at the least round >= R(T) that keeps (the
rule of docs/ALGORITHM.md, "Leaves, joins and partitions at a time"):

1. **Each worker's own order.** An event *touches* workers: a leave its worker, a join its
   worker and its named donor (``from_worker``). It comes at least one round after every event
   fixed at an earlier time that touches one of its workers.
2. **Partitions against everything.** A partition's start or end touches every worker: it
   comes at least one round after every event fixed at an earlier time, and every later event
   at least one round after it.
3. **Someone to mix with and to give.** With the leaves and joins fixed so far, every round
   from R on keeps a living worker, and each of its joins a worker alive in the round before
   and its own (the donor a joiner without ``from_worker`` takes its parameters from).

Events at different times that touch no worker in common may share a round, or land in the other
order: the world plays a round's changes as one set (its membership, Metropolis-Hastings
weights over its degrees, DiLoCo's ring over its members: ``World.by_round``), so only the
memberships the rounds show matter, and these orders make each a valid one. The world plays
the fixings as a scenario by round, which ``Scenario`` checks again:

- By (1) each worker's leaves and joins come in its drawn order, in rounds of their own, and a
  named donor is alive in the rounds before and of its join, as at the join's time.
- By (2) a partition starts and ends with the memberships of its times: its groups are alive
  at its start, one cut holds at a time, and during it each worker is in a state it has during
  the cut (what DiLoCo's check of a cut's groups looked at).
- (3) is what the scenario's own check holds at each time (a worker remains, a joiner has a
  donor), now for rounds whose changes come from several times. Without it, on two workers: 0
  leaves at 1 s and is back at 2 s, 1 leaves at 3 s; (1) lets 1's leave share 0's round,
  leaving nobody.

(3) counts workers: a worker changes at most once a round (by (1); the scenario refuses two
changes of one worker at one time), so round r keeps ``n(r-1) - leaves(r)`` workers alive in
both rounds and ``n(r) = n(r-1) - leaves(r) + joins(r)``. It is always met at one round past
every fixed leave and join, where the membership before is the timeline's just before T and
after it the timeline's just after (the scenario's check holds them). So no time lands later
than under the rule that put each one round after the time before it (and R(T)): every bound
of (1) and (2) is one that rule kept, and that rule put T past every earlier time's round.

An event that is none of the scenario's (a host lost without warning, ``scenario.hostloss``)
is fixed by (1) and (2) (``fixed_unplanned``): it touches its workers, or every worker when
they are not given. Its change is not counted by (3): nobody checked it against the scenario.

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


# the workers an event touches (the module docstring's rule); None: every worker
Touch = frozenset | None


def touch_of(ev) -> Touch:
    """The workers a leave, join or partition (start or end) of a scenario touches."""
    if isinstance(ev, LeaveEvent):
        return frozenset({ev.worker})
    if isinstance(ev, JoinEvent):
        return frozenset({ev.worker} | ({ev.from_worker} - {None}))
    return None


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
        self.events = {i: scenario.events[i] for _, i, _ in self.items}
        self.next = 0
        self.highest_started = -1
        self.last_s = float("-inf")   # the latest time fixed so far
        self._worker: dict[int, _After] = {}   # the events touching each worker
        self._cuts = _After()    # the events touching every worker (partitions)
        self._all = _After()     # every event
        self._initial = len(scenario.initial)    # workers alive before round 0
        self._changes: dict[int, tuple[int, int]] = {}   # round -> (leaves, joins) fixed there

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
        """Fix every event with at_s <= now_s not fixed yet, those at one time at one round;
        the new fixings, in order."""
        out = []
        while self.next < len(self.items) and self.items[self.next][0] <= now_s:
            at_s = self.items[self.next][0]
            group = []
            while self.next < len(self.items) and self.items[self.next][0] == at_s:
                group.append(self.items[self.next][1:])
                self.next += 1
            events = [self.events[index] for index, _ in group]
            touches = [touch_of(ev) for ev in events]
            touch = None if None in touches else frozenset().union(*touches)
            change = (sum(isinstance(ev, LeaveEvent) for ev in events),
                      sum(isinstance(ev, JoinEvent) for ev in events))
            round_idx = self._fix(at_s, touch, change)
            out += [Fixing(index, part, at_s, round_idx) for index, part in group]
        return out

    def round_at(self, at_s: float, touch: Touch = None, change: tuple[int, int] = (0, 0)) -> int:
        """The round events at ``at_s`` that touch ``touch`` (None: every worker) and make
        ``change`` = (leaves, joins) would be fixed at now (the module docstring's rule)."""
        # an event fixed after one at a later time (a host loss decided at the clock's now,
        # before the events due then) counts as at that time, so times never go back
        at_s = max(at_s, self.last_s)
        if touch is None:
            bounds = [self._all.bound(at_s)]
        else:
            bounds = [self._cuts.bound(at_s)] + [self._worker[w].bound(at_s)
                                                  for w in touch if w in self._worker]
        round_idx = max(self.highest_started + 1, *bounds)
        past = max(self._changes, default=-1) + 1
        while not self._keeps_members(round_idx, change):
            if round_idx >= past:   # the membership no longer changes: never met
                raise ValueError(f"{change[0]} leaves and {change[1]} joins at {at_s:g} s "
                                 "leave no worker alive, or a joiner without a donor")
            round_idx += 1
        return round_idx

    def fixed_unplanned(self, at_s: float, ranks: Iterable[int] | None = None) -> int:
        """Fix an event that is none of the scenario's (a host lost) at ``at_s``: its round.
        ``ranks``: the workers it touches; None: every worker. Later events are fixed after
        it as after any other that touches them."""
        if ranks is None:
            return self._fix(at_s, None, (0, 0))
        workers = frozenset(ranks)
        if not workers or any(isinstance(r, bool) or not isinstance(r, int) or r < 0
                              for r in workers):
            raise ValueError(f"an unplanned event of workers {sorted(workers, key=str)!r}: "
                             "expected at least one worker rank >= 0, or None for every worker")
        return self._fix(at_s, workers, (0, 0))

    def _keeps_members(self, start: int, change: tuple[int, int]) -> bool:
        """Whether ``change`` = (leaves, joins) at round ``start`` keeps, in every round from
        it, a living worker and, where workers join, one alive in the round before too."""
        alive = self._initial + sum(j - n for r, (n, j) in self._changes.items() if r < start)
        for r in sorted({start, *(r for r in self._changes if r > start)}):
            leaves, joins = self._changes.get(r, (0, 0))
            if r == start:
                leaves, joins = leaves + change[0], joins + change[1]
            stay = alive - leaves
            if stay + joins <= 0 or (joins and stay <= 0):
                return False
            alive = stay + joins
        return True

    def _fix(self, at_s: float, touch: Touch, change: tuple[int, int]) -> int:
        round_idx = self.round_at(at_s, touch, change)
        at_s = self.last_s = max(at_s, self.last_s)
        self._all.add(at_s, round_idx)
        if touch is None:
            self._cuts.add(at_s, round_idx)
        else:
            for w in touch:
                self._worker.setdefault(w, _After()).add(at_s, round_idx)
        if change != (0, 0):
            leaves, joins = self._changes.get(round_idx, (0, 0))
            self._changes[round_idx] = (leaves + change[0], joins + change[1])
        return round_idx
