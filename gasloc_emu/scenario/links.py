"""The links' values under a scenario: by round (`LinkSchedule`, the scenario's Timeline played
on a round clock) and by time (`TimedLinks`: link events at `at_s` and a link trace's rows).
"""
from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable

from gasloc_emu.scenario.events import Event, LinkEvent, PartitionEvent
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.timeline import Timeline
from gasloc_emu.scenario.trace import LinkTrace

# the largest rate a link can have (netem.profiles.RATE_RANGE_MBIT): an unshaped link's value on
# the Timeline, whose restores must be valid link events; read back as None (unshaped)
UNSHAPED_MBIT = 100_000.0

Pair = tuple[int, int]

LinkState = tuple[float | None, float]   # (rate_mbit: None unshaped, 0.0 cut; latency_ms)

BaseLink = Callable[[int, int], LinkState]


def unshaped_link(src: int, dst: int) -> LinkState:
    """A link no profile shapes: unlimited rate, no latency."""
    return (None, 0.0)


class LinkSchedule:
    """The round-triggered link and partition events of a scenario, per round.

    The scenario's ``Timeline`` is played once, round by round, on a clock that never moves
    (events at a time are refused), so the values in force, cuts and restores are exactly its
    own. ``base_link(src, dst)`` is a link's (rate_mbit or None, latency_ms) before any event.
    """

    def __init__(self, scenario: Scenario, rounds: int, base_link: BaseLink = unshaped_link,
                 trace: LinkTrace | None = None):
        self._base, self._rounds, self._trace = base_link, rounds, trace
        self.build(scenario)

    @property
    def trace(self) -> LinkTrace | None:
        """The link trace replayed on top of the scenario's link events (None: none)."""
        return self._trace

    def build(self, scenario: Scenario) -> None:
        """Play ``scenario`` (again: a partition at a time was fixed at a round, ``World.fix``;
        the rounds already played come out the same)."""
        rounds, base_link, trace = self._rounds, self._base, self._trace
        timeline = Timeline(scenario, self._timeline_base, lambda: 0.0)
        self.fired: dict[int, list[Event]] = {}
        self.changes: dict[int, dict[Pair, LinkState]] = {}
        self._cuts: list[frozenset] = []
        self._history: dict[Pair, list[tuple[int, LinkState]]] = {}
        self.timed = TimedLinks.of(scenario, trace, base_link)
        for t in range(rounds):
            events = [ev for ev in timeline.due(t)
                      if isinstance(ev, (LinkEvent, PartitionEvent)) and ev.by_round]
            cut = timeline.cut_links()
            self._cuts.append(cut)
            touched = _touched(events)
            if events:
                self.fired[t] = events
            if touched:
                self.changes[t] = {link: self._state(timeline, link, cut) for link in touched}
                for link, state in self.changes[t].items():
                    self._history.setdefault(link, []).append((t, state))

    def _timeline_base(self, src: int, dst: int) -> tuple[float, float, float]:
        rate, latency = self._base(src, dst)
        return (UNSHAPED_MBIT if rate is None else rate, latency, 0.0)

    def _state(self, timeline: Timeline, link: Pair, cut: frozenset) -> LinkState:
        rate, latency, _ = timeline.link_values(*link)
        if link in cut:
            return (0.0, latency)
        unshaped = rate == UNSHAPED_MBIT and self._base(*link)[0] is None
        return (None if unshaped else rate, latency)

    def cut(self, t: int) -> frozenset:
        """The directed links cut in round t."""
        return self._cuts[t] if 0 <= t < len(self._cuts) else frozenset()

    def cut_edges(self, t: int) -> frozenset:
        """The undirected edges (sorted pairs) cut in round t, as the algorithms see them."""
        return frozenset(edge_key(a, b) for a, b in self.cut(t))

    def in_force(self, src: int, dst: int, t: int) -> LinkState:
        """(rate_mbit, latency_ms) of src -> dst for the messages of round t by the
        round-triggered events alone (rate None: unshaped; 0.0: cut)."""
        state = self._base(src, dst)
        for r, values in self._history.get((src, dst), ()):
            if r > t:
                break
            state = values
        return state

    def at(self, src: int, dst: int, t: int, now_s: float) -> LinkState:
        """(rate_mbit, latency_ms) of src -> dst for a message of round t sent ``now_s``
        seconds after the run's start: cut while a partition cuts it in round t, else the
        time-triggered value in force then (``TimedLinks``), else the round's."""
        state = self.in_force(src, dst, t)
        if self.timed is None or (src, dst) in self.cut(t):
            return state
        timed = self.timed.in_force(src, dst, now_s)
        return state if timed is None else timed

    def slowest_mbit(self) -> dict[int, float]:
        """Per sender, the slowest rate any event (by round or by time) gives one of its links
        (cuts and unshaped values aside)."""
        rates = [(src, state[0]) for changed in self.changes.values()
                 for (src, _), state in changed.items()]
        if self.timed is not None:
            rates += [(src, state[0]) for (src, _), steps in self.timed.steps.items()
                      for _, state in steps]
        out: dict[int, float] = {}
        for src, rate in rates:
            if rate:   # None: unshaped; 0.0: cut
                out[src] = min(out.get(src, math.inf), rate)
        return out

    @property
    def delays(self) -> bool:
        """Whether any event (by round or by time) gives a link a latency above zero, which
        the delay mode must then carry though the profile had none
        (``DelayMode.replaces_bridge``)."""
        states = [state for changed in self.changes.values() for state in changed.values()]
        if self.timed is not None:
            states += [state for steps in self.timed.steps.values() for _, state in steps]
        return any(latency for _, latency in states)

    @property
    def changes_links(self) -> bool:
        """Whether any link's rate or latency changes (not only partitions' cuts)."""
        return self.timed is not None or any(
            isinstance(ev, LinkEvent) and ev.source != "restore"   # a partition's end
            for evs in self.fired.values() for ev in evs)


class TimedLinks:
    """The time-triggered link changes: a scenario's link events at ``at_s`` and a link trace's
    rows, as per-link steps (at_s, (rate_mbit, latency_ms)) on the run's clock (seconds since
    its start). A field an event leaves out keeps its value.

    A message takes the values in force when its sender sends it: the simulator's link model
    at the send's virtual time, the userspace shaper when it stamps the message (at the
    sender's clock); under tc the launcher changes the class at that time, so bytes already
    queued on the link feel the change too. A link changed by time may not also be changed by
    round (which came later would depend on the run's speed): that is refused before the run.
    """

    def __init__(self, events: list[LinkEvent], base_link: BaseLink):
        self.events = sorted(events, key=lambda ev: ev.at_s)
        self.steps: dict[Pair, list[tuple[float, LinkState]]] = {}
        for ev in self.events:
            for link in ev.links:
                steps = self.steps.setdefault(link, [])
                rate, latency = steps[-1][1] if steps else base_link(*link)
                steps.append((ev.at_s, (rate if ev.rate_mbit is None else ev.rate_mbit,
                                        latency if ev.latency_ms is None else ev.latency_ms)))

    @classmethod
    def of(cls, scenario: Scenario, trace: LinkTrace | None,
           base_link: BaseLink) -> TimedLinks | None:
        """The time-triggered link changes of a scenario and a trace; None when there are
        none."""
        events = [ev for ev in scenario.time_events if isinstance(ev, LinkEvent)]
        events += trace.changes_between(0.0, math.inf) if trace is not None else []
        return cls(events, base_link) if events else None

    def in_force(self, src: int, dst: int, now_s: float) -> LinkState | None:
        """The link's values at ``now_s``; None before its first time-triggered change."""
        steps = self.steps.get((src, dst), ())
        k = bisect_right(steps, now_s, key=lambda step: step[0])
        return steps[k - 1][1] if k else None

    def due(self, after_s: float, upto_s: float) -> list[LinkEvent]:
        """The changes with after_s < at_s <= upto_s, in time order."""
        return [ev for ev in self.events if after_s < ev.at_s <= upto_s]

    def values(self, src: int, dst: int) -> list[LinkState]:
        """Every value the link takes by time (the receivers' bounds take them all in)."""
        return [state for _, state in self.steps.get((src, dst), ())]

    def applied(self, ev: LinkEvent) -> list[dict]:
        """The values ``ev`` put in force on each of its links (events.jsonl)."""
        return [applied_row(link, self.in_force(*link, ev.at_s)) for link in ev.links]


def _touched(events: list) -> list[Pair]:
    """The links whose values the events of one round set (held ones wait for their restore)."""
    out: dict[Pair, None] = {}
    for ev in events:
        links = ev.cut_links() if isinstance(ev, PartitionEvent) else ev.links
        out.update(dict.fromkeys(links))
    return sorted(out)


def applied_row(link: Pair, state: LinkState) -> dict:
    """One link's values in force, for events.jsonl (rate_mbit null: unshaped; 0: cut)."""
    rate, latency = state
    return {"src": link[0], "dst": link[1], "rate_mbit": rate, "latency_ms": latency}


def edge_key(a: int, b: int) -> Pair:
    return (a, b) if a < b else (b, a)


def base_link(cfg, link_plan) -> Callable[[int, int], LinkState]:
    """(src, dst) -> (rate_mbit or None, latency_ms) of each link before any scenario event:
    the profile's link rate in ``link_plan`` (its caps apart, see ``netplan.link_caps``), or
    unshaped."""
    from netem.shapers import turned_off
    if not cfg.net.bw_profile or turned_off(cfg.net.shaper):
        return unshaped_link
    plan = link_plan

    def base(src: int, dst: int) -> LinkState:
        link = plan.links.get((src, dst))
        return (None, 0.0) if link is None else (link.rate_mbit, link.latency_ms)
    return base
