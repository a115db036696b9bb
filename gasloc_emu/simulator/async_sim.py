"""The simulator of asynchronous pairwise gossip (``algo.name = a2cid2``): one thread, one event
queue in virtual time, the same ``Worker`` and ``A2CiD2`` objects as the emulator.

Each worker has two lanes that run side by side and meet at the end of each slot
(``a2cid2.Slots`` of ``algo.rate_com``), as in the authors' code and in ``run``:
- gradient: a step's backward pass on x as it is when the step starts, its update (the ODE,
  AdamW on x and x~) when its time is up (``compute.step_time_s`` / speed of virtual time when
  set, else the pass's measured time);
- communication: ready for an exchange (``pairing.Pairer``); paired, both send x at once and
  each mixes what it received when the slower direction has arrived (the link model's wire time
  plus latency; no time without a link model; where TCP sees the latency,
  ``netplan.TcpLinkModel`` times each direction as its connection would from the exchange's
  start: slow start, the restart after an idle pause, loss), the ODE taken up to then.
A worker is in at most one exchange, so a link carries one message at a time and nothing
queues. Events are handled in order of virtual time, so with nominal step times a run is
deterministic. Events at the same time (equal nominal step times make many) are taken in a
random order drawn from the run's seed: taken by worker id, a ring of equal workers would pair
0-1, 2-3, ... every time and never mix across those pairs. Real processes have no such ties:
``sim.jitter`` lengthens each step and transfer by a seeded share, as a host does (``Jitter``).
``run.rounds`` is the number of gradient steps per worker; a metrics row is written per step,
a slot's exchanges on its last.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gasloc_emu.config import Config
from gasloc_emu.report.lanes import LaneTally
from gasloc_emu.report.records import RunRecord
from gasloc_emu.report.schema import MetricRow, RunSummary
from gasloc_emu.report.summary import final_summary
from gasloc_emu.training.async_worker import (
    SlotLog,
    StepLog,
    begin_step,
    end_step,
    slot_rows,
    time_units,
)
from gasloc_emu.training.worker import RoundStats, Worker
from gasloc_emu.transport.base import TransportBase, TransportError


class PostTransport(TransportBase):
    """A worker's transport in the one-thread simulator: messages wait in a shared dict; a
    ``recv`` of a message not yet sent is a bug of the event order, not a wait."""

    def __init__(self, rank: int, world_size: int, boxes: dict, now):
        super().__init__(rank, world_size)
        self.boxes, self.now = boxes, now

    def _send(self, peer: int, round_idx: int, kind: str, tensor: torch.Tensor) -> None:
        self.boxes[(peer, self.rank, round_idx, kind)] = tensor

    def _recv(self, peer: int, round_idx: int, kind: str) -> torch.Tensor:
        key = (self.rank, peer, round_idx, kind)
        if key not in self.boxes:
            raise TransportError(f"worker {self.rank}: exchange {round_idx} with {peer} has no "
                                 "message (event order)")
        return self.boxes.pop(key)

    def clock(self) -> float:
        return self.now()


class Jitter:
    """``sim.jitter``: a modelled time lengthened by a seeded share of up to ``share``. Real
    steps and transfers never take exactly their nominal time; with exact times, workers whose
    steps and transfers are alike all end together, and the seeded order of those ties pairs
    them afresh every slot, where real processes keep finding the partner they finished with
    (docs/ALGORITHM.md). ``share`` 0 draws nothing: the event order is the exact one."""

    def __init__(self, share: float, seed: int):
        self.share, self.rng = share, np.random.default_rng([seed, 0x717E4])

    def of(self, t_s: float) -> float:
        if self.share == 0.0 or t_s == 0.0:
            return t_s
        return t_s * (1.0 + self.share * float(self.rng.random()))


@dataclass
class Lanes:
    """One worker's current slot: its gradient lane's step in flight and steps left, its
    communication lane's requests left, and what the slot's rows will say."""

    slot: int = -1
    steps_left: int = 0
    requests_left: int = 0
    log: SlotLog = field(default_factory=SlotLog)
    before: dict = field(default_factory=dict)
    step: tuple | None = None      # (loss, compute seconds, start) of the step in flight
    asked_s: float = 0.0           # when the current request was made
    started_s: float = 0.0         # when the current exchange began


class AsyncSim:
    """The event loop over every worker's lanes."""

    def __init__(self, cfg: Config, workers: list[Worker], link_model, emit):
        fresh = getattr(link_model, "fresh", None)   # a stateful model: new connections
        self.link_model = fresh() if fresh is not None else link_model
        self.cfg, self.workers, self.emit = cfg, workers, emit
        plan = workers[0].plan
        self.pairer = plan.drive.pairer(cfg.workers, plan.topology, cfg.seed)
        self.slots = plan.algo.slots(cfg.algo)
        self.now_s = 0.0
        self.queue: list[tuple] = []  # (time, tie-break, worker, what, extra)
        self.rng = np.random.default_rng([cfg.seed, 0xE7E7])
        self.jitter = Jitter(cfg.sim.jitter, cfg.seed)
        self.lanes = [Lanes() for _ in range(cfg.workers)]
        self.ended = [False] * cfg.workers

    def run(self) -> None:
        for w in range(self.cfg.workers):
            self.at(0.0, w, "slot")
        handlers = {"slot": self.start_slot, "step": self.step_done, "ready": self.ready,
                    "arrived": self.arrived}
        while self.queue:
            self.now_s, _, w, what, extra = heapq.heappop(self.queue)
            handlers[what](w, *extra)
        if not all(self.ended):
            raise RuntimeError(f"workers {[w for w, e in enumerate(self.ended) if not e]} "
                               "never ended their last slot (event order)")

    def at(self, t_s: float, w: int, what: str, *extra) -> None:
        heapq.heappush(self.queue, (t_s, float(self.rng.random()), w, what, extra))

    def start_slot(self, w: int) -> None:
        """Both lanes of worker ``w``'s next slot start now."""
        lane, worker = self.lanes[w], self.workers[w]
        lane.slot += 1
        lane.steps_left = self.slots.steps_in(lane.slot, self.cfg.run.rounds)
        lane.requests_left = self.slots.exchanges
        lane.log, lane.before = SlotLog(), worker.transport.counters()
        self.step_begins(w)
        self.ready(w)

    # -- the gradient lane
    def step_begins(self, w: int) -> None:
        """The backward pass on x as it is now; the update lands when the step's time is up."""
        worker = self.workers[w]
        loss, measured_s = begin_step(worker)
        step_s = self.jitter.of(worker.compute.step_s(measured_s))
        self.lanes[w].step = (loss, step_s, self.now_s)
        self.at(self.now_s + step_s, w, "step")

    def step_done(self, w: int) -> None:
        worker, lane = self.workers[w], self.lanes[w]
        end_step(worker, time_units(worker, self.now_s))
        loss, step_s, start_s = lane.step
        lane.log.steps.append(StepLog(loss, step_s, 0, 0.0, [start_s, self.now_s], worker.step))
        lane.step, lane.steps_left = None, lane.steps_left - 1
        if lane.steps_left > 0:
            self.step_begins(w)
        else:
            self.slot_may_end(w)

    # -- the communication lane
    def ready(self, w: int) -> None:
        self.lanes[w].asked_s = self.now_s
        pairings = self.pairer.ready(w)
        if len(pairings) == 2:
            self.exchange(pairings[0].worker, pairings[0].peer, pairings[0].label)
        for p in pairings:
            if p.peer is None:
                self.request_done(p.worker)

    def exchange(self, a: int, b: int, label: int) -> None:
        """Both send x at the pairing's time; each mixes when the slower direction is in."""
        end = self.now_s + max(self.jitter.of(self.transfer_s(a, b)),
                               self.jitter.of(self.transfer_s(b, a)))
        for me, peer in ((a, b), (b, a)):
            w = self.workers[me]
            w.algo.send_half(peer, label, w.theta, time_units(w, self.now_s))
            self.lanes[me].started_s = self.now_s
            self.at(end, me, "arrived", peer, label)

    def arrived(self, w: int, peer: int, label: int) -> None:
        worker, lane = self.workers[w], self.lanes[w]
        worker.algo.mix(worker.theta, worker.algo.take(peer, label),
                        time_units(worker, self.now_s))
        lane.log.peers.append(peer)
        lane.log.spans.append([lane.started_s, self.now_s])
        self.request_done(w)

    def request_done(self, w: int) -> None:
        lane = self.lanes[w]
        lane.log.comm_s += self.now_s - lane.asked_s
        lane.requests_left -= 1
        if lane.requests_left > 0:
            self.at(self.now_s, w, "ready")
        else:
            self.slot_may_end(w)

    def transfer_s(self, src: int, dst: int) -> float:
        if self.link_model is None:
            return 0.0
        w = self.workers[src]
        channel, numel = w.algo.channel, w.theta.numel()
        nbytes = 4 * numel if channel is None else channel.codec.nbytes(numel)  # as it travels
        transfer = getattr(self.link_model, "transfer", None)    # TCP: when it starts
        wire_s, latency_s = transfer(src, dst, nbytes, self.now_s) if transfer is not None \
            else self.link_model(src, dst, nbytes)
        return wire_s + latency_s

    # -- the barrier
    def slot_may_end(self, w: int) -> None:
        """When both lanes are through: the slot's rows, then the next slot or, after the
        last, ``finished`` (which may release stranded neighbours' requests)."""
        lane = self.lanes[w]
        if lane.steps_left > 0 or lane.requests_left > 0:
            return
        waited_s = sum(b - a for a, b in lane.log.spans)   # the transfers: receives wait on them
        worker = self.workers[w]
        for stats in slot_rows(worker, lane.log, lane.before, worker.transport.counters(),
                               waited_s):
            self.emit_row(w, stats)
        if lane.slot + 1 < self.slots.count(self.cfg.run.rounds):
            self.at(self.now_s, w, "slot")
            return
        self.ended[w] = True
        for p in self.pairer.finished(w):  # neighbours it leaves with nobody to pair with
            self.request_done(p.worker)

    def emit_row(self, w: int, stats: RoundStats) -> None:
        worker = self.workers[w]
        if worker.should_eval(stats.round):
            stats.eval_loss = worker.evaluate(stats.round)
        time_s = stats.step_span_s[1] if stats.exchange_spans_s is None else self.now_s
        self.emit(stats.as_dict() | {"time_s": time_s})


def simulate_async(plan, out: Path, progress, device: str) -> RunSummary:
    """``simulate`` for asynchronous pairwise gossip (``driver = "pairwise"``): the run record
    as the round-based simulator writes it, plus per-worker steps and pairings."""
    cfg, t_start = plan.cfg, time.perf_counter()
    with RunRecord(Path(out), cfg) as rec:
        rec.faults(plan.world)
        boxes: dict = {}
        sim, lanes = None, LaneTally(cfg.workers)
        workers = [Worker(plan, r, PostTransport(r, cfg.workers, boxes, lambda: sim.now_s),
                          device, pace=False) for r in range(cfg.workers)]

        def emit(row: dict) -> None:
            row = MetricRow.from_round(row)
            lanes.add(row)
            rec.metric(row)
            if progress is not None:
                progress(row)

        sim = AsyncSim(cfg, workers, plan.link_model, emit)
        sim.run()
        summary = final_summary(
            plan, [w.theta for w in workers], [w.evaluate(cfg.run.rounds - 1) for w in workers],
            workers[0].eval_set, time.perf_counter() - t_start, _total(workers, "bytes_sent"),
            raw_bytes_sent=_total(workers, "raw_bytes_sent"))
        predicted = plan.link_model is not None or any(w.compute.nominal for w in workers)
        summary = summary.replace(
            asynchronous=sim.pairer.record() | lanes.record()
            | plan.algo.pairing_constants(cfg.algo, plan.topology),
            predicted_wall_s=sim.now_s if predicted else None, mode="simulate")
        rec.summary(summary)
    return summary


def _total(workers: list[Worker], key: str) -> int:
    return sum(sum(w.transport.counters()[key].values()) for w in workers)


__all__ = ["AsyncSim", "Jitter", "PostTransport", "simulate_async"]
