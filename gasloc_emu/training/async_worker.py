"""One worker's side of asynchronous pairwise gossip (A2CiD2), shared by the emulator's worker
process and the one-thread simulator (``async_sim``): a gradient step split at the time its
update lands, the algorithm's time unit, and what the record keeps.

In the emulator (``run_async``) the two lanes of the algorithm's ``slots`` (A2CiD2's
``Slots``) run at once, as the authors' gradient and communication processes do: a thread
takes the slot's gradient steps while the worker's main thread asks the launcher's pairer for
partners (over the control plane) and exchanges over the data plane; both wait for each other
at the slot's end, where the rows are reported. One lock keeps each change of x and x~ whole
(an update, a send's snapshot, a mix); the backward pass reads x without it, as the authors'
gradient process reads the shared parameters while their communication process averages them.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gasloc_emu.training import compute
from gasloc_emu.training.worker import RoundStats, Worker


def time_units(worker: Worker, t_s: float) -> float:
    """A time in A2CiD2's unit, this worker's gradient-step time: nominal when the compute
    model has one, else the mean of its measured steps so far."""
    return t_s / step_unit_s(worker)


def step_unit_s(worker: Worker) -> float:
    c = worker.compute
    if c.nominal:
        return c.step_s()
    return max(worker.mean_step_s, 1e-9)


def begin_step(worker: Worker) -> tuple[float, float]:
    """The backward pass of ``worker``'s next step on its parameters as they are now; (loss,
    the pass's measured seconds), the measured time kept in the time unit's running mean."""
    now = worker.clock.now_s if worker.clock is not None else time.perf_counter
    t0 = now()   # emulated seconds in a process of a dilated run (``Worker.clock``)
    loss = worker.gradient().item()
    measured_s = now() - t0
    note_step_time(worker, measured_s)
    return loss, measured_s


def end_step(worker: Worker, t_units: float) -> None:
    """The step's update lands at ``t_units``: the ODE up to then, AdamW on x, the same update
    on x~ (the paper mixes at the time of the update)."""
    worker.update(before_update=lambda: worker.algo.before_step(worker.theta, t_units))
    worker.algo.took_step(worker.theta)


def note_step_time(worker: Worker, measured_s: float) -> None:
    """The measured step time's running mean (the time unit without a nominal step time; the
    authors keep an average of it too)."""
    n = worker.step
    worker.mean_step_s = (worker.mean_step_s * n + measured_s) / (n + 1)


# the mailbox's round window, for exchange labels: they count every pairing of the run, so a
# worker's next label may be far ahead of its last; memory stays bounded by the per-peer bounds
LABEL_WINDOW = 1 << 40


def transport_limits(model_bytes: int) -> dict:
    """ZmqTransport's window and per-peer bounds for asynchronous gossip: a peer is paired with
    this worker in one exchange at a time, so it never has more than one message here; two
    leave room for a retransmitted or late one to be refused as a duplicate, not an overflow."""
    return {"max_rounds_ahead": LABEL_WINDOW, "max_msgs_per_peer": 2,
            "max_bytes_per_peer": 2 * model_bytes}


@dataclass(frozen=True)
class StepLog:
    """One gradient step's account on one worker."""

    loss: float
    compute_s: float
    overruns: int
    overrun_ratio: float     # its worst overrun against the nominal step time
    span_s: list[float]      # [start, end] on the run's clock
    step: int                # the worker's step count after it


@dataclass
class SlotLog:
    """One slot's account on one worker: its steps and its exchanges (partners, spans, seconds
    from each request to its exchange's end)."""

    steps: list[StepLog] = field(default_factory=list)
    peers: list[int] = field(default_factory=list)
    spans: list[list[float]] = field(default_factory=list)
    comm_s: float = 0.0


def run_async(worker: Worker, rounds: int, t0: float, ask_peer, report) -> bool:
    """The emulator's loop: ``rounds`` gradient steps in the algorithm's ``slots``, the
    slot's exchanges (``ask_peer(i)``: a ``Pairing``, or None when the run is being stopped)
    made meanwhile; ``report(stats)`` per step at each slot's end. False when stopped early."""
    slots, lock = worker.plan.algo.slots(worker.cfg.algo), threading.Lock()
    clock = _RunClock(worker, t0)
    with ThreadPoolExecutor(1, thread_name_prefix=f"a2cid2-steps-{worker.rank}") as pool:
        for slot in range(slots.count(rounds)):
            log, before = SlotLog(), worker.transport.counters()
            steps = pool.submit(_gradient_lane, worker, slots.steps_in(slot, rounds), lock,
                                clock, log)
            went = _communication_lane(worker, slots.exchanges, slot, lock, clock, ask_peer, log)
            steps.result()
            if not went:
                return False
            after = worker.transport.counters()
            waited_s = worker.emulated(after["wait_s"] - before["wait_s"])
            for stats in slot_rows(worker, log, before, after, waited_s):
                report(stats)
    return True


class _RunClock:
    """The run's clock in emulated seconds since its start (``Worker.clock``: wall / K), and
    in A2CiD2's units."""

    def __init__(self, worker: Worker, t0: float):
        self.worker, self.t0 = worker, t0
        self.clock = worker.clock

    def s(self) -> float:
        return self.clock.since_s(self.t0)

    def units(self) -> float:
        return time_units(self.worker, self.s())


def _gradient_lane(worker: Worker, n: int, lock, clock: _RunClock, log: SlotLog) -> None:
    """``n`` gradient steps, each paced to its nominal time before its update lands."""
    for _ in range(n):
        phase = compute.InnerPhase(worker.compute, 1, worker.clock.now_s, worker.sleep)
        start_s = clock.s()
        loss, _ = begin_step(worker)
        phase.step_done()
        with lock:
            end_step(worker, clock.units())
        worker.overruns += phase.overruns
        log.steps.append(StepLog(loss, phase.elapsed_s(), phase.overruns, phase.worst_ratio,
                                 [start_s, clock.s()], worker.step))


def _communication_lane(worker: Worker, n: int, slot: int, lock, clock: _RunClock, ask_peer,
                        log: SlotLog) -> bool:
    """``n`` exchange requests, each paired exchange made; False when told to stop."""
    algo, theta = worker.algo, worker.theta
    for i in range(n):
        asked_s = clock.s()
        pairing = ask_peer(slot * n + i)
        if pairing is None:
            return False
        if pairing.peer is not None:
            start_s = clock.s()
            with lock:
                algo.send_half(pairing.peer, pairing.label, theta, clock.units())
            received = algo.take(pairing.peer, pairing.label)
            with lock:
                algo.mix(theta, received, clock.units())
            log.peers.append(pairing.peer)
            log.spans.append([start_s, clock.s()])
        log.comm_s += clock.s() - asked_s   # emulated, as the clock is
    return True


def slot_rows(worker: Worker, log: SlotLog, before: dict, after: dict,
              wait_s: float) -> list[RoundStats]:
    """The slot's metrics rows, one per step; its exchanges, bytes (the transport's counters
    ``before`` and ``after`` the slot) and ``wait_s`` (the time its receives waited) on the
    last."""
    rows = []
    for i, st in enumerate(log.steps):
        last = i == len(log.steps) - 1
        worker.check_finite(st.step - 1, st.loss)
        rows.append(RoundStats(
            worker=worker.rank, round=st.step - 1, step=st.step, train_loss=st.loss,
            compute_s=st.compute_s,
            comm_s=log.comm_s if last else 0.0, wait_s=wait_s if last else 0.0,
            bytes_sent=_total(after["bytes_sent"]) - _total(before["bytes_sent"]) if last else 0,
            bytes_recv=_total(after["bytes_recv"]) - _total(before["bytes_recv"]) if last else 0,
            peers=list(log.peers) if last else [], steps=1, speed=worker.compute.speed,
            overruns=st.overruns, overrun_ratio=st.overrun_ratio, step_span_s=st.span_s,
            tokens=worker.tokens_per_step, lr=worker.schedule_lr(st.step - 1),
            exchange_spans_s=[list(x) for x in log.spans] if last else None))
    return rows


def _total(per_peer: dict) -> int:
    return int(sum(per_peer.values()))
