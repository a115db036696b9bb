"""Random faults: a scenario's ``[faults]`` section drawn into a timeline of ordinary events.

Pure rules, no sockets, no clock: ``FaultSpec`` is the section, checked when made;
``draw(spec, workers)`` draws every source's faults over ``[0, horizon_s)``; ``place`` turns
them into the scenario's own events (a crash is a ``leave``, a restart a ``join``, a hang a
``pause``, a slow-down two ``speed`` events, a link flap and a partition a ``partition`` with
an end, a lost host the ``leave`` of each of its workers). The timeline (``FaultTimeline``) is
written to the run record (``faults.json``) before the run starts, and ``simulate --replay``
plays the events written there: it never draws again.

The model (an alternating renewal process per target, the usual one for repairable parts):
from t = 0, the time to the next failure is drawn from the source's distribution, the fault
lasts a drawn duration, and the next time to failure counts from its end.

- Time to failure: exponential with mean ``mtbf_s`` (``t = -mtbf ln(1 - u)``), or Weibull with
  shape k and the same mean: scale ``lambda = mtbf / Gamma(1 + 1/k)``,
  ``t = lambda (-ln(1 - u))^(1/k)`` (the inverse of ``F(t) = 1 - exp(-(t/lambda)^k)``).
- Durations: lognormal with median m and log-sigma s: ``d = m exp(s Phi^-1(u))`` (the median
  of a lognormal is ``exp(mu)``).

Identical timelines on any machine: the uniforms come from our own generator, not from a
library's, whose streams and transforms may change between versions and platforms. Each
uniform is BLAKE2b of ``(seed, stream, counter)``, its top 53 bits as a double in (0, 1)
(``u = (x + 1/2) 2^-53``, never 0 or 1). A stream is one source and one target, so adding a
worker or a source leaves the others' faults as they were. The transforms above are written
out here (``statistics.NormalDist.inv_cdf`` is Wichura's AS241, in the standard library), and
every time and duration is rounded to ``resolution_s``, so that a last-bit difference in a
platform's ``log`` or ``exp`` cannot show.

A drawn fault that cannot happen at its time is kept in the timeline with the reason it was
not played (``Fault.outcome``), never dropped silently: a fault of a worker that is down, a
crash that would leave no worker alive, a cut while another cut holds (a scenario has one
partition at a time), a fault whose worker goes down before it ends.
"""
from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gasloc_emu.scenario.events import (
    EVENT_TYPES,
    Event,
    JoinEvent,
    LeaveEvent,
    Pair,
    PartitionEvent,
    PauseEvent,
    ScenarioError,
    SpeedEvent,
    as_record,
    check_int,
    check_number,
    check_pair,
)

KINDS = ("crash", "hang", "slow", "link_flap", "partition", "host")
DISTRIBUTIONS = ("exponential", "weibull")
RESTARTS = ("peer", "checkpoint")   # FaultSource.restart_from
FAULTS_FILE = "faults.json"
VERSION = 1
PLAYED = "played"
# why a drawn fault was not played (``Fault.outcome``), by code
NOT_PLAYED = {
    "down": "a worker it needs is down at its start or before its end",
    "last_worker": "the crash would leave no worker alive",
    "cut_busy": "another cut holds then (a scenario has one partition at a time)",
    "no_other_side": "no worker alive outside the partition's set",
    "overlap": "another fault of its kind holds the worker then",
}

SHAPE_RANGE = (0.1, 20.0)      # Weibull shapes outside make Gamma(1 + 1/k) over- or underflow
SIGMA_RANGE = (0.0, 5.0)
MAX_FAULTS_PER_STREAM = 10_000  # a bound on each target's draws (mtbf_s tiny against horizon_s)


@dataclass(frozen=True, kw_only=True)
class FaultSource:
    """One ``[[faults.KIND]]`` table: a kind of fault, its targets and its distributions.

    ``kind``: crash (kill -9; with a duration, the worker restarts after it), hang (SIGSTOP
    for the duration), slow (``speed`` for the duration), link_flap (a link down for the
    duration), partition (``workers`` cut from the others for the duration), host (every
    worker of a host lost; with a duration, they restart after it). Targets: ``workers`` for
    crash, hang and slow (empty: every worker), ``links`` for link_flap (empty: every pair),
    ``workers`` (the set cut off) for partition, ``hosts`` for host. ``restart_from``: how a
    crashed worker (or a lost host's) comes back after its duration: ``peer``, from a living
    neighbour's current parameters sent over the shaped link (a join from a donor), or
    ``checkpoint``, from its own last checkpoint (``run.checkpoint_every``; a worker that took
    part in no checkpoint round before it comes back from a peer).
    """

    kind: str
    mtbf_s: float
    distribution: str = "exponential"
    weibull_shape: float = 1.0
    duration_median_s: float | None = None
    duration_sigma: float = 0.5
    workers: tuple[int, ...] = ()
    links: tuple[Pair, ...] = ()
    hosts: tuple[tuple[int, ...], ...] = ()
    speed: float | None = None
    restart_from: str = "peer"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScenarioError(f"kind = {self.kind!r} is not a fault kind; expected one of "
                                f"{', '.join(KINDS)}")
        self._set("mtbf_s", check_number("mtbf_s", self.mtbf_s, 0.0, open_lo=True))
        if self.distribution not in DISTRIBUTIONS:
            raise ScenarioError(f"distribution = {self.distribution!r} is not one of "
                                f"{', '.join(DISTRIBUTIONS)}")
        self._set("weibull_shape", check_number("weibull_shape", self.weibull_shape,
                                                *SHAPE_RANGE))
        if self.distribution == "exponential" and self.weibull_shape != 1.0:
            raise ScenarioError(f"weibull_shape = {self.weibull_shape:g} goes with "
                                "distribution = \"weibull\"")
        self._set("duration_sigma", check_number("duration_sigma", self.duration_sigma,
                                                 *SIGMA_RANGE))
        if self.duration_median_s is not None:
            self._set("duration_median_s", check_number(
                "duration_median_s", self.duration_median_s, 0.0, open_lo=True))
        elif self.kind not in ("crash", "host"):
            raise ScenarioError(f"a {self.kind} fault needs duration_median_s (how long it "
                                "lasts)")
        self._check_targets()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_targets(self) -> None:
        self._set("workers", _ids("workers", self.workers))
        self._set("links", tuple(check_pair("links", p) for p in self.links))
        self._set("hosts", tuple(_ids("hosts", h) for h in self.hosts))
        uses = {"workers": ("crash", "hang", "slow", "partition"), "links": ("link_flap",),
                "hosts": ("host",), "speed": ("slow",)}
        for name, kinds in uses.items():
            value = getattr(self, name)
            if value not in ((), None) and self.kind not in kinds:
                raise ScenarioError(f"{name} does not go with a {self.kind} fault (only with "
                                    f"{', '.join(kinds)})")
        if self.kind == "slow":
            if self.speed is None:
                raise ScenarioError("a slow fault needs speed (the factor, in (0, 1))")
            self._set("speed", check_number("speed", self.speed, 0.0, 1.0, open_lo=True))
        if self.kind == "partition" and not self.workers:
            raise ScenarioError("a partition fault needs workers (the set cut from the others)")
        if self.restart_from not in RESTARTS:
            raise ScenarioError(f"restart_from = {self.restart_from!r} is not allowed; expected "
                                f"one of {', '.join(RESTARTS)}")
        if self.restart_from != "peer" and (self.kind not in ("crash", "host")
                                            or self.duration_median_s is None):
            raise ScenarioError(f"restart_from = {self.restart_from!r} goes with a crash or "
                                "host fault that has a duration (after which it restarts)")
        if self.kind == "host" and not (self.hosts and all(self.hosts)):
            raise ScenarioError("a host fault needs hosts = [[workers of host 0], ...], each "
                                "non-empty")

    def targets(self, workers: int) -> tuple[tuple[int, ...], ...]:
        """Each target as the workers it names: a worker, a link's two ends, a set, a host."""
        if self.kind in ("crash", "hang", "slow"):
            return tuple((w,) for w in (self.workers or range(workers)))
        if self.kind == "link_flap":
            return self.links or tuple(itertools.combinations(range(workers), 2))
        if self.kind == "partition":
            return (self.workers,)
        return self.hosts

    def time_to_failure_s(self, u: float) -> float:
        """The inverse CDF of the time to failure at ``u`` (the module docstring)."""
        if self.distribution == "exponential":
            return -self.mtbf_s * math.log1p(-u)
        k = self.weibull_shape
        scale = self.mtbf_s / math.gamma(1.0 + 1.0 / k)
        return scale * (-math.log1p(-u)) ** (1.0 / k)

    def duration_s(self, u: float) -> float | None:
        """The inverse CDF of the lognormal duration at ``u``; None without a duration."""
        if self.duration_median_s is None:
            return None
        return self.duration_median_s * math.exp(
            self.duration_sigma * statistics.NormalDist().inv_cdf(u))

    def to_json(self) -> dict:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _ids(what: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise ScenarioError(f"{what} = {value!r} is not a list of worker ids")
    ids = tuple(check_int(what, w) for w in value)
    if len(set(ids)) != len(ids):
        raise ScenarioError(f"{what} = {list(ids)} names a worker twice")
    return ids


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    """A scenario's ``[faults]`` section: faults drawn with ``seed`` over ``[0, horizon_s)``,
    times rounded to ``resolution_s``."""

    seed: int
    horizon_s: float
    resolution_s: float = 0.001
    sources: tuple[FaultSource, ...] = ()

    def __post_init__(self) -> None:
        check_int("seed", self.seed)
        object.__setattr__(self, "horizon_s",
                           check_number("horizon_s", self.horizon_s, 0.0, open_lo=True))
        object.__setattr__(self, "resolution_s", check_number(
            "resolution_s", self.resolution_s, 1e-6, 1.0))

    def to_json(self) -> dict:
        return {"seed": self.seed, "horizon_s": self.horizon_s,
                "resolution_s": self.resolution_s,
                "sources": [s.to_json() for s in self.sources]}

    @classmethod
    def from_json(cls, obj: dict) -> FaultSpec:
        return cls(seed=obj["seed"], horizon_s=obj["horizon_s"],
                   resolution_s=obj["resolution_s"],
                   sources=tuple(FaultSource(**s) for s in obj["sources"]))


def spec_from_table(table: Any) -> FaultSpec:
    """The ``[faults]`` table of a scenario file: ``seed``, ``horizon_s``, ``resolution_s`` and
    one array of tables per kind (``[[faults.crash]]``, ...)."""
    if not isinstance(table, dict):
        raise ScenarioError("faults must be a table ([faults] in TOML)")
    settings = {"seed", "horizon_s", "resolution_s"}
    unknown = sorted(set(table) - settings - set(KINDS))
    if unknown:
        raise ScenarioError(f"faults: unknown key {unknown[0]!r}; expected seed, horizon_s, "
                            f"resolution_s or a kind ({', '.join(KINDS)})")
    for key in ("seed", "horizon_s"):
        if key not in table:
            raise ScenarioError(f"faults: missing {key!r}")
    sources = []
    for kind in KINDS:
        tables = table.get(kind, [])
        if not isinstance(tables, list):
            raise ScenarioError(f"faults.{kind} must be a list of tables ([[faults.{kind}]])")
        for n, t in enumerate(tables, 1):
            sources.append(_source(f"faults.{kind} #{n}", kind, t))
    try:
        return FaultSpec(sources=tuple(sources), **{k: table[k] for k in settings if k in table})
    except ScenarioError as err:
        raise ScenarioError(f"faults: {err}") from None


def _source(where: str, kind: str, table: Any) -> FaultSource:
    if not isinstance(table, dict):
        raise ScenarioError(f"{where}: {table!r} is not a table")
    allowed = {f.name for f in dataclasses.fields(FaultSource)} - {"kind"}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown key {unknown[0]!r}; allowed: "
                            f"{', '.join(sorted(allowed))}")
    if "mtbf_s" not in table:
        raise ScenarioError(f"{where}: missing 'mtbf_s'")
    try:
        return FaultSource(kind=kind, **table)
    except ScenarioError as err:
        raise ScenarioError(f"{where}: {err}") from None


# -- drawing


def uniform(seed: int, stream: str, counter: int) -> float:
    """The ``counter``-th uniform of ``stream``, in (0, 1): the module docstring's generator."""
    digest = hashlib.blake2b(f"{seed}/{stream}/{counter}".encode(), digest_size=8).digest()
    return ((int.from_bytes(digest, "big") >> 11) + 0.5) * 2.0 ** -53


@dataclass(frozen=True)
class Fault:
    """One drawn fault: source number ``source`` (0-based, in ``FaultSpec.sources``), its
    ``target`` workers, its start ``at_s`` and ``duration_s`` (None: for good), and
    ``outcome``: ``played``, or why it was not (a key of ``NOT_PLAYED``)."""

    kind: str
    source: int
    target: tuple[int, ...]
    at_s: float
    duration_s: float | None
    outcome: str = PLAYED

    @property
    def end_s(self) -> float:
        """When it ends (both ends on the grid, so their sum is, to 9 decimals)."""
        return math.inf if self.duration_s is None else round(self.at_s + self.duration_s, 9)

    def to_json(self) -> dict:
        return {"kind": self.kind, "source": self.source, "target": list(self.target),
                "at_s": self.at_s, "duration_s": self.duration_s, "outcome": self.outcome}

    @classmethod
    def from_json(cls, obj: dict) -> Fault:
        return cls(str(obj["kind"]), int(obj["source"]), tuple(int(w) for w in obj["target"]),
                   float(obj["at_s"]), None if obj["duration_s"] is None
                   else float(obj["duration_s"]), str(obj["outcome"]))


def _round(value: float, resolution_s: float) -> float:
    """``value`` on the grid of ``resolution_s`` (Python's ``round`` is correctly rounded, so
    the same double on every machine)."""
    return round(round(value / resolution_s) * resolution_s, 9)


def draw(spec: FaultSpec, workers: int) -> list[Fault]:
    """Every source's faults over ``[0, horizon_s)``, for a run of ``workers`` workers, in
    time order (ties: source, then target order)."""
    out = []
    for index, source in enumerate(spec.sources):
        for target in source.targets(workers):
            bad = [w for w in target if w >= workers]
            if bad:
                raise ScenarioError(f"faults.{source.kind}: worker {bad[0]} is not a worker of "
                                    f"this run (ids 0..{workers - 1})")
            out += _renewals(spec, index, source, target)
    return sorted(out, key=lambda f: f.at_s)


def _renewals(spec: FaultSpec, index: int, source: FaultSource,
              target: tuple[int, ...]) -> list[Fault]:
    """One target's faults: time to failure, duration, from its end the next time to
    failure, until ``horizon_s`` (a crash without a duration is the target's last)."""
    stream = f"{source.kind}#{index}/{','.join(map(str, target))}"
    step = spec.resolution_s
    faults, t = [], 0.0
    for n in range(MAX_FAULTS_PER_STREAM):
        at_s = _round(t + source.time_to_failure_s(uniform(spec.seed, stream, 2 * n)), step)
        if at_s >= spec.horizon_s:
            return faults
        d = source.duration_s(uniform(spec.seed, stream, 2 * n + 1))
        duration = None if d is None else max(step, _round(d, step))
        faults.append(Fault(source.kind, index, target, at_s, duration))
        if duration is None:
            return faults
        t = faults[-1].end_s
    raise ScenarioError(f"faults.{source.kind}: more than {MAX_FAULTS_PER_STREAM} faults of "
                        f"one target before horizon_s = {spec.horizon_s:g}; raise mtbf_s "
                        f"(= {source.mtbf_s:g}) or lower horizon_s")


# -- placing: the drawn faults as scenario events


def place(faults: list[Fault], sources: tuple[FaultSource, ...], workers: int,
          fixed: tuple[Event, ...] = ()) -> tuple[list[Fault], list[Event]]:
    """The faults with their outcomes, and the events of those played.

    ``fixed``: the scenario's own events; its leaves and joins at a time change who is alive
    like the drawn crashes, and its partitions hold the one cut a scenario may have at a
    time. Crashes and lost hosts are placed first, in time order (with their restarts); then
    hangs, slow-downs, flaps and partitions where their workers are alive from start to end.
    """
    outcomes: dict[int, str] = {}
    events: list[Event] = []
    alive_spans = _membership(faults, sources, workers, fixed, outcomes, events)
    cuts = [(ev.at_s, ev.end_s if ev.end_s is not None else math.inf)
            for ev in fixed if isinstance(ev, PartitionEvent) and ev.at_s is not None]
    busy: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for i, f in enumerate(faults):
        if f.kind in ("crash", "host"):
            continue
        if any(not _up(alive_spans[w], f) for w in _involved(f, workers, alive_spans)):
            outcomes[i] = "down"
            continue
        if f.kind in ("link_flap", "partition"):
            outcomes[i] = _cut(f, workers, alive_spans, cuts, events)
        else:
            outcomes[i] = _self(f, sources[f.source], busy, events)
    placed = [dataclasses.replace(f, outcome=outcomes.get(i, PLAYED))
              for i, f in enumerate(faults)]
    return placed, sorted(events, key=lambda ev: ev.at_s)


def _involved(f: Fault, workers: int, spans: dict) -> list[int]:
    if f.kind == "partition":   # the set and everyone alive then: both groups
        return [w for w in range(workers) if w in f.target or _alive_at(spans[w], f.at_s)]
    return list(f.target)


def _alive_at(spans: list[tuple[float, float]], t: float) -> bool:
    return any(a <= t < b for a, b in spans)


def _up(spans: list[tuple[float, float]], f: Fault) -> bool:
    """Alive from the fault's start to its end (an open end: to the end of the run)."""
    return any(a <= f.at_s and f.end_s <= b for a, b in spans)


def _membership(faults: list[Fault], sources: tuple[FaultSource, ...], workers: int,
                fixed: tuple[Event, ...],
                outcomes: dict[int, str], events: list[Event]) -> dict[int, list]:
    """Crashes, lost hosts and their restarts in time order, with the scenario's own leaves
    and joins at a time; each worker's spans alive ``[from, to)``."""
    alive = set(range(workers))
    since = {w: 0.0 for w in alive}
    spans: dict[int, list[tuple[float, float]]] = {w: [] for w in range(workers)}
    seq = itertools.count()
    # (time, order, action, payload): fixed changes first, then restarts, then new faults
    queue = [(ev.at_s, 0, next(seq), "fixed", ev) for ev in fixed
             if isinstance(ev, (LeaveEvent, JoinEvent)) and ev.at_s is not None]
    queue += [(f.at_s, 2, next(seq), "fault", i) for i, f in enumerate(faults)
              if f.kind in ("crash", "host")]
    heapq.heapify(queue)
    changed_at: dict[int, float] = {}

    def leave(w: int, t: float) -> None:
        alive.discard(w)
        spans[w].append((since.pop(w), t))
        changed_at[w] = t

    def join(w: int, t: float) -> None:
        alive.add(w)
        since[w] = t
        changed_at[w] = t

    while queue:
        t, _, _, action, payload = heapq.heappop(queue)
        if action == "fixed":   # checked by the scenario itself; here only who is alive
            w = payload.worker
            if w < workers and isinstance(payload, LeaveEvent) and w in alive:
                leave(w, t)
            elif w < workers and isinstance(payload, JoinEvent) and w not in alive:
                join(w, t)
            continue
        if action == "restart":
            gone, from_checkpoint = payload
            for w in gone:
                if w not in alive and changed_at.get(w) != t:
                    join(w, t)
                    events.append(JoinEvent(worker=w, at_s=t, from_checkpoint=from_checkpoint))
            continue
        f = faults[payload]
        gone = [w for w in f.target if w in alive and changed_at.get(w) != t]
        if not gone:
            outcomes[payload] = "down"
            continue
        if len(alive) == len(gone):
            outcomes[payload] = "last_worker"
            continue
        for w in gone:
            leave(w, t)
            events.append(LeaveEvent(worker=w, at_s=t))
        if f.duration_s is not None:
            restart = (tuple(gone), sources[f.source].restart_from == "checkpoint")
            heapq.heappush(queue, (f.end_s, 1, next(seq), "restart", restart))
    for w in alive:
        spans[w].append((since[w], math.inf))
    return spans


def _cut(f: Fault, workers: int, spans: dict, cuts: list, events: list[Event]) -> str:
    if any(a < f.end_s and f.at_s < b for a, b in cuts):
        return "cut_busy"
    if f.kind == "link_flap":
        groups = ((f.target[0],), (f.target[1],))
    else:
        rest = tuple(w for w in range(workers)
                     if w not in f.target and _alive_at(spans[w], f.at_s))
        if not rest:
            return "no_other_side"
        groups = (f.target, rest)
    cuts.append((f.at_s, f.end_s))
    events.append(PartitionEvent(groups=groups, at_s=f.at_s, end_s=f.end_s))
    return PLAYED


def _self(f: Fault, source: FaultSource, busy: dict, events: list[Event]) -> str:
    """A hang or a slow-down: one worker, not overlapping another of its kind."""
    w = f.target[0]
    held = busy.setdefault((f.kind, w), [])
    if any(a < f.end_s and f.at_s < b for a, b in held):
        return "overlap"
    held.append((f.at_s, f.end_s))
    if f.kind == "hang":
        events.append(PauseEvent(worker=w, seconds=f.duration_s, at_s=f.at_s))
    else:
        events.append(SpeedEvent(worker=w, speed=source.speed, at_s=f.at_s))
        events.append(SpeedEvent(worker=w, speed=1.0, at_s=f.end_s))
    return PLAYED


# -- the timeline as a whole, and its record


@dataclass(frozen=True)
class FaultTimeline:
    """The drawn faults (each with its outcome) and the events of those played: what the run
    plays and its record keeps (``faults.json``, ``to_json``)."""

    spec: FaultSpec
    faults: tuple[Fault, ...]
    events: tuple[Event, ...]
    file: ClassVar[str] = FAULTS_FILE

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        """{kind: {outcome: how many}}."""
        out: dict[str, dict[str, int]] = {}
        for f in self.faults:
            by = out.setdefault(f.kind, {})
            by[f.outcome] = by.get(f.outcome, 0) + 1
        return out

    def to_json(self) -> dict:
        return {"version": VERSION, "spec": self.spec.to_json(),
                "faults": [f.to_json() for f in self.faults],
                "events": [as_record(ev) for ev in self.events], "counts": self.counts}

    @classmethod
    def from_json(cls, obj: dict) -> FaultTimeline:
        """A record's timeline; a ScenarioError naming what is wrong with it."""
        if not isinstance(obj, dict) or obj.get("version") != VERSION:
            got = obj.get("version") if isinstance(obj, dict) else obj
            raise ScenarioError(f"{FAULTS_FILE}: version {got!r} is not {VERSION}")
        try:
            return cls(FaultSpec.from_json(obj["spec"]),
                       tuple(Fault.from_json(f) for f in obj["faults"]),
                       tuple(_event_of(e) for e in obj["events"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ScenarioError(f"{FAULTS_FILE}: malformed ({exc!r})") from None


def _event_of(record: dict) -> Event:
    kind = record.get("type")
    if kind not in EVENT_TYPES:
        raise ValueError(f"event type {kind!r}")
    return EVENT_TYPES[kind](**{k: v for k, v in record.items() if k != "type"})


def timeline(spec: FaultSpec, workers: int, fixed: tuple[Event, ...] = ()) -> FaultTimeline:
    """``spec`` drawn for ``workers`` workers and placed around the scenario's ``fixed``
    events."""
    faults, events = place(draw(spec, workers), spec.sources, workers, fixed)
    return FaultTimeline(spec, tuple(faults), tuple(events))


def read_recorded(folder: str | Path) -> FaultTimeline | None:
    """The random faults a run record keeps (``faults.json`` in ``folder``); None without."""
    path = Path(folder) / FAULTS_FILE
    if not path.exists():
        return None
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"{path}: not readable ({exc})") from None
    return FaultTimeline.from_json(obj)
