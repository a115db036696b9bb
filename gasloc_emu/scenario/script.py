"""A scenario as a whole: its events checked together (who is alive when, one trigger kind for
leaves and joins, partitions that do not overlap, donors that can give), and the membership
at each round (``Scenario.membership_at``). The file format and the rules are in ``load``.
"""
from __future__ import annotations

import dataclasses
import itertools
from bisect import bisect_right
from dataclasses import dataclass, field

from gasloc_emu.scenario.events import (
    Event,
    JoinEvent,
    LeaveEvent,
    LinkEvent,
    PartitionEvent,
    ScenarioError,
    check_int,
    expand,
    ids_text,
    named_workers,
    when_text,
)


@dataclass(frozen=True)
class Scenario:
    """A validated timeline for ``workers`` workers and ``rounds`` rounds.

    ``events`` are checked at construction (errors name ``source``, each event's 1-based number
    in ``events`` and its type); a ``CompositeEvent`` comes out as the built-in events it
    expands to, and ``worker = k`` link events with their links expanded.
    ``round_events`` and ``time_events`` are the same events sorted by trigger (stable: in
    ``events`` order within a trigger). ``membership_trigger`` is the trigger kind of the leaves
    and joins (None without any).
    """

    events: tuple[Event, ...]
    workers: int
    rounds: int
    source: str = "scenario"
    # ids absent from the start besides the newcomers the events show: those whose join at a
    # time is not fixed at a round yet (``World.fix``)
    absent: frozenset[int] = frozenset()
    # the random faults (``faults.FaultTimeline``) whose played events end ``events``; None
    # without a [faults] section. The run record keeps it (faults.json).
    faults: object = None
    round_events: tuple[Event, ...] = field(init=False)
    time_events: tuple[Event, ...] = field(init=False)
    membership_trigger: str | None = field(init=False)
    members: tuple[tuple[int, frozenset[int]], ...] = field(init=False, repr=False)
    # (at_s, who is alive from then on) when the leaves and joins are at a time
    time_members: tuple[tuple[float, frozenset[int]], ...] = field(init=False, repr=False)
    # ids below ``workers`` whose first leave or join is a join: new workers, absent until then
    newcomers: frozenset[int] = field(init=False)
    # (number in the given events, kind) of each event once composite events are expanded:
    # what the errors name, so that they point at the file's own event
    origins: tuple[tuple[int, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            check_int("workers", self.workers, 1)
            check_int("rounds", self.rounds, 1)
        except ScenarioError as err:
            raise ScenarioError(f"{self.source}: {err}") from None
        self._expand()
        indexed = list(enumerate(self.events, 1))
        for i, ev in indexed:
            _check_rounds(self._where(i, ev), ev, self.rounds)
        kind = _one_trigger_kind(self, indexed, (LeaveEvent, JoinEvent), "leave and join events")
        object.__setattr__(self, "newcomers",
                           _newcomers(self.workers, self.events) | frozenset(self.absent))
        _check_partitions(self, indexed)
        checked, members = _Walk(self, indexed, kind or "round").run()
        events = tuple(checked[i] for i, _ in indexed)
        object.__setattr__(self, "events", events)
        object.__setattr__(self, "round_events", tuple(sorted(
            (e for e in events if e.by_round), key=lambda e: e.trigger)))
        object.__setattr__(self, "time_events", tuple(sorted(
            (e for e in events if not e.by_round), key=lambda e: e.trigger)))
        object.__setattr__(self, "membership_trigger", kind)
        object.__setattr__(self, "members", tuple(members) if kind == "round" else ())
        object.__setattr__(self, "time_members", tuple(members) if kind == "at_s" else ())

    def _expand(self) -> None:
        events, origins = [], []
        for n, ev in enumerate(self.events, 1):
            try:
                parts = expand(ev)
            except ScenarioError as err:
                raise ScenarioError(f"{self.source} event #{n} ({ev.kind}): {err}") from None
            events += parts
            origins += [(n, ev.kind)] * len(parts)
        object.__setattr__(self, "events", tuple(events))
        object.__setattr__(self, "origins", tuple(origins))

    def _where(self, index: int, ev: Event) -> str:
        n, kind = self.origins[index - 1]
        if self._drawn(n):
            return f"{self.source} [faults] ({kind} at {ev.when()}, drawn)"
        return f"{self.source} event #{n} ({kind})"

    def _ref(self, index: int) -> str:
        """``event #N``: the given event that event ``index`` (1-based, expanded) came from;
        one of the [faults] section's, by its kind and time."""
        n, kind = self.origins[index - 1]
        if self._drawn(n):
            return f"the drawn {kind} at {self.events[index - 1].when()}"
        return f"event #{n}"

    def _drawn(self, n: int) -> bool:
        """Whether given event ``n`` (1-based) is one the [faults] section drew: they come
        after the file's own."""
        drawn = len(self.faults.events) if self.faults is not None else 0
        return n > self.origins[-1][0] - drawn if self.origins else False

    def membership_at(self, round_idx: int) -> frozenset[int]:
        """The workers alive at the start of round ``round_idx`` (after that round's leaves and
        joins); time-triggered leaves and joins are not predictable and not counted."""
        k = bisect_right([r for r, _ in self.members], round_idx)
        return self.members[k - 1][1] if k else self.initial

    @property
    def initial(self) -> frozenset[int]:
        """The workers alive at the start: every id below ``workers`` but the newcomers."""
        return frozenset(range(self.workers)) - self.newcomers

    @property
    def total_workers(self) -> int:
        """How many worker ids the run ever has: the initial ones plus new joins."""
        joins = [e.worker + 1 for e in self.events if isinstance(e, JoinEvent)]
        return max([self.workers, *joins])

    @property
    def departures(self) -> frozenset[int]:
        """The workers the scenario declares leaving (at some point)."""
        return frozenset(e.worker for e in self.events if isinstance(e, LeaveEvent))


def _newcomers(workers: int, events) -> frozenset[int]:
    """Ids below ``workers`` whose first leave or join (in trigger order) is a join: they are
    new workers, absent from the start until that join."""
    first: dict[int, Event] = {}
    for ev in sorted((e for e in events if isinstance(e, (LeaveEvent, JoinEvent))),
                     key=lambda e: e.trigger):
        first.setdefault(ev.worker, ev)
    return frozenset(w for w, ev in first.items() if isinstance(ev, JoinEvent) and w < workers)


def _check_rounds(where: str, ev: Event, rounds: int) -> None:
    for name in ("round", "end_round"):
        value = getattr(ev, name, None)
        if value is not None and value >= rounds:
            raise ScenarioError(f"{where}: {name} = {value} is out of range; this run has "
                                f"rounds 0..{rounds - 1}")


def _kind(ev: Event) -> str:
    return "round" if ev.by_round else "at_s"


def _one_trigger_kind(sc: Scenario, indexed: list[tuple[int, Event]], types: tuple,
                      what: str) -> str | None:
    """The one trigger kind of the events of ``types``; an error when they mix both."""
    chosen = [(i, ev) for i, ev in indexed if isinstance(ev, types)]
    for i, ev in chosen[1:]:
        first_i, first = chosen[0]
        if _kind(ev) != _kind(first):
            raise ScenarioError(f"{sc._where(i, ev)}: uses {_kind(ev)} while {sc._ref(first_i)} "
                                f"uses {_kind(first)}; {what} must all use round or all use "
                                "at_s, so that they can be ordered before the run")
    return _kind(chosen[0][1]) if chosen else None


def _span(p: PartitionEvent) -> str:
    end = f"until {when_text(p.by_round, p.end)}" if p.end is not None else "to the end"
    return f"from {p.when()} {end}"


def _check_partitions(sc: Scenario, indexed: list[tuple[int, Event]]) -> None:
    """No two partitions active at once (sorted by start, each must end before the next)."""
    _one_trigger_kind(sc, indexed, (PartitionEvent,), "partitions")
    parts = sorted(((i, e) for i, e in indexed if isinstance(e, PartitionEvent)),
                   key=lambda ie: ie[1].trigger)
    for (j, prev), (i, cur) in itertools.pairwise(parts):
        if prev.end is None or cur.trigger < prev.end:
            raise ScenarioError(f"{sc._where(i, cur)}: {_span(cur)} overlaps the partition of "
                                f"{sc._ref(j)} ({_span(prev)}); only one partition may be "
                                "active at a time")


class _Walk:
    """Who is alive, event by event, in trigger order: the checks that need membership."""

    def __init__(self, sc: Scenario, indexed: list[tuple[int, Event]], kind: str):
        self.sc, self.kind = sc, kind
        self.alive = set(sc.initial)
        if not self.alive:
            raise ScenarioError(f"{sc.source}: every worker's first event is a join, so no "
                                "worker would be alive at the start; at least one must be")
        self.next_id = sc.workers
        self.last: dict[int, tuple[int, Event]] = {}   # worker -> its last leave or join
        self.same = sorted(((i, e) for i, e in indexed if _kind(e) == kind),
                           key=lambda ie: ie[1].trigger)
        self.other = [(i, e) for i, e in indexed if _kind(e) != kind]

    def run(self) -> tuple[dict[int, Event], list[tuple[int, frozenset[int]]]]:
        checked: dict[int, Event] = {}
        members: list[tuple[int, frozenset[int]]] = []
        for trigger, group in itertools.groupby(self.same, key=lambda ie: ie[1].trigger):
            group = list(group)
            changes = [(i, e) for i, e in group if isinstance(e, (LeaveEvent, JoinEvent))]
            before = set(self.alive)
            for i, ev in changes:
                self._change(i, ev)
                checked[i] = ev
            if changes:
                self._check_not_empty(*changes[-1])
                self._check_donors(changes, before & self.alive)
                members.append((trigger, frozenset(self.alive)))
            for i, ev in group:   # joins too: their from_worker must be alive
                if not isinstance(ev, LeaveEvent):
                    checked[i] = self._alive_check(i, ev, self.alive, f"at {ev.when()}")
        ever = set(range(self.next_id))
        for i, ev in self.other:
            checked[i] = self._alive_check(i, ev, ever, None)
        return checked, members

    def _check_not_empty(self, i: int, ev: Event) -> None:
        if not self.alive:
            raise ScenarioError(f"{self.sc._where(i, ev)}: no worker would be alive after "
                                f"{ev.when()}; at least one must remain")

    def _check_donors(self, changes: list[tuple[int, Event]], stay: set[int]) -> None:
        """A joiner starts from the parameters a donor had at the end of the round before,
        sent in the joining round: the donor must be alive in both (not joining, not
        leaving at that trigger)."""
        for i, ev in changes:
            if not isinstance(ev, JoinEvent):
                continue
            if ev.from_worker is not None and ev.from_worker not in stay:
                raise ScenarioError(
                    f"{self.sc._where(i, ev)}: from_worker {ev.from_worker} must be alive both "
                    f"before and at {ev.when()} (such workers: "
                    f"{ids_text(stay) if stay else 'none'})")
            if not stay:
                raise ScenarioError(f"{self.sc._where(i, ev)}: no worker alive both before and "
                                    f"at {ev.when()} to give worker {ev.worker} its parameters")

    def _alive_check(self, i: int, ev: Event, alive: set[int], at: str | None) -> Event:
        where = self.sc._where(i, ev)
        if isinstance(ev, LinkEvent) and ev.worker is not None and ev.worker in alive:
            peers = sorted(alive - {ev.worker})
            ev = dataclasses.replace(ev, links=tuple(sorted(
                [(ev.worker, p) for p in peers] + [(p, ev.worker) for p in peers])))
        for w in sorted(named_workers(ev) - alive):
            if at is None:
                raise ScenarioError(f"{where}: worker {w} is not a worker of this run "
                                    f"(ids {ids_text(alive)})")
            raise ScenarioError(f"{where}: worker {w} is not alive {at} (alive: {ids_text(alive)})")
        return ev

    def _later(self, i: int, ev: Event, cls: type) -> tuple[int, Event] | None:
        """The first event of ``cls`` for the same worker after ``ev`` in trigger order."""
        pos = [k for k, (j, _) in enumerate(self.same) if j == i][0]
        return next(((j, e) for j, e in self.same[pos + 1:]
                     if isinstance(e, cls) and e.worker == ev.worker), None)

    def _change(self, i: int, ev: LeaveEvent | JoinEvent) -> None:
        w, where = ev.worker, self.sc._where(i, ev)
        if w in self.last and self.last[w][1].trigger == ev.trigger:
            j = self.last[w][0]
            raise ScenarioError(f"{where}: worker {w} already changes at {ev.when()} "
                                f"({self.sc._ref(j)}); its leave and join need different "
                                "triggers")
        problem = self._leave(i, ev) if isinstance(ev, LeaveEvent) else self._join(i, ev)
        if problem:
            raise ScenarioError(f"{where}: {problem}")
        self.last[w] = (i, ev)

    def _leave(self, i: int, ev: LeaveEvent) -> str:
        w = ev.worker
        if w in self.alive:
            self.alive.remove(w)
            return ""
        join = self._later(i, ev, JoinEvent)
        if w < self.next_id:
            j, prev = self.last[w]
            then = f"; its join ({self.sc._ref(join[0])}) is only at {join[1].when()}" \
                if join else ""
            return f"worker {w} already left at {prev.when()} ({self.sc._ref(j)}){then}"
        if join:
            return (f"worker {w} leaves at {ev.when()}, before it joins at {join[1].when()} "
                    f"({self.sc._ref(join[0])})")
        return f"worker {w} is not alive at {ev.when()} (alive: {ids_text(self.alive)})"

    def _join(self, i: int, ev: JoinEvent) -> str:
        w = ev.worker
        if w in self.alive:
            leave = self._later(i, ev, LeaveEvent)
            if leave:
                return (f"worker {w} joins at {ev.when()}, before it leaves at "
                        f"{leave[1].when()} ({self.sc._ref(leave[0])})")
            return f"worker {w} is already alive at {ev.when()}"
        if w > self.next_id:
            return (f"worker {w} cannot join at {ev.when()}: a new worker takes the next id, "
                    f"{self.next_id}")
        if w == self.next_id:
            self.next_id += 1
        self.alive.add(w)
        return ""
