"""The simulator of asynchronous pairwise gossip (``algo.name = a2cid2``): one thread, one event
queue in virtual time, the same ``Worker`` and ``A2CiD2`` objects as the emulator.

Each worker repeats: one gradient step (``compute.step_time_s`` / speed of virtual time when
set, else the step's measured time), then ready for an exchange (``pairing.Pairer``); paired,
both send their parameters at once, and the exchange ends when the slower direction has
arrived (the link model's wire time plus latency; no time without a link model). A worker is
in at most one exchange, so a link carries one message at a time and nothing queues. Events are
handled in order of virtual time, so with nominal step times a run is deterministic. Events at
the same time (equal nominal step times make many) are taken in a random order drawn from the
run's seed: taken by worker id, a ring of equal workers would pair 0-1, 2-3, ... at every step
and never mix across those pairs. ``run.rounds`` is the number of steps per worker; a metrics
row is written per step, with its partner in ``peers``.
"""
from __future__ import annotations

import heapq
import time
from pathlib import Path

import numpy as np
import torch

from gasloc_emu.config import Config
from gasloc_emu.report.records import RunRecord
from gasloc_emu.report.summary import final_summary
from gasloc_emu.training.async_worker import one_step, time_units
from gasloc_emu.training.pairing import Pairer
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


class AsyncSim:
    """The event loop over every worker's steps, readiness and exchanges."""

    def __init__(self, cfg: Config, workers: list[Worker], link_model, emit):
        self.cfg, self.workers, self.link_model, self.emit = cfg, workers, link_model, emit
        topo = workers[0].topology
        self.pairer = Pairer(cfg.workers, topo.possible_edges, cfg.seed)
        self.now_s = 0.0
        self.queue: list[tuple[float, float, int, str]] = []  # (time, tie-break, worker, what)
        self.rng = np.random.default_rng([cfg.seed, 0xE7E7])
        self.rows: dict[int, dict] = {}  # worker -> its current step's row, until it is paired
        self.steps_done = [0] * cfg.workers

    def run(self) -> None:
        for w in range(self.cfg.workers):
            self.at(0.0, w, "step")
        while self.queue:
            self.now_s, _, w, what = heapq.heappop(self.queue)
            if what == "step":
                self.step(w)
            else:
                self.ready(w)

    def at(self, t_s: float, w: int, what: str) -> None:
        heapq.heappush(self.queue, (t_s, float(self.rng.random()), w, what))

    def step(self, w: int) -> None:
        """Worker ``w`` takes its next gradient step; it is ready when the step's time is up."""
        worker = self.workers[w]
        t0 = time.perf_counter()
        loss = one_step(worker, lambda: self.now_s)
        step_s = worker.compute.step_s(time.perf_counter() - t0)
        self.rows[w] = {"train_loss": loss, "compute_s": step_s,
                        "before": worker.transport.counters()}
        self.at(self.now_s + step_s, w, "ready")

    def ready(self, w: int) -> None:
        self.rows[w]["ready_s"] = self.now_s
        pairings = self.pairer.ready(w)
        if len(pairings) == 2:
            self.exchange(pairings[0].worker, pairings[0].peer, pairings[0].label)
        for p in pairings:
            if p.peer is None:
                self.done_step(p.worker, None, self.now_s)

    def exchange(self, a: int, b: int, label: int) -> None:
        """Both send at the pairing's time, then both receive and mix; both go on when the
        slower direction has arrived."""
        end = self.now_s + max(self.transfer_s(a, b), self.transfer_s(b, a))
        for me, peer in ((a, b), (b, a)):
            w = self.workers[me]
            w.algo.send_half(peer, label, w.theta, time_units(w, self.now_s))
        for me, peer in ((a, b), (b, a)):
            w = self.workers[me]
            w.algo.receive_half(peer, label, w.theta)
        for me, peer in ((a, b), (b, a)):
            self.done_step(me, peer, end)

    def transfer_s(self, src: int, dst: int) -> float:
        if self.link_model is None:
            return 0.0
        w = self.workers[src]
        channel, numel = w.algo.channel, w.theta.numel()
        nbytes = 4 * numel if channel is None else channel.codec.nbytes(numel)  # as it travels
        wire_s, latency_s = self.link_model(src, dst, nbytes)
        return wire_s + latency_s

    def done_step(self, w: int, peer: int | None, end_s: float) -> None:
        """Worker ``w``'s step and its exchange are over at ``end_s``: its row, then the next
        step or, after the last, ``finished`` (which may release stranded neighbours)."""
        worker = self.workers[w]
        k = self.steps_done[w]
        worker.check_finite(k, self.rows[w]["train_loss"])
        self.emit(self.row(w, k, peer, end_s))
        self.steps_done[w] += 1
        if self.steps_done[w] < self.cfg.run.rounds:
            self.at(end_s, w, "step")
            return
        for p in self.pairer.finished(w):  # neighbours it leaves with nobody to pair with
            self.done_step(p.worker, None, max(end_s, self.now_s))

    def row(self, w: int, k: int, peer: int | None, end_s: float) -> dict:
        worker, r = self.workers[w], self.rows.pop(w)
        after, before = worker.transport.counters(), r["before"]
        # as the emulator counts them: comm from ready to the exchange's end (the wait for a
        # partner included), wait the transfer itself (its recv blocks for it)
        stats = RoundStats(
            worker=w, round=k, step=worker.step, train_loss=r["train_loss"],
            compute_s=r["compute_s"], comm_s=end_s - r["ready_s"],
            wait_s=end_s - (self.now_s if peer is not None else end_s),
            bytes_sent=_delta(after, before, "bytes_sent"),
            bytes_recv=_delta(after, before, "bytes_recv"),
            peers=[] if peer is None else [peer], steps=1, speed=worker.compute.speed)
        if worker.should_eval(k):
            stats.eval_loss = worker.evaluate(k)
        return stats.as_dict() | {"time_s": end_s}


def _delta(after: dict, before: dict, key: str) -> int:
    return int(sum(after[key].values()) - sum(before[key].values()))


def simulate_async(plan, out: Path, progress, device: str) -> dict:
    """``simulate`` for asynchronous pairwise gossip (``has_rounds = False``): the run record
    as the round-based simulator writes it, plus per-worker steps and pairings."""
    cfg, t_start = plan.cfg, time.perf_counter()
    with RunRecord(Path(out), cfg) as rec:
        boxes: dict = {}
        sim = None
        workers = [Worker(plan, r, PostTransport(r, cfg.workers, boxes, lambda: sim.now_s),
                          device, pace=False) for r in range(cfg.workers)]

        def emit(row: dict) -> None:
            rec.metric(row)
            if progress is not None:
                progress(row)

        sim = AsyncSim(cfg, workers, plan.link_model, emit)
        sim.run()
        summary = final_summary(
            plan, [w.theta for w in workers], [w.evaluate(cfg.run.rounds - 1) for w in workers],
            workers[0].eval_set, time.perf_counter() - t_start, _total(workers, "bytes_sent"),
            raw_bytes_sent=_total(workers, "raw_bytes_sent"))
        summary["asynchronous"] = sim.pairer.record() | plan.algo.pairing_constants(
            cfg.algo, plan.topology)
        if plan.link_model is not None or any(w.compute.nominal for w in workers):
            summary["predicted_wall_s"] = sim.now_s
        summary["mode"] = "simulate"
        rec.summary(summary)
    return summary


def _total(workers: list[Worker], key: str) -> int:
    return sum(sum(w.transport.counters()[key].values()) for w in workers)


__all__ = ["AsyncSim", "PostTransport", "simulate_async"]
