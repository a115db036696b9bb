"""What each control message does to a running job: the launcher's ROUTER and heartbeat traffic,
checked (``inbound``) and acted on, against the Supervisor's workers, scenario and record.

Control messages are parsed into ``transport.control``'s typed messages; anything else is
dropped and counted by reason in ``control_drops``, never raised out of the serve loop. The one
exception is a worker's own final message the launcher cannot use: that worker sends nothing
more, so the run fails (RunFailed, named) instead of waiting for it forever.
"""
from __future__ import annotations

import time

from gasloc_emu.emulator.errors import RunDiverged, RunFailed
from gasloc_emu.emulator.inbound import (
    checked_heartbeat,
    envelope_refusal,
    pair_answers,
    status_row,
)
from gasloc_emu.emulator.processes import WorkerSlot, worker_identity
from gasloc_emu.report.schema import MetricRow
from gasloc_emu.transport import control


class ControlDesk:
    """Acts on the messages of one Supervisor's workers (``sup``: its slots, clock, scenario,
    pairer, record and progress display)."""

    def __init__(self, sup):
        self.sup = sup
        self.control_drops: dict[str, int] = {}  # by reason: summary.json's control_drops

    def drop(self, reason: str) -> None:
        self.control_drops[reason] = self.control_drops.get(reason, 0) + 1
        if self.sup.progress is not None:
            self.sup.progress({"kind": "control_drops", "drops": dict(self.control_drops)})

    def on_heartbeat(self, msg: dict, sender: str = "") -> None:
        """A heartbeat from the PULL socket; ``sender``: the user id its connection was
        authenticated as (``auth.peer_user`` of the frame), "" where the caller has none."""
        hb = checked_heartbeat(msg, sender, self.sup.expect)
        if isinstance(hb, str):
            return self.drop(hb)
        slot = self.sup._slot(hb.worker)  # a checked rank has one once every worker spawned
        if slot is None:
            return self.drop("early")
        slot.last_seen, slot.status, slot.heartbeat = time.monotonic(), msg, hb
        self.sup.link_meter.update(slot.rank, hb.sent, hb.arrived)
        if self.sup.progress is not None:
            self.sup.progress(status_row(hb, self.sup._label(slot)))

    def on_control(self, frames) -> None:
        """A message on the ROUTER: its identity frame names the sending worker's socket, and
        the body's User-Id who authenticated that connection (none on unauthenticated ones)."""
        slot = next((s for s in self.sup.slots if frames[0].bytes == worker_identity(s.rank)), None)
        refusal = envelope_refusal(frames, slot.rank if slot is not None else None)
        if refusal is not None:
            return self.drop(refusal)
        try:
            msg = control.decode(frames[1].bytes, self.sup.expect)
            handler = self._CONTROL_HANDLERS.get(type(msg))
            if handler is None:
                return self.drop("channel")  # heartbeats belong on the PULL socket
            if msg.worker != slot.rank:
                return self.drop("spoofed")
            slot.last_seen = time.monotonic()
            handler(self, slot, msg, frames[2:])
        except control.ControlError as exc:
            self.drop(exc.reason)
            if exc.reason.startswith("final."):  # its sender will send no other: fail, not hang
                raise RunFailed(f"worker {slot.rank} sent final parameters the launcher "
                                f"cannot use ({exc})") from None

    def _on_ready(self, slot: WorkerSlot, msg: control.Ready, extra) -> None:
        slot.ready = {"addr": msg.addr, "device": msg.device}
        if self.sup.t0:  # a departed worker's new process: the run is under way, it joins it
            self.sup._tell_start(slot.rank)

    def _on_metric(self, slot: WorkerSlot, msg: control.Metric, extra) -> None:
        row = MetricRow.of(msg.row)   # checked field by field by ``control``
        slot.round = row.round
        slot.overruns += row.overruns or 0
        slot.rows_dead_peer += len(row.dead_peer or ())
        self.sup.scenario.change_links(row.round + 1)
        self.sup.scenario.keep_link_row(row)
        self.sup.goodput.note(row)
        if self.sup.lanes is not None:
            self.sup.lanes.add(row)
        if self.sup.feed is not None:
            self.sup.feed.row(row)
        self.sup.rec.metric(row)
        self.sup.checkpointed(row)
        if self.sup.progress is not None:
            self.sup.progress(row)

    def _on_round(self, slot: WorkerSlot, msg: control.RoundStart, extra) -> None:
        dropped = self.sup.scenario.on_round(slot.rank, msg.round, msg.waiting, self.sup.slots)
        if dropped is not None:
            self.drop(dropped)

    def _on_final(self, slot: WorkerSlot, msg: control.Final, extra) -> None:
        if len(extra) != 1:
            raise control.ControlError("final.frame", f"{len(extra)} parameter frames, not 1")
        slot.theta = control.frame_tensor(extra[0], msg.dtype, msg.numel)
        slot.final = {"eval_loss": msg.eval_loss, "counters": msg.counters}

    def _on_departed(self, slot: WorkerSlot, msg: control.Departed, extra) -> None:
        slot.departed.append(msg.counters)

    def _on_error(self, slot: WorkerSlot, msg: control.Error, extra) -> None:
        text = f"worker {slot.rank} failed {self.sup._when(slot)}: {msg.error}"
        if msg.diverged_at is not None:
            raise RunDiverged(text, msg.diverged_at)
        raise RunFailed(text)

    def _on_avail(self, slot: WorkerSlot, msg: control.Avail, extra) -> None:
        answers = pair_answers(self.sup.pairer, msg)
        if isinstance(answers, str):
            return self.drop(answers)
        for rank, answer in answers:
            self.sup._tell(rank, answer)

    # the allow-list of what the ROUTER acts on: a message's class picks its handler
    _CONTROL_HANDLERS = {control.Ready: _on_ready, control.Metric: _on_metric,
                         control.Final: _on_final, control.Departed: _on_departed,
                         control.Error: _on_error,
                         control.Avail: _on_avail, control.RoundStart: _on_round}

