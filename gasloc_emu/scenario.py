"""Scenario timelines: links, partitions, speeds, pauses, departures and joins, in time.

Pure rules, no torch, no sockets, no threads: ``load_scenario`` reads and validates a scenario
file before the run starts, ``load_link_trace`` a measured bandwidth trace, and a ``Timeline``
hands the caller (a worker loop, the launcher, the simulator) the events that are due, once
each, on an injected clock.

A scenario file (``--scenario FILE.toml``) is one ``[[event]]`` table per event. Each has a
``type`` and exactly one trigger: ``round = R`` (at the start of round R, 0-based, R < the run's
rounds) or ``at_s = T`` (T seconds since the run's start)::

    [[event]]
    type = "link"            # set rate, latency or loss of directed links
    round = 5
    link = [0, 1]            # or links = [[0, 1], [2, 3]], or worker = 2 (all links from and
    rate_mbit = 5.0          # to worker 2); any of rate_mbit, latency_ms, loss_pct

    [[event]]
    type = "partition"       # cut every link between two groups
    at_s = 30.0
    groups = [[0, 1, 2], [3, 4, 5]]
    end_s = 90.0             # optional (end_round with a round trigger): the links come back

    [[event]]
    type = "speed"           # a worker's compute speed, in (0, 1]
    round = 3
    worker = 1
    speed = 0.25

    [[event]]
    type = "pause"           # a worker stops for some seconds, then resumes
    at_s = 12.5
    worker = 4
    seconds = 3.0

    [[event]]
    type = "leave"           # a worker crashes, without warning to its peers
    round = 4
    worker = 2

    [[event]]
    type = "join"            # a departed worker, or a new one with the next id (6 here)
    round = 8
    worker = 2
    from_worker = 1          # optional: the neighbour whose parameters it starts from

A link trace (``--link-trace FILE.csv``) replays measured bandwidth: the header is
``time_s,src,dst,rate_mbit`` or ``time_s,src,dst,rate_mbit,latency_ms``, one row per change of
one directed link (a link keeps a row's values until its next row).

Rules the validation enforces (every error is one line naming the file, the event's number and
type, and what is wrong):

- Workers alive at a point are 0..workers-1 at the start, minus those that left, plus joins. A
  join takes a departed worker's id or the next new id (workers, workers+1, ...). Every leave
  and join of a scenario uses the same kind of trigger (all rounds or all seconds), so that who
  is alive is known at every point of that kind; events of the other kind can only be checked
  against every id the run ever has.
- A leave or join at round R takes effect at the start of round R: a worker leaving at round 4
  takes part in rounds 0..3, one joining at round 8 takes part from round 8 (initialised from
  ``from_worker``'s parameters as they were at the end of round 7). Other events at the same
  round see the membership after that round's leaves and joins.
- Partitions all use the same kind of trigger, and no two are active at once (a partition is
  active from its trigger until its end, or to the end of the run without one). When one ends,
  the Timeline restores its links to the values they had before the cut; a link change that
  falls inside the cut is held and reaches those links with the restore (``LinkEvent.held``).
- ``membership_at(round)`` is exact for round-triggered leaves and joins; time-triggered ones
  depend on how fast the run goes, so it cannot predict them (it returns the initial workers):
  the runners fix each at a round as the run goes (``fixing.RoundFixer``) and play the scenario
  with them at those rounds (``world.by_round``). ``time_members`` is the membership in time
  order, for the checks that need it before the run.
"""
from __future__ import annotations

import csv
import dataclasses
import heapq
import itertools
import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from netem.profiles import LATENCY_RANGE_MS, LOSS_RANGE_PCT, RATE_RANGE_MBIT

from .config import ConfigError, load_toml

LINK_SOURCES = ("scenario", "trace", "restore")   # where a LinkEvent comes from
TRACE_COLUMNS = ("time_s", "src", "dst", "rate_mbit")
TRACE_OPTIONAL = "latency_ms"

Pair = tuple[int, int]
LinkValues = tuple[float, float, float]   # (rate_mbit, latency_ms, loss_pct)


class ScenarioError(ConfigError):
    """A scenario or link trace that cannot be used (a ConfigError: the CLI exits 2)."""


# ---------------------------------------------------------------- value checks

def _int(what: str, value: Any, lo: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{what} = {value!r} is not an integer")
    if value < lo:
        raise ScenarioError(f"{what} = {value} is out of range; expected an integer >= {lo}")
    return value


def _number(what: str, value: Any, lo: float, hi: float | None = None, *,
            open_lo: bool = False) -> float:
    """``value`` as a finite float in [lo, hi] (or (lo, hi]; no upper bound when hi is None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(f"{what} = {value!r} is not a number")
    v = float(value)
    below = v <= lo if open_lo else v < lo
    if math.isfinite(v) and not below and (hi is None or v <= hi):
        return v
    if hi is None:
        expected = f"a finite value {'>' if open_lo else '>='} {lo:g}"
    else:
        expected = f"a value in {'(' if open_lo else '['}{lo:g}, {hi:g}]"
    raise ScenarioError(f"{what} = {value!r} is out of range; expected {expected}")


def _pair(what: str, value: Any) -> Pair:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ScenarioError(f"{what} = {value!r} is not a [src, dst] pair")
    src, dst = _int(f"{what} src", value[0]), _int(f"{what} dst", value[1])
    if src == dst:
        raise ScenarioError(f"{what} = {list(value)}: src and dst are both worker {src}")
    return src, dst


def _pairs(what: str, value: Any) -> tuple[Pair, ...]:
    if not isinstance(value, (list, tuple)):
        raise ScenarioError(f"{what} = {value!r} is not a list of [src, dst] pairs")
    pairs = tuple(_pair(what, v) for v in value)
    twice = [p for k, p in enumerate(pairs) if p in pairs[:k]]
    if twice:
        raise ScenarioError(f"{what}: link {twice[0][0]}->{twice[0][1]} is listed twice")
    return pairs


def _ids(ids: Iterable[int]) -> str:
    """Worker ids in short form: ``0-3, 5, 7-8``."""
    out = []
    for _, run in itertools.groupby(enumerate(sorted(ids)), key=lambda kv: kv[1] - kv[0]):
        run = [v for _, v in run]
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(out) or "none"


def _when(by_round: bool, trigger: float) -> str:
    return f"round {trigger}" if by_round else f"{trigger:g} s"


# ---------------------------------------------------------------- events

@dataclass(frozen=True, kw_only=True)
class _Event:
    """What every event has: exactly one trigger, ``round`` or ``at_s``."""

    kind: ClassVar[str] = ""
    round: int | None = None
    at_s: float | None = None

    def __post_init__(self) -> None:
        if self.round is None and self.at_s is None:
            raise ScenarioError("has no trigger; give round = R (at the start of round R) or "
                                "at_s = T (seconds since the start)")
        if self.round is not None and self.at_s is not None:
            raise ScenarioError(f"has two triggers (round = {self.round!r}, at_s = "
                                f"{self.at_s!r}); give exactly one")
        if self.round is not None:
            _int("round", self.round)
        else:
            self._set("at_s", _number("at_s", self.at_s, 0.0))
        self._check()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check(self) -> None:
        """Each event type's own checks."""

    @property
    def by_round(self) -> bool:
        return self.round is not None

    @property
    def trigger(self) -> float:
        """The round or the second at which the event fires."""
        return self.round if self.round is not None else self.at_s

    def when(self) -> str:
        """``round 4`` or ``30 s``."""
        return _when(self.by_round, self.trigger)


@dataclass(frozen=True, kw_only=True)
class LinkEvent(_Event):
    """Set rate, latency or loss of directed links (the fields left None stay as they are).

    ``worker = k`` names all links from and to k; a scenario expands it into ``links`` over the
    workers alive when it fires (over every id of the run when its trigger is not the kind
    the leaves and joins use, so that who is alive then is not known). ``held`` are links
    whose change waits for the end of the partition that cut them (set by the Timeline);
    ``source`` says where the change comes from: the scenario, the link trace, or the restore
    at a partition's end.
    """

    kind: ClassVar[str] = "link"
    links: tuple[Pair, ...] = ()
    worker: int | None = None
    rate_mbit: float | None = None
    latency_ms: float | None = None
    loss_pct: float | None = None
    held: tuple[Pair, ...] = ()
    source: str = "scenario"

    def _check(self) -> None:
        self._set("links", _pairs("links", self.links))
        self._set("held", _pairs("held", self.held))
        if self.worker is not None:
            _int("worker", self.worker)
            stray = [p for p in self.links + self.held if self.worker not in p]
            if stray:
                raise ScenarioError(f"link {stray[0][0]}->{stray[0][1]} is not a link of "
                                    f"worker {self.worker}")
        elif not (self.links or self.held):
            raise ScenarioError("names no link; give link = [src, dst], links = [[src, dst], "
                                "...] or worker = k")
        if self.source not in LINK_SOURCES:
            raise ScenarioError(f"source = {self.source!r} is not one of {LINK_SOURCES}")
        self._check_values()

    def _check_values(self) -> None:
        checks = {"rate_mbit": (RATE_RANGE_MBIT, True), "latency_ms": (LATENCY_RANGE_MS, False),
                  "loss_pct": (LOSS_RANGE_PCT, False)}
        for name, ((lo, hi), open_lo) in checks.items():
            value = getattr(self, name)
            if value is not None:
                self._set(name, _number(name, value, 0.0 if open_lo else lo, hi,
                                        open_lo=open_lo))
        if not self.changes():
            raise ScenarioError("sets nothing; give rate_mbit, latency_ms or loss_pct")

    def changes(self) -> dict[str, float]:
        """The values this event sets, by name (rate_mbit, latency_ms, loss_pct)."""
        names = ("rate_mbit", "latency_ms", "loss_pct")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


@dataclass(frozen=True, kw_only=True)
class PartitionEvent(_Event):
    """Cut every link between two disjoint groups of workers, both directions; with an end
    (``end_round`` or ``end_s``, the same kind as the trigger) the links come back."""

    kind: ClassVar[str] = "partition"
    groups: tuple[tuple[int, ...], tuple[int, ...]]
    end_round: int | None = None
    end_s: float | None = None

    def _check(self) -> None:
        self._set("groups", _groups(self.groups))
        if self.end_round is not None and self.end_s is not None:
            raise ScenarioError("has both end_round and end_s; give at most one")
        if self.end_round is not None:
            self._check_end("end_round", _int("end_round", self.end_round), "round")
        if self.end_s is not None:
            self._check_end("end_s", _number("end_s", self.end_s, 0.0), "at_s")
            self._set("end_s", float(self.end_s))

    def _check_end(self, name: str, end: float, trigger: str) -> None:
        if getattr(self, trigger) is None:
            other = "end_s" if name == "end_round" else "end_round"
            article = "an" if trigger == "at_s" else "a"
            raise ScenarioError(f"{name} goes with {article} {trigger} trigger; this partition has "
                                f"{'at_s' if trigger == 'round' else 'round'}, so use {other}")
        if end <= self.trigger:
            raise ScenarioError(f"{name} = {end:g} is not after {trigger} = {self.trigger:g}")

    @property
    def end(self) -> float | None:
        """When the cut links come back (same kind as the trigger); None: never."""
        return self.end_round if self.end_round is not None else self.end_s

    def cut_links(self) -> tuple[Pair, ...]:
        """Every directed link between the two groups, sorted."""
        a, b = self.groups
        return tuple(sorted([(i, j) for i in a for j in b] + [(j, i) for i in a for j in b]))


def _groups(value: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if not isinstance(value, (list, tuple)) or len(value) != 2 \
            or not all(isinstance(g, (list, tuple)) and g for g in value):
        raise ScenarioError(f"groups = {value!r} is not two non-empty lists of workers")
    groups = tuple(tuple(_int("groups worker", w) for w in g) for g in value)
    flat = groups[0] + groups[1]
    twice = sorted({w for w in flat if flat.count(w) > 1})
    if twice:
        raise ScenarioError(f"groups = {[list(g) for g in groups]}: worker {twice[0]} is "
                            "named twice; the groups must be disjoint")
    return groups  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class SpeedEvent(_Event):
    """A worker's compute speed from now on, in (0, 1] (1 = full speed)."""

    kind: ClassVar[str] = "speed"
    worker: int
    speed: float

    def _check(self) -> None:
        _int("worker", self.worker)
        self._set("speed", _number("speed", self.speed, 0.0, 1.0, open_lo=True))


@dataclass(frozen=True, kw_only=True)
class PauseEvent(_Event):
    """A worker stops for ``seconds`` (like SIGSTOP or a GC stall), then resumes."""

    kind: ClassVar[str] = "pause"
    worker: int
    seconds: float

    def _check(self) -> None:
        _int("worker", self.worker)
        self._set("seconds", _number("seconds", self.seconds, 0.0, open_lo=True))


@dataclass(frozen=True, kw_only=True)
class LeaveEvent(_Event):
    """A worker crashes: its process is killed, without warning to its peers."""

    kind: ClassVar[str] = "leave"
    worker: int

    def _check(self) -> None:
        _int("worker", self.worker)


@dataclass(frozen=True, kw_only=True)
class JoinEvent(_Event):
    """A departed worker, or a new one with the next id, enters. It starts from
    ``from_worker``'s parameters; None leaves the choice to the caller (the lowest-ranked
    living neighbour)."""

    kind: ClassVar[str] = "join"
    worker: int
    from_worker: int | None = None

    def _check(self) -> None:
        _int("worker", self.worker)
        if self.from_worker is not None:
            _int("from_worker", self.from_worker)
            if self.from_worker == self.worker:
                raise ScenarioError(f"from_worker = {self.from_worker} is the joining worker "
                                    "itself")


Event = LinkEvent | PartitionEvent | SpeedEvent | PauseEvent | LeaveEvent | JoinEvent
EVENT_TYPES: dict[str, type] = {cls.kind: cls for cls in (
    LinkEvent, PartitionEvent, SpeedEvent, PauseEvent, LeaveEvent, JoinEvent)}


def _named_workers(ev: Event) -> set[int]:
    """The workers an event needs alive (leave and join are checked as membership changes)."""
    if isinstance(ev, LinkEvent):
        return {w for p in ev.links for w in p} | ({ev.worker} - {None})
    if isinstance(ev, PartitionEvent):
        return set(ev.groups[0] + ev.groups[1])
    if isinstance(ev, JoinEvent):
        return {ev.from_worker} - {None}
    if isinstance(ev, LeaveEvent):
        return set()
    return {ev.worker}


def as_record(event: Event) -> dict[str, Any]:
    """The event as a JSON object for events.jsonl: ``type``, ``round``, ``at_s`` (one of them
    null), then the type's fields in declaration order (pairs as lists)."""
    record: dict[str, Any] = {"type": event.kind}
    for f in dataclasses.fields(event):
        record[f.name] = _jsonable(getattr(event, f.name))
    return record


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


# ---------------------------------------------------------------- the scenario

@dataclass(frozen=True)
class Scenario:
    """A validated timeline for ``workers`` workers and ``rounds`` rounds.

    ``events`` are checked at construction (errors name ``source``, each event's 1-based number
    in ``events`` and its type); ``worker = k`` link events come out with their links expanded.
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
    round_events: tuple[Event, ...] = field(init=False)
    time_events: tuple[Event, ...] = field(init=False)
    membership_trigger: str | None = field(init=False)
    members: tuple[tuple[int, frozenset[int]], ...] = field(init=False, repr=False)
    # (at_s, who is alive from then on) when the leaves and joins are at a time
    time_members: tuple[tuple[float, frozenset[int]], ...] = field(init=False, repr=False)
    # ids below ``workers`` whose first leave or join is a join: new workers, absent until then
    newcomers: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        try:
            _int("workers", self.workers, 1)
            _int("rounds", self.rounds, 1)
        except ScenarioError as err:
            raise ScenarioError(f"{self.source}: {err}") from None
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

    def _where(self, index: int, ev: Event) -> str:
        return f"{self.source} event #{index} ({ev.kind})"

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
            raise ScenarioError(f"{sc._where(i, ev)}: uses {_kind(ev)} while event #{first_i} "
                                f"uses {_kind(first)}; {what} must all use round or all use "
                                "at_s, so that they can be ordered before the run")
    return _kind(chosen[0][1]) if chosen else None


def _span(p: PartitionEvent) -> str:
    end = f"until {_when(p.by_round, p.end)}" if p.end is not None else "to the end"
    return f"from {p.when()} {end}"


def _check_partitions(sc: Scenario, indexed: list[tuple[int, Event]]) -> None:
    """No two partitions active at once (sorted by start, each must end before the next)."""
    _one_trigger_kind(sc, indexed, (PartitionEvent,), "partitions")
    parts = sorted(((i, e) for i, e in indexed if isinstance(e, PartitionEvent)),
                   key=lambda ie: ie[1].trigger)
    for (j, prev), (i, cur) in itertools.pairwise(parts):
        if prev.end is None or cur.trigger < prev.end:
            raise ScenarioError(f"{sc._where(i, cur)}: {_span(cur)} overlaps the partition of "
                                f"event #{j} ({_span(prev)}); only one partition may be "
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
                    f"before and at {ev.when()} (such workers: {_ids(stay) if stay else 'none'})")
            if not stay:
                raise ScenarioError(f"{self.sc._where(i, ev)}: no worker alive both before and "
                                    f"at {ev.when()} to give worker {ev.worker} its parameters")

    def _alive_check(self, i: int, ev: Event, alive: set[int], at: str | None) -> Event:
        where = self.sc._where(i, ev)
        if isinstance(ev, LinkEvent) and ev.worker is not None and ev.worker in alive:
            peers = sorted(alive - {ev.worker})
            ev = dataclasses.replace(ev, links=tuple(sorted(
                [(ev.worker, p) for p in peers] + [(p, ev.worker) for p in peers])))
        for w in sorted(_named_workers(ev) - alive):
            if at is None:
                raise ScenarioError(f"{where}: worker {w} is not a worker of this run "
                                    f"(ids {_ids(alive)})")
            raise ScenarioError(f"{where}: worker {w} is not alive {at} (alive: {_ids(alive)})")
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
                                f"(event #{j}); its leave and join need different triggers")
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
            then = f"; its join (event #{join[0]}) is only at {join[1].when()}" if join else ""
            return f"worker {w} already left at {prev.when()} (event #{j}){then}"
        if join:
            return (f"worker {w} leaves at {ev.when()}, before it joins at {join[1].when()} "
                    f"(event #{join[0]})")
        return f"worker {w} is not alive at {ev.when()} (alive: {_ids(self.alive)})"

    def _join(self, i: int, ev: JoinEvent) -> str:
        w = ev.worker
        if w in self.alive:
            leave = self._later(i, ev, LeaveEvent)
            if leave:
                return (f"worker {w} joins at {ev.when()}, before it leaves at "
                        f"{leave[1].when()} (event #{leave[0]})")
            return f"worker {w} is already alive at {ev.when()}"
        if w > self.next_id:
            return (f"worker {w} cannot join at {ev.when()}: a new worker takes the next id, "
                    f"{self.next_id}")
        if w == self.next_id:
            self.next_id += 1
        self.alive.add(w)
        return ""


# ---------------------------------------------------------------- reading a scenario file

_KEYS = {"link": ("link", "links", "worker", "rate_mbit", "latency_ms", "loss_pct"),
         "partition": ("groups", "end_round", "end_s"),
         "speed": ("worker", "speed"),
         "pause": ("worker", "seconds"),
         "leave": ("worker",),
         "join": ("worker", "from_worker")}
_REQUIRED = {"link": (), "partition": ("groups",), "speed": ("worker", "speed"),
             "pause": ("worker", "seconds"), "leave": ("worker",), "join": ("worker",)}
_LINK_FORMS = ("link", "links", "worker")


def load_scenario(path: str | Path, workers: int, rounds: int) -> Scenario:
    """The scenario file at ``path`` for a run of ``workers`` workers and ``rounds`` rounds,
    every event validated (see the module docstring)."""
    p = Path(path)
    source = f"scenario {p.name}"
    tables = _event_tables(source, _read_toml(p))
    events = []
    for k, table in enumerate(tables, 1):
        kind = table.get("type") if isinstance(table, dict) else None
        known = isinstance(kind, str) and kind in EVENT_TYPES
        where = f"{source} event #{k}" + (f" ({kind})" if known else "")
        try:
            events.append(_event_from_table(table))
        except ScenarioError as err:
            raise ScenarioError(f"{where}: {err}") from None
    return Scenario(tuple(events), workers, rounds, source)


def _read_toml(p: Path) -> dict:
    return load_toml(p, "scenario file", ScenarioError)


def _event_tables(source: str, data: dict) -> list:
    unknown = sorted(set(data) - {"event"})
    if unknown:
        raise ScenarioError(f"{source}: unknown top-level key {unknown[0]!r}; a scenario has "
                            "only [[event]] tables")
    tables = data.get("event", [])
    if not isinstance(tables, list):
        raise ScenarioError(f"{source}: event must be a list of tables ([[event]] in TOML)")
    return tables


def _event_from_table(table: Any) -> Event:
    if not isinstance(table, dict):
        raise ScenarioError(f"{table!r} is not a table")
    types = ", ".join(EVENT_TYPES)
    if "type" not in table:
        raise ScenarioError(f"missing 'type'; expected one of {types}")
    kind = table["type"]
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        raise ScenarioError(f"type = {kind!r} is not an event type; expected one of {types}")
    allowed = {"type", "round", "at_s", *_KEYS[kind]}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ScenarioError(f"unknown key {unknown[0]!r}; allowed for {kind}: "
                            f"{', '.join(sorted(allowed))}")
    missing = [k for k in _REQUIRED[kind] if k not in table]
    if missing:
        raise ScenarioError(f"missing {missing[0]!r}")
    kwargs = {k: v for k, v in table.items() if k != "type"}
    if kind == "link":
        kwargs = _link_kwargs(kwargs)
    return EVENT_TYPES[kind](**kwargs)


def _link_kwargs(kwargs: dict) -> dict:
    """One of ``link``, ``links`` or ``worker`` into LinkEvent's ``links``/``worker``."""
    forms = [k for k in _LINK_FORMS if k in kwargs]
    if len(forms) != 1:
        got = f"; got {' and '.join(forms)}" if forms else ""
        raise ScenarioError("give exactly one of link = [src, dst], links = [[src, dst], ...] "
                            f"or worker = k{got}")
    if "link" in kwargs:
        kwargs["links"] = (_pair("link", kwargs.pop("link")),)
    elif "links" in kwargs and not kwargs["links"]:
        raise ScenarioError("links = [] names no link")
    return kwargs


# ---------------------------------------------------------------- link traces

class TracePoint(NamedTuple):
    """One row of a link trace: from ``time_s`` on, the link runs at these values."""

    time_s: float
    rate_mbit: float
    latency_ms: float | None = None


@dataclass(frozen=True)
class LinkTrace:
    """Measured bandwidth over time: per directed link, its rows sorted by time."""

    points: Mapping[Pair, tuple[TracePoint, ...]]
    source: str = "link trace"

    def __post_init__(self) -> None:
        for (src, dst), pts in self.points.items():
            times = [p.time_s for p in pts]
            if any(b <= a for a, b in itertools.pairwise(times)):
                raise ScenarioError(f"{self.source}: link {src}->{dst} has rows out of order "
                                    "or twice at one time")

    def _point_at(self, src: int, dst: int, t_s: float) -> TracePoint | None:
        pts = self.points.get((src, dst), ())
        k = bisect_right(pts, t_s, key=lambda p: p.time_s)
        return pts[k - 1] if k else None

    def rate_at(self, src: int, dst: int, t_s: float) -> float | None:
        """The link's rate at ``t_s`` (piecewise constant); None before its first row."""
        point = self._point_at(src, dst, t_s)
        return point.rate_mbit if point else None

    def latency_at(self, src: int, dst: int, t_s: float) -> float | None:
        """The link's latency at ``t_s``; None before its first row or without the column."""
        point = self._point_at(src, dst, t_s)
        return point.latency_ms if point else None

    def changes_between(self, t0_s: float, t1_s: float) -> list[LinkEvent]:
        """The rows with t0_s <= time_s < t1_s as LinkEvents, by time then link."""
        rows = [(p.time_s, key, p) for key, pts in self.points.items() for p in pts
                if t0_s <= p.time_s < t1_s]
        return [LinkEvent(links=(key,), rate_mbit=p.rate_mbit, latency_ms=p.latency_ms,
                          at_s=t, source="trace") for t, key, p in sorted(rows)]


def load_link_trace(path: str | Path, workers: int) -> LinkTrace:
    """The CSV trace at ``path`` (header ``time_s,src,dst,rate_mbit[,latency_ms]``) for worker
    ids 0..workers-1 (pass ``Scenario.total_workers`` when a scenario adds workers)."""
    _int("workers", workers, 1)
    p = Path(path)
    source = f"link trace {p.name}"
    rows = _read_csv(p)
    if not rows:
        raise ScenarioError(f"{source} is empty; expected the header {','.join(TRACE_COLUMNS)}")
    columns = _trace_columns(f"{source} line {rows[0][0]}", rows[0][1])
    points: dict[Pair, list[TracePoint]] = {}
    seen: dict[tuple[Pair, float], int] = {}
    for line, row in rows[1:]:
        where = f"{source} line {line}"
        key, point = _trace_row(where, row, columns, workers)
        if (key, point.time_s) in seen:
            raise ScenarioError(f"{where}: link {key[0]}->{key[1]} already has a row at "
                                f"time_s = {point.time_s:g} (line {seen[key, point.time_s]})")
        seen[key, point.time_s] = line
        points.setdefault(key, []).append(point)
    return LinkTrace({k: tuple(sorted(v)) for k, v in sorted(points.items())}, source)


def _read_csv(p: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every non-blank row."""
    if not p.is_file():
        raise ScenarioError(f"link trace file {str(p)!r} does not exist")
    try:
        with p.open(newline="") as f:
            reader = csv.reader(f)
            return [(reader.line_num, row) for row in reader if any(c.strip() for c in row)]
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ScenarioError(f"link trace file {str(p)!r} cannot be read: {exc}") from None


def _trace_columns(where: str, header: list[str]) -> tuple[str, ...]:
    names = tuple(c.strip() for c in header)
    if names not in (TRACE_COLUMNS, (*TRACE_COLUMNS, TRACE_OPTIONAL)):
        raise ScenarioError(f"{where}: header {','.join(names)!r} is not "
                            f"{','.join(TRACE_COLUMNS)}[,{TRACE_OPTIONAL}]")
    return names


def _trace_row(where: str, row: list[str], columns: tuple[str, ...],
               workers: int) -> tuple[Pair, TracePoint]:
    if len(row) != len(columns):
        raise ScenarioError(f"{where}: expected {len(columns)} fields ({','.join(columns)}), "
                            f"got {len(row)}")
    text = dict(zip(columns, (c.strip() for c in row), strict=True))
    try:
        time_s = _number("time_s", _parse(text["time_s"], float, "time_s"), 0.0)
        src = _trace_worker("src", text["src"], workers)
        dst = _trace_worker("dst", text["dst"], workers)
        if src == dst:
            raise ScenarioError(f"src and dst are both worker {src}")
        rate = _number("rate_mbit", _parse(text["rate_mbit"], float, "rate_mbit"), 0.0,
                       RATE_RANGE_MBIT[1], open_lo=True)
        latency = None
        if TRACE_OPTIONAL in text:
            latency = _number("latency_ms", _parse(text[TRACE_OPTIONAL], float, "latency_ms"),
                              *LATENCY_RANGE_MS)
    except ScenarioError as err:
        raise ScenarioError(f"{where}: {err}") from None
    return (src, dst), TracePoint(time_s, rate, latency)


def _parse(text: str, typ: type, what: str) -> Any:
    try:
        return typ(text)
    except ValueError:
        kind = "an integer" if typ is int else "a number"
        raise ScenarioError(f"{what} = {text!r} is not {kind}") from None


def _trace_worker(what: str, text: str, workers: int) -> int:
    w = _parse(text, int, what)
    if not 0 <= w < workers:
        raise ScenarioError(f"{what} = {w} is out of range; this run has workers "
                            f"0..{workers - 1}")
    return w


# ---------------------------------------------------------------- the timeline

class _Restore(NamedTuple):
    """The end of a partition: its links come back."""

    trigger: float
    by_round: bool
    links: tuple[Pair, ...]


class _Queue:
    """One kind of trigger (rounds or seconds): sorted events, a cursor, pending restores."""

    def __init__(self, events: Sequence[Event]):
        self.events, self.next = list(events), 0
        self.restores: list[tuple[float, int, _Restore]] = []
        self._seq = itertools.count()

    def add_restore(self, restore: _Restore) -> None:
        heapq.heappush(self.restores, (restore.trigger, next(self._seq), restore))

    def pop(self, limit: float) -> Event | _Restore | None:
        """The next item due at ``limit``; a restore before an event at the same trigger."""
        event = self.events[self.next] if self.next < len(self.events) else None
        restore = self.restores[0][2] if self.restores else None
        if restore and restore.trigger <= limit and (
                event is None or restore.trigger <= event.trigger):
            return heapq.heappop(self.restores)[2]
        if event is not None and event.trigger <= limit:
            self.next += 1
            return event
        return None

    def pending(self) -> int:
        return len(self.events) - self.next + len(self.restores)


class Timeline:
    """A scenario (and optionally a link trace) played against a clock.

    ``base_link(src, dst)`` gives a link's (rate_mbit, latency_ms, loss_pct) before any event;
    ``clock()`` the seconds since the run's start. ``due(round_idx)`` returns, once each, the
    round-triggered events of rounds <= round_idx, then the time-triggered ones (scenario and
    trace) whose time has come, each list in trigger order. A partition cuts its links when it
    is returned; its end comes back as LinkEvents (``source = "restore"``) that set the links
    to their values at that point (the base, changed by every link event so far), before any
    event of the same trigger. A link change that falls on a cut link is returned with that
    link moved from ``links`` to ``held``: apply ``links`` only.
    """

    def __init__(self, scenario: Scenario, base_link: Callable[[int, int], LinkValues],
                 clock: Callable[[], float], trace: LinkTrace | None = None):
        self.scenario, self._base_link, self._clock = scenario, base_link, clock
        self._rounds = _Queue(scenario.round_events)
        changes = trace.changes_between(0.0, math.inf) if trace else []
        self._times = _Queue(sorted([*scenario.time_events, *changes], key=lambda e: e.trigger))
        self._values: dict[Pair, LinkValues] = {}
        self._cut: set[Pair] = set()

    as_record = staticmethod(as_record)

    def due(self, round_idx: int) -> list[Event]:
        """The events due at the start of round ``round_idx`` (see the class docstring)."""
        _int("round_idx", round_idx)
        out = self._drain(self._rounds, round_idx)
        return out + self._drain(self._times, self._clock())

    def membership_at(self, round_idx: int) -> frozenset[int]:
        """The workers alive at the start of ``round_idx`` (round-triggered changes only)."""
        return self.scenario.membership_at(round_idx)

    def pending(self) -> int:
        """Events (and partition ends) not returned yet."""
        return self._rounds.pending() + self._times.pending()

    def cut_links(self) -> frozenset[Pair]:
        """The links a partition holds cut now."""
        return frozenset(self._cut)

    def link_values(self, src: int, dst: int) -> LinkValues:
        """A link's (rate_mbit, latency_ms, loss_pct) as the events so far set it (a cut link:
        the values it comes back with)."""
        return self._value((src, dst))

    def _drain(self, queue: _Queue, limit: float) -> list[Event]:
        out: list[Event] = []
        while (item := queue.pop(limit)) is not None:
            out.extend(self._fire(queue, item))
        return out

    def _fire(self, queue: _Queue, item: Event | _Restore) -> list[Event]:
        if isinstance(item, _Restore):
            return self._restore(item)
        if isinstance(item, PartitionEvent):
            links = item.cut_links()
            for link in links:
                self._value(link)   # the values to restore, read before the cut
            self._cut.update(links)
            if item.end is not None:
                queue.add_restore(_Restore(item.end, item.by_round, links))
        if isinstance(item, LinkEvent):
            return [self._apply(item)]
        return [item]

    def _value(self, link: Pair) -> LinkValues:
        if link not in self._values:
            rate, latency, loss = self._base_link(*link)
            self._values[link] = (float(rate), float(latency), float(loss))
        return self._values[link]

    def _apply(self, ev: LinkEvent) -> LinkEvent:
        change = ev.changes()
        for link in ev.links:
            rate, latency, loss = self._value(link)
            self._values[link] = (change.get("rate_mbit", rate),
                                  change.get("latency_ms", latency),
                                  change.get("loss_pct", loss))
        held = tuple(link for link in ev.links if link in self._cut)
        if not held:
            return ev
        free = tuple(link for link in ev.links if link not in self._cut)
        return dataclasses.replace(ev, links=free, held=ev.held + held)

    def _restore(self, restore: _Restore) -> list[Event]:
        """LinkEvents that set the partition's links back, one per set of equal values."""
        self._cut.difference_update(restore.links)
        by_value: dict[LinkValues, list[Pair]] = {}
        for link in restore.links:
            by_value.setdefault(self._value(link), []).append(link)
        trigger = {"round": restore.trigger} if restore.by_round else {"at_s": restore.trigger}
        return [LinkEvent(links=tuple(links), rate_mbit=rate, latency_ms=latency,
                          loss_pct=loss, source="restore", **trigger)
                for (rate, latency, loss), links in by_value.items()]
