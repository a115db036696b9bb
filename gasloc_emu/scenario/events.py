"""The events of a scenario (link, partition, speed, pause, leave, join), each validated when
made: exactly one trigger (a round or a time), values in range, errors that name the event.

A scenario file's ``type`` names its class through ``event_type``: a built-in
(``EVENT_TYPES``), a kind an installed package registers under the entry-point group
``gasloc_emu.scenario_events``, or ``package.module:Class``. A kind of one's own is a
``CompositeEvent``: it checks its own fields and ``expand``s into built-in events, which the
scenario then checks and every runner plays as it plays those.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from gasloc_emu import plugins
from gasloc_emu.config import ConfigError
from netem.profiles import LATENCY_RANGE_MS, LOSS_RANGE_PCT, RATE_RANGE_MBIT

LINK_SOURCES = ("scenario", "trace", "restore")   # where a LinkEvent comes from

Pair = tuple[int, int]

LinkValues = tuple[float, float, float]   # (rate_mbit, latency_ms, loss_pct)


class ScenarioError(ConfigError):
    """A scenario or link trace that cannot be used (a ConfigError: the CLI exits 2)."""


def check_int(what: str, value: Any, lo: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{what} = {value!r} is not an integer")
    if value < lo:
        raise ScenarioError(f"{what} = {value} is out of range; expected an integer >= {lo}")
    return value


def check_number(what: str, value: Any, lo: float, hi: float | None = None, *,
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


def check_pair(what: str, value: Any) -> Pair:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ScenarioError(f"{what} = {value!r} is not a [src, dst] pair")
    src, dst = check_int(f"{what} src", value[0]), check_int(f"{what} dst", value[1])
    if src == dst:
        raise ScenarioError(f"{what} = {list(value)}: src and dst are both worker {src}")
    return src, dst


def _pairs(what: str, value: Any) -> tuple[Pair, ...]:
    if not isinstance(value, (list, tuple)):
        raise ScenarioError(f"{what} = {value!r} is not a list of [src, dst] pairs")
    pairs = tuple(check_pair(what, v) for v in value)
    twice = [p for k, p in enumerate(pairs) if p in pairs[:k]]
    if twice:
        raise ScenarioError(f"{what}: link {twice[0][0]}->{twice[0][1]} is listed twice")
    return pairs


def ids_text(ids: Iterable[int]) -> str:
    """Worker ids in short form: ``0-3, 5, 7-8``."""
    out = []
    for _, run in itertools.groupby(enumerate(sorted(ids)), key=lambda kv: kv[1] - kv[0]):
        run = [v for _, v in run]
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(out) or "none"


def when_text(by_round: bool, trigger: float) -> str:
    return f"round {trigger}" if by_round else f"{trigger:g} s"


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
            check_int("round", self.round)
        else:
            self._set("at_s", check_number("at_s", self.at_s, 0.0))
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
        return when_text(self.by_round, self.trigger)

    @classmethod
    def file_keys(cls) -> tuple[str, ...]:
        """The keys an ``[[event]]`` table of this type may have besides ``type`` and its
        trigger: the dataclass's fields."""
        return tuple(f.name for f in dataclasses.fields(cls)
                     if f.init and f.name not in ("round", "at_s"))

    @classmethod
    def required_keys(cls) -> tuple[str, ...]:
        """The keys a table must have: the fields without a default."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.init
                     and f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> _Event:
        """The event of a table whose keys passed ``file_keys`` (``type`` left out)."""
        return cls(**table)


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
            check_int("worker", self.worker)
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
                self._set(name, check_number(name, value, 0.0 if open_lo else lo, hi,
                                        open_lo=open_lo))
        if not self.changes():
            raise ScenarioError("sets nothing; give rate_mbit, latency_ms or loss_pct")

    def changes(self) -> dict[str, float]:
        """The values this event sets, by name (rate_mbit, latency_ms, loss_pct)."""
        names = ("rate_mbit", "latency_ms", "loss_pct")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    @classmethod
    def file_keys(cls) -> tuple[str, ...]:
        return (*_LINK_FORMS, "rate_mbit", "latency_ms", "loss_pct")

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> LinkEvent:
        """One of ``link``, ``links`` or ``worker`` into ``links``/``worker``."""
        forms = [k for k in _LINK_FORMS if k in table]
        if len(forms) != 1:
            got = f"; got {' and '.join(forms)}" if forms else ""
            raise ScenarioError("give exactly one of link = [src, dst], links = [[src, dst], "
                                f"...] or worker = k{got}")
        kwargs = dict(table)
        if "link" in kwargs:
            kwargs["links"] = (check_pair("link", kwargs.pop("link")),)
        elif "links" in kwargs and not kwargs["links"]:
            raise ScenarioError("links = [] names no link")
        return cls(**kwargs)


_LINK_FORMS = ("link", "links", "worker")


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
            self._check_end("end_round", check_int("end_round", self.end_round), "round")
        if self.end_s is not None:
            self._check_end("end_s", check_number("end_s", self.end_s, 0.0), "at_s")
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
    groups = tuple(tuple(check_int("groups worker", w) for w in g) for g in value)
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
        check_int("worker", self.worker)
        self._set("speed", check_number("speed", self.speed, 0.0, 1.0, open_lo=True))


@dataclass(frozen=True, kw_only=True)
class PauseEvent(_Event):
    """A worker stops for ``seconds`` (like SIGSTOP or a GC stall), then resumes."""

    kind: ClassVar[str] = "pause"
    worker: int
    seconds: float

    def _check(self) -> None:
        check_int("worker", self.worker)
        self._set("seconds", check_number("seconds", self.seconds, 0.0, open_lo=True))


@dataclass(frozen=True, kw_only=True)
class LeaveEvent(_Event):
    """A worker crashes: its process is killed, without warning to its peers."""

    kind: ClassVar[str] = "leave"
    worker: int

    def _check(self) -> None:
        check_int("worker", self.worker)


@dataclass(frozen=True, kw_only=True)
class JoinEvent(_Event):
    """A departed worker, or a new one with the next id, enters. It starts from
    ``from_worker``'s parameters; None leaves the choice to the caller (the lowest-ranked
    living neighbour). ``from_checkpoint``: a departed worker starts instead from its own
    last checkpoint (``run.checkpoint_every``): its parameters, optimizers and data position
    as they were then, however stale."""

    kind: ClassVar[str] = "join"
    worker: int
    from_worker: int | None = None
    # in events.jsonl only when set: a join from a donor is recorded as it always was
    from_checkpoint: bool = dataclasses.field(default=False, metadata={"recorded_if_set": True})

    def _check(self) -> None:
        check_int("worker", self.worker)
        if not isinstance(self.from_checkpoint, bool):
            raise ScenarioError(f"from_checkpoint = {self.from_checkpoint!r} must be true or "
                                "false")
        if self.from_checkpoint and self.from_worker is not None:
            raise ScenarioError(f"from_worker = {self.from_worker} and from_checkpoint = true: "
                                "a joiner starts from a donor or from its checkpoint; give one")
        if self.from_worker is not None:
            check_int("from_worker", self.from_worker)
            if self.from_worker == self.worker:
                raise ScenarioError(f"from_worker = {self.from_worker} is the joining worker "
                                    "itself")


Event = LinkEvent | PartitionEvent | SpeedEvent | PauseEvent | LeaveEvent | JoinEvent

EVENT_TYPES: dict[str, type[_Event]] = {cls.kind: cls for cls in (
    LinkEvent, PartitionEvent, SpeedEvent, PauseEvent, LeaveEvent, JoinEvent)}

GROUP = "gasloc_emu.scenario_events"


@dataclass(frozen=True, kw_only=True)
class CompositeEvent(_Event):
    """An event kind of one's own: a frozen, keyword-only dataclass with a ``kind``, its fields
    checked in ``_check`` (raise ``ScenarioError``) and ``expand``: the built-in events it
    stands for. The scenario is checked, recorded and played as those events."""

    def expand(self) -> tuple[Event, ...]:
        raise NotImplementedError


def known_kinds() -> list[str]:
    """The built-in kinds, then the registered ones."""
    return [*EVENT_TYPES, *sorted(set(plugins.registered(GROUP)) - set(EVENT_TYPES))]


def event_type(kind: Any) -> type[_Event]:
    """The class an ``[[event]]`` table's ``type`` means (a ``ScenarioError`` when it means
    none): a built-in, a kind registered under ``gasloc_emu.scenario_events``, or
    ``package.module:Class``, which must be a ``CompositeEvent``."""
    if isinstance(kind, str) and kind in EVENT_TYPES:
        return EVENT_TYPES[kind]
    if not isinstance(kind, str) or not (plugins.is_path(kind)
                                         or kind in plugins.registered(GROUP)):
        raise ScenarioError(f"type = {kind!r} is not an event type; expected one of "
                            f"{', '.join(known_kinds())}, or package.module:Class")
    try:
        cls = plugins.load(kind, GROUP, "type")
    except plugins.PluginError as err:
        raise ScenarioError(str(err)) from None
    if not (isinstance(cls, type) and issubclass(cls, CompositeEvent)
            and dataclasses.is_dataclass(cls)):
        raise ScenarioError(f"type = {kind!r} is {cls!r}, not a dataclass subclassing "
                            "gasloc_emu.scenario.events.CompositeEvent")
    return cls


def expand(ev: _Event) -> tuple[Event, ...]:
    """The built-in events ``ev`` stands for: itself, or what a ``CompositeEvent`` expands to
    (at least one, each a built-in event)."""
    if not isinstance(ev, CompositeEvent):
        return (ev,)
    out = tuple(ev.expand())
    builtin = tuple(EVENT_TYPES.values())
    wrong = [e for e in out if type(e) not in builtin]
    if not out or wrong:
        got = repr(wrong[0]) if wrong else "nothing"
        raise ScenarioError(f"{ev.kind} expands to {got}; it must expand to at least one "
                            f"built-in event ({', '.join(EVENT_TYPES)})")
    return out


def named_workers(ev: Event) -> set[int]:
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
    null), then the type's fields in declaration order (pairs as lists; a field added later
    and marked ``recorded_if_set`` only when it is not its default)."""
    record: dict[str, Any] = {"type": event.kind}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if f.metadata.get("recorded_if_set") and value == f.default:
            continue
        record[f.name] = _jsonable(value)
    return record


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value
