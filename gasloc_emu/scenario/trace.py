"""A measured bandwidth trace (`--link-trace FILE.csv`): rows of (time_s, src, dst, rate_mbit[,
latency_ms]), each directed link keeping a row's values until its next row.
"""
from __future__ import annotations

import csv
import itertools
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gasloc_emu.scenario.events import LinkEvent, Pair, ScenarioError, check_int, check_number
from netem.profiles import LATENCY_RANGE_MS, RATE_RANGE_MBIT

TRACE_COLUMNS = ("time_s", "src", "dst", "rate_mbit")

TRACE_OPTIONAL = "latency_ms"


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
    check_int("workers", workers, 1)
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
        time_s = check_number("time_s", _parse(text["time_s"], float, "time_s"), 0.0)
        src = _trace_worker("src", text["src"], workers)
        dst = _trace_worker("dst", text["dst"], workers)
        if src == dst:
            raise ScenarioError(f"src and dst are both worker {src}")
        rate = check_number("rate_mbit", _parse(text["rate_mbit"], float, "rate_mbit"), 0.0,
                       RATE_RANGE_MBIT[1], open_lo=True)
        latency = None
        if TRACE_OPTIONAL in text:
            latency = check_number("latency_ms", _parse(text[TRACE_OPTIONAL], float, "latency_ms"),
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
