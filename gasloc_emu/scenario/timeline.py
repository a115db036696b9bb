"""A scenario played on a clock: `Timeline.due(t)` hands out the events due by t once each, cuts
and restores the links of partitions, and holds link changes that fall inside a cut.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from gasloc_emu.scenario.events import (
    Event,
    LinkEvent,
    LinkValues,
    Pair,
    PartitionEvent,
    as_record,
    check_int,
)
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.trace import LinkTrace


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
        check_int("round_idx", round_idx)
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
