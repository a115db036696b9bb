"""Scenario files: links, partitions, speeds, pauses, departures and joins, in time.

Pure rules, no torch, no sockets, no threads: ``load_scenario`` reads and validates a scenario
file before the run starts (``trace.load_link_trace`` a measured bandwidth trace), and a
``timeline.Timeline`` hands the caller (a worker loop, the launcher, the simulator) the events
that are due, once each, on an injected clock.

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

A ``[faults]`` section draws faults from distributions (crashes, hangs, slow-downs, link
flaps, partitions, lost hosts) into more events of these types, all at a time, after the
file's own (``faults.spec_from_table``; the format and a worked example in docs/NETWORK.md,
"Random faults")::

    [faults]
    seed = 7
    horizon_s = 60.0

    [[faults.crash]]
    mtbf_s = 30.0
    distribution = "weibull"   # or "exponential" (the default)
    weibull_shape = 1.5
    duration_median_s = 5.0    # optional: the worker restarts after this long

A ``type`` may also name a kind an installed package registers under the entry-point group
``gasloc_emu.scenario_events``, or ``package.module:Class`` (``events.event_type``; how to
write one: docs/EXTENDING.md); its keys are its class's fields.

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

from pathlib import Path
from typing import Any

from gasloc_emu.config import load_toml
from gasloc_emu.scenario.events import Event, ScenarioError, event_type, expand, known_kinds
from gasloc_emu.scenario.faults import FaultTimeline, spec_from_table, timeline
from gasloc_emu.scenario.script import Scenario


def load_scenario(path: str | Path, workers: int, rounds: int,
                  recorded: FaultTimeline | None = None) -> Scenario:
    """The scenario file at ``path`` for a run of ``workers`` workers and ``rounds`` rounds,
    every event validated (see the module docstring). ``recorded``: a run record's random
    faults (faults.json), played instead of drawing the file's ``[faults]`` section."""
    p = Path(path)
    source = f"scenario {p.name}"
    data = _read_toml(p)
    tables = _event_tables(source, data)
    events = []
    for k, table in enumerate(tables, 1):
        kind = table.get("type") if isinstance(table, dict) else None
        known = isinstance(kind, str) and kind in known_kinds()
        where = f"{source} event #{k}" + (f" ({kind})" if known else "")
        try:
            events.append(_event_from_table(table))
        except ScenarioError as err:
            raise ScenarioError(f"{where}: {err}") from None
    drawn = recorded
    if drawn is None and "faults" in data:
        drawn = _draw(source, data["faults"], workers, tuple(events))
    if drawn is None:
        return Scenario(tuple(events), workers, rounds, source)
    return Scenario((*events, *drawn.events), workers, rounds, source, faults=drawn)


def _draw(source: str, table: Any, workers: int, own: tuple[Event, ...]) -> FaultTimeline:
    """The ``[faults]`` section drawn, around the file's own events."""
    try:
        spec = spec_from_table(table)
        return timeline(spec, workers, tuple(e for ev in own for e in expand(ev)))
    except ScenarioError as err:
        raise ScenarioError(f"{source}: {err}") from None


def _read_toml(p: Path) -> dict:
    return load_toml(p, "scenario file", ScenarioError)


def _event_tables(source: str, data: dict) -> list:
    unknown = sorted(set(data) - {"event", "faults"})
    if unknown:
        raise ScenarioError(f"{source}: unknown top-level key {unknown[0]!r}; a scenario has "
                            "only [[event]] tables and a [faults] section")
    tables = data.get("event", [])
    if not isinstance(tables, list):
        raise ScenarioError(f"{source}: event must be a list of tables ([[event]] in TOML)")
    return tables


def _event_from_table(table: Any) -> Event:
    if not isinstance(table, dict):
        raise ScenarioError(f"{table!r} is not a table")
    if "type" not in table:
        raise ScenarioError(f"missing 'type'; expected one of {', '.join(known_kinds())}")
    kind = table["type"]
    cls = event_type(kind)
    allowed = {"type", "round", "at_s", *cls.file_keys()}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ScenarioError(f"unknown key {unknown[0]!r}; allowed for {kind}: "
                            f"{', '.join(sorted(allowed))}")
    missing = [k for k in cls.required_keys() if k not in table]
    if missing:
        raise ScenarioError(f"missing {missing[0]!r}")
    return cls.from_table({k: v for k, v in table.items() if k != "type"})
