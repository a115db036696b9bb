"""Which round an event at a time falls on: leaves, joins and partitions at ``at_s``.

A departure, a join or a cut changes whom every worker mixes with, so all of them must agree on
the round it starts, while a time falls in different rounds on different workers. The rule
(docs/ALGORITHM.md, "Churn"): the first time a clock reaches an event's time T, the event is
*fixed* at round

    R(T) = 1 + the highest round any worker has started so far,

and at least one round after the event fixed before it at an earlier time (events at one time
share a round; events at different times never do, so their order is the scenario's). No round
>= R(T) has started when it is fixed, and a worker asks for the fixings at the start of each
round, so every worker plays the event at the same round, R(T). A partition's start and its end
(``end_s``) are fixed separately. An event fixed at a round the run does not have never fires.

Pure rules with an injected clock: the simulator's virtual clock calls ``due`` when it reaches
each ``alarms_s`` time and ``started`` at each round start; the emulator's launcher does the same
on the wall clock, answering each worker's round-start question with every fixing so far.
"""
from __future__ import annotations

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


class RoundFixer:
    """Fixes a scenario's timed leaves, joins and partitions at rounds as a clock reaches them
    (the module docstring's rule)."""

    def __init__(self, scenario: Scenario):
        self.items = timed_items(scenario)
        self.next = 0
        self.highest_started = -1
        self.last: Fixing | None = None

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
            out.append(self._fix(at_s, index, part))
            self.next += 1
        return out

    def _fix(self, at_s: float, index: int, part: str) -> Fixing:
        self.last = Fixing(index, part, at_s, self.round_at(at_s))
        return self.last

    def round_at(self, at_s: float) -> int:
        """The round an event reached at ``at_s`` is fixed at (the module docstring's rule);
        a host lost without warning is fixed by it too (``scenario.hostloss``)."""
        round_idx = self.highest_started + 1
        if self.last is not None:
            round_idx = max(round_idx, self.last.round + (at_s > self.last.at_s))
        return round_idx

    def fixed_unplanned(self, at_s: float) -> int:
        """Fix an event that is none of the scenario's (a host lost) at ``at_s``: its round;
        later events are fixed after it as after any other."""
        self.last = Fixing(0, "start", at_s, self.round_at(at_s))
        return self.last.round
