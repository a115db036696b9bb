"""The numbers a run's record ends with, from the workers' checked final messages (or, for a
run that ended early, their last heartbeats): pure functions of the Supervisor's slots."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gasloc_emu.plan import RunPlan
from gasloc_emu.report.schema import LinkRow, RunSummary
from gasloc_emu.report.summary import drops_summary, final_summary, with_dead_sends
from gasloc_emu.transport.base import DEAD_PEER


def run_summary(plan: RunPlan, slots: Sequence, wall_s: float) -> RunSummary:
    """summary.json's numbers: the losses over the workers there at the end; the bytes over
    every process the run had, those that left before the end included (as ``simulate``
    counts every life of a worker); ``drops`` (by reason and worker) over every process of
    the workers there at the end, as ``simulate`` counts them (one that left as the scenario
    says and came back did without messages in its earlier life too)."""
    alive = [s for s in slots if not s.gone]
    lives = [lifetime_counters(s) for s in slots]
    ends = [c for s, c in zip(slots, lives, strict=True) if not s.gone]
    sent, raw = (sum(sum(c[key].values()) for c in lives)
                 for key in ("bytes_sent", "raw_bytes_sent"))
    out = final_summary(plan, [s.theta for s in alive], [s.final["eval_loss"] for s in alive],
                        plan.corpus.eval_batches(), wall_s, sent,
                        overruns=[s.overruns for s in alive], raw_bytes_sent=raw)
    return out.replace(
        dropped_messages=sum(c["dropped"] for c in ends),
        drops=drops_summary(with_dead_sends(
            plan, {s.rank: c["drop_reasons"] for s, c in zip(alive, ends, strict=True)},
            DEAD_PEER)))


def lifetime_counters(slot) -> dict:
    """One rank's data-plane counters over all its processes: those that left as the scenario
    says (``departed``, each sent as it went), those killed without a word (``killed``: what
    their heartbeats and rows said) and the last one's final counters (none for a worker that
    left for good). Bytes per peer, drops by reason, and their totals, summed."""
    parts = [*slot.departed, *slot.killed] + (
        [slot.final["counters"]] if slot.final is not None else [])
    out: dict = {"bytes_sent": {}, "raw_bytes_sent": {}, "dropped": 0, "drop_reasons": {}}
    for part in parts:
        for key in ("bytes_sent", "raw_bytes_sent", "drop_reasons"):
            for k, v in part[key].items():
                out[key][k] = out[key].get(k, 0) + v
        out["dropped"] += part["dropped"]
    return out


def killed_counters(heartbeat, rows_dead_peer: int) -> dict:
    """What is known of the counters of a process killed without a word (lost with its host,
    or alone by a signal): its last heartbeat's bytes per peer and drops by reason (at most a
    heartbeat period old), with the messages it did without from a dead peer as its rows say
    (``dead_peer``: what ``simulate --replay`` takes, so both count the same). A run that goes
    on after a loss has no lossy codec (``host_loss_refusal``), so its raw bytes are its
    bytes."""
    sent = dict(heartbeat.sent) if heartbeat is not None else {}
    reasons = {k: v for k, v in (heartbeat.drop_reasons if heartbeat is not None else {}).items()
               if k != DEAD_PEER}
    if rows_dead_peer:
        reasons[DEAD_PEER] = rows_dead_peer
    return {"bytes_sent": sent, "raw_bytes_sent": dict(sent), "dropped": sum(reasons.values()),
            "drop_reasons": reasons}


def drops_so_far(plan: RunPlan, slots: Sequence) -> dict:
    """``drops`` of a run that ended early: each worker's last word (its final counters, else
    its last heartbeat)."""
    return drops_summary(with_dead_sends(plan, {
        s.rank: (s.final["counters"] if s.final is not None else s.status)
        .get("drop_reasons", {}) for s in slots}, DEAD_PEER))


def link_bytes(slots: Sequence) -> list[dict]:
    """Bytes moved on every directed link that carried traffic, and what they stood for before
    compression (``raw_bytes``), from the workers' counters (checked when their final message
    arrived: int ranks, int bytes)."""
    rows = []
    for s in slots:
        counters = lifetime_counters(s)
        sent, raw = counters["bytes_sent"], counters["raw_bytes_sent"]
        rows += [LinkRow.moved(s.rank, p, b, raw.get(p, b)).to_json()
                 for p, b in sent.items() if b]
    return sorted(rows, key=lambda r: (r["src"], r["dst"]))


@dataclass
class Goodput:
    """What every directed link delivered while training, from the metrics rows' ``recv_links``
    (each message's bytes and its time from being handed to the transport to arriving):
    goodput = bytes / summed transfer time. Bounded: one entry per directed link."""

    links: dict[tuple[int, int], list] = field(default_factory=dict)  # -> [bytes, msgs, s]

    def note(self, row: dict) -> None:
        for src, use in (row.get("recv_links") or {}).items():
            entry = self.links.setdefault((int(src), row["worker"]), [0, 0, 0.0])
            entry[0] += use["bytes"]
            entry[1] += use["messages"]
            entry[2] += use["transfer_s"]

    def fields(self, src: int, dst: int) -> dict:
        """links.json's training fields of one link (empty when it carried nothing measured)."""
        nbytes, msgs, seconds = self.links.get((src, dst), (0, 0, 0.0))
        if not msgs or seconds <= 0:
            return {}
        return {"training_goodput_mbit": nbytes * 8 / seconds / 1e6,
                "training_messages": msgs, "training_transfer_s": seconds}

    def add_to(self, links: list[dict]) -> list[dict]:
        """Link rows (links.json's, the dashboard's) with each link's training fields beside
        its configured and probed rate."""
        for row in links:
            row.update(self.fields(row["src"], row["dst"]))
        return links
