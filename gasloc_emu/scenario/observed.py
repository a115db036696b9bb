"""What a run's record says about its scenario: membership, the link changes and the rates
observed after each, and the event feed (events.jsonl, the dashboard's lines).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from gasloc_emu.scenario.events import (
    JoinEvent,
    LeaveEvent,
    LinkEvent,
    PartitionEvent,
    PauseEvent,
    SpeedEvent,
    as_record,
)
from gasloc_emu.scenario.links import applied_row
from gasloc_emu.scenario.world import World


def membership_summary(world: World) -> dict:
    """Who left and joined, and who is alive at the end (the run record's summary)."""
    return {"changes": world.left_and_joined(),
            # new workers: absent from the start until their first join
            "new_workers": sorted(world.scenario.newcomers) if world.scenario else [],
            "alive_at_end": sorted(world.alive(world.rounds - 1)),
            "failure_detect_s": world.failure_detect_s} | (
                # the rounds its leaves, joins and partitions at a time landed on: what
                # `simulate --replay` plays again
                {"not_fired": world.not_fired(),
                 "fixings": [f.to_json() for f in world.fixings]}
                if world.fixer is not None else {}) | (
                # {kind: {outcome: count}} of the [faults] section's draws
                {"faults": world.scenario.faults.counts}
                if world.scenario is not None and world.scenario.faults is not None else {}) | (
                # hosts lost without warning, as node 0 decided (``scenario.hostloss``): what
                # `simulate --replay` plays again, with the rows' ``dead_peer``
                {"host_losses": [loss.to_json() for loss in world.losses]}
                if world.losses else {}) | (
                # lost hosts that came back, as node 0 decided: their workers' joins
                {"host_backs": [back.to_json() for back in world.backs]}
                if world.backs else {}) | (
                # the scenario's events that workers lost with their hosts could not play
                {"skipped": world.skipped} if world.skipped else {})


def link_changes(links) -> list[dict]:
    """Every link change a run applies (``world.LinkSchedule``), in order: the round-triggered
    ones (cuts and restores included), then each link of each time-triggered one; with the
    values configured (rate_mbit None: unshaped; 0.0: cut), not yet observed."""
    out = [_change(src, dst, state, round_idx=t)
           for t, changed in sorted(links.changes.items())
           for (src, dst), state in sorted(changed.items())]
    if links.timed is not None:
        out += [_change(*link, links.timed.in_force(*link, ev.at_s), at_s=ev.at_s)
                for ev in links.timed.events for link in ev.links]
    return out


def _change(src: int, dst: int, state: tuple, *, round_idx: int | None = None,
            at_s: float | None = None) -> dict:
    rate_mbit, latency_ms = state
    return {"src": src, "dst": dst, "round": round_idx, "at_s": at_s, "rate_mbit": rate_mbit,
            "latency_ms": latency_ms}


OBSERVE_ROUNDS = 3   # rows read per change: the first can hold a transient (see below)


def observed_link_changes(changes: list[dict], rows: list[dict]) -> list[dict]:
    """``changes`` (``link_changes``), each with the rate its link delivered afterwards.

    ``rows``: {worker, round, recv_links} of metrics rows (``worker.link_row``). A change is
    read in the first ``OBSERVE_ROUNDS`` rows (by round) of its destination that have messages
    from its source sent after it (of a round >= its round, or whose earliest message was sent
    at or after its time) and before the link's next change. Each reading is the bytes over
    their wire time: the summed transfer times less one configured latency per message, so
    that it compares with the configured rate. ``observed_mbit`` is their median: under tc a
    change applied while a message is in flight leaves the next one queued behind its rest
    (measured: 3.8 Mbit/s in the first round after 50 -> 5, then 5.03 and 4.88), and the
    median of three sees through one such round. A cut carries nothing and is not observed;
    without such a row the observation is None.
    """
    by_worker: dict[int, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["round"]):
        by_worker.setdefault(row["worker"], []).append(row)
    out = []
    for i, change in enumerate(changes):
        link = (change["src"], change["dst"])
        after = next((c for c in changes[i + 1:] if (c["src"], c["dst"]) == link), None)
        out.append(change | _observation(change, after, by_worker.get(change["dst"], [])))
    return out


def _observation(change: dict, after: dict | None, rows: list[dict]) -> dict:
    """observed_mbit (the median reading), observed_round (the first row read) and the
    readings of one change, from its destination's rows."""
    readings: list[tuple[int, float | None]] = []
    for row in rows if change["rate_mbit"] != 0.0 else ():   # a cut carries no message
        use = row["recv_links"].get(str(change["src"]))
        if use is None or not _sent_after(change, row["round"], use["sent_s"]):
            continue
        if after is not None and _sent_after(after, row["round"], use["sent_s"]):
            break
        readings.append((row["round"], _observed_mbit(use, change["latency_ms"])))
        if len(readings) == OBSERVE_ROUNDS:
            break
    known = [m for _, m in readings if m is not None]
    return {"observed_mbit": statistics.median(known) if known else None,
            "observed_round": readings[0][0] if readings else None,
            "observed_each_mbit": [m for _, m in readings]}


def _sent_after(change: dict, round_idx: int, sent_s: float) -> bool:
    if change["round"] is not None:
        return round_idx >= change["round"]
    return sent_s >= change["at_s"]


def _observed_mbit(use: dict, latency_ms: float | None) -> float | None:
    """Mbit/s over the wire time; None when the latency accounts for all of the transfer (a
    link too fast to tell apart from its latency)."""
    wire_s = use["transfer_s"] - use["messages"] * (latency_ms or 0.0) / 1e3
    return round(use["bytes"] * 8 / 1e6 / wire_s, 4) if wire_s > 0 else None


def round_records(world: World, t: int) -> list[dict]:
    """The events of round t as events.jsonl objects (``events.as_record``), a join with
    the donor it took, a departure with the peers that spend time noticing it; link and
    partition events as the Timeline fired them (restores included), with the values
    ``applied`` to each directed link for the messages of round t on."""
    out = []
    for ev in world._by_round.get(t, ()):
        if isinstance(ev, (LinkEvent, PartitionEvent)):
            continue   # from the schedule below, as fired
        rec = as_record(ev) | world.fixed_time(ev)
        if isinstance(ev, JoinEvent) and world.plan(ev.worker, t).join_from is not None:
            rec["from_worker"] = world.plan(ev.worker, t).join_from
        if isinstance(ev, LeaveEvent):
            rec["detected_by"] = sorted(r for r in world.alive(t)
                                        if world.plan(r, t).detect_s > 0)
        out.append(rec)
    for skipped in world.skipped:   # what workers lost with their hosts could not play
        if skipped["round"] == t:
            event = {k: v for k, v in skipped.items() if k != "why"}
            out.append({"type": "not_played", "round": t, "event": event,
                        "why": skipped["why"]})
    return out + _link_records(world, t)

def _link_records(world: World, t: int) -> list[dict]:
    if world.links is None:
        return []
    out = []
    for ev in world.links.fired.get(t, ()):
        rec = as_record(ev) | world.fixed_time(ev)
        if rec.get("source") == "restore":   # per-link values (unshaped: null) in applied
            rec |= {"rate_mbit": None, "latency_ms": None, "loss_pct": None}
        links = ev.cut_links() if isinstance(ev, PartitionEvent) else ev.links
        rec["applied"] = [applied_row(link, world.links.changes[t][link]) for link in links]
        if isinstance(ev, PartitionEvent):
            rec["detected_by"] = sorted(r for r in world.alive(t)
                                        if world.plan(r, t).detect_s > 0)
        out.append(rec)
    return out


class EventFeed:
    """Hands each round's scenario events to ``sink`` once, when the first metrics row of that
    round (or a later one) reaches the runner; ``logged_at_s`` is that row's ``time_s``."""

    def __init__(self, world: World, sink: Callable[[dict], None], shaper: str | None = None):
        self.world, self.sink, self.next_round, self.shaper = world, sink, 0, shaper
        self.timed_upto_s = -math.inf   # time-triggered changes up to here are logged
        # speed and pause events at a time, logged with the first row of their worker at or
        # past their time (they apply from its next round)
        self.self_timed = [ev for ev in (world.scenario.time_events if world.scenario else ())
                           if isinstance(ev, (SpeedEvent, PauseEvent))]

    def row(self, row: dict) -> None:
        t = row.get("round")
        if type(t) is not int or row.get("kind") not in (None, "metric"):
            return
        while self.next_round <= min(t, self.world.rounds - 1):
            for rec in round_records(self.world, self.next_round):
                self._log(self._with_timed(rec, self.next_round, row), row)
            self.next_round += 1
        self._timed(row)
        self._self_timed(row)

    def _self_timed(self, row: dict) -> None:
        now_s = self._now_s(row)
        if not self.self_timed or now_s is None:
            return
        due = [ev for ev in self.self_timed if ev.worker == row.get("worker") and
               ev.at_s <= now_s]
        for ev in due:
            self._log(as_record(ev), row)
            self.self_timed.remove(ev)

    def _now_s(self, row: dict) -> float | None:
        now_s = row.get("time_s")
        return now_s if isinstance(now_s, (int, float)) else None

    def _with_timed(self, rec: dict, t: int, row: dict) -> dict:
        """A round's record whose links include some changed by time (a restore brings back
        the value in force then): their ``applied`` values at the row's time."""
        links, now_s = self.world.links, self._now_s(row)
        if "applied" not in rec or links is None or links.timed is None or now_s is None:
            return rec
        return rec | {"applied": [applied_row((a["src"], a["dst"]),
                                              links.at(a["src"], a["dst"], t, now_s))
                                  for a in rec["applied"]]}

    def _timed(self, row: dict) -> None:
        """The time-triggered link changes up to the row's time (the run's clock); links a
        partition holds cut in the row's round are ``held`` (their restore brings the value)."""
        timed = self.world.links.timed if self.world.links is not None else None
        now_s = self._now_s(row)
        if timed is None or now_s is None:
            return
        cut = self.world.links.cut(row["round"])
        for ev in timed.due(self.timed_upto_s, now_s):
            rec = as_record(ev) | {"applied": [a for a in timed.applied(ev)
                                               if (a["src"], a["dst"]) not in cut]}
            held = [list(link) for link in ev.links if link in cut]
            self._log(rec | ({"held": held} if held else {}), row)
        self.timed_upto_s = max(self.timed_upto_s, now_s)

    def _log(self, rec: dict, row: dict) -> None:
        if "applied" in rec and self.shaper is not None:
            rec["applied_by"] = self.shaper
        self.sink(rec | {"logged_at_s": row.get("time_s")})


def event_text(rec: dict) -> str:
    """One line for the dashboard or the log: ``round 3: worker 2 leaves``."""
    what = {"leave": "worker {worker} leaves",
            # the donor is chosen when the join happens; a plan's event has none yet
            "join": "worker {worker} joins" + (" from worker {from_worker}"
                                               if rec.get("from_worker") is not None else ""),
            "speed": "worker {worker} runs at speed {speed:g}",
            "pause": "worker {worker} pauses for {seconds:g} s",
            "link": "links {links} change",
            "partition": "partition {groups}"}.get(rec["type"], rec["type"])
    if rec["type"] == "not_played":   # a scenario event a lost host's worker could not play
        return f"round {rec['round']}: not played: " + event_text(rec["event"]).split(": ", 1)[1] \
            + f" ({rec['why']})"
    when = f"round {rec['round']}" if rec.get("round") is not None else f"{rec['at_s']:g} s"
    if rec.get("round") is not None and rec.get("at_s") is not None:   # fixed at that round
        when += f" (at_s {rec['at_s']:g})"
    return f"{when}: " + what.format(**rec)


def event_feed(world: World | None, rec, progress=None,
               shaper: str | None = None) -> EventFeed | None:
    """The runner's feed: each event into the record's events.jsonl and onto the display;
    ``shaper`` names what applies link changes (recorded with each one as ``applied_by``)."""
    if world is None:
        return None

    def sink(event: dict) -> None:
        rec.event(event)
        if progress is not None:
            progress({"kind": "event", "text": event_text(event)})
    return EventFeed(world, sink, shaper)
