"""One worker's side of asynchronous pairwise gossip (A2CiD2), shared by the emulator's worker
process and the one-thread simulator (``async_sim``): a gradient step with the momentum's ODE
and update around it, the algorithm's time unit, and what the record keeps.

In the emulator (``run_async``) a step is followed by a request to the launcher's pairer (over
the control plane) and, when it names a peer, one exchange over the data plane; ``run.rounds``
is the number of steps.
"""
from __future__ import annotations

import time

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


def one_step(worker: Worker, now_s) -> float:
    """One A2CiD2 gradient step of ``worker``: backward, the ODE up to now, the AdamW update
    on x and the same update on x~. Returns the loss."""
    t0 = time.perf_counter()

    def advance() -> None:
        note_step_time(worker, time.perf_counter() - t0)
        worker.algo.before_step(worker.theta, time_units(worker, now_s()))

    loss = worker.train_step(before_update=advance)
    worker.algo.took_step(worker.theta)
    return loss.item()


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


def run_async(worker: Worker, rounds: int, t0: float, ask_peer, report) -> bool:
    """The emulator's loop: ``rounds`` steps, each followed by ``ask_peer(k)`` (a ``Pairing``,
    or None when the run is being stopped) and, paired, one exchange; ``report(stats)`` after
    each. Returns False when stopped early."""
    for k in range(rounds):
        phase = compute.InnerPhase(worker.compute, 1, time.perf_counter, worker.sleep)
        while phase.another():
            loss = one_step(worker, lambda: time.time() - t0)
            phase.step_done()
        worker.overruns += phase.overruns
        before, c1 = worker.transport.counters(), time.perf_counter()
        pairing = ask_peer(k)
        if pairing is None:
            return False
        if pairing.peer is not None:
            worker.algo.exchange(pairing.peer, pairing.label, worker.theta,
                                 time_units(worker, time.time() - t0))
        worker.check_finite(k, loss)
        report(async_stats(worker, k, loss, phase, time.perf_counter() - c1, before,
                           pairing.peer))
    return True


def async_stats(worker: Worker, k: int, loss: float, phase, comm_s: float, before: dict,
                peer: int | None) -> RoundStats:
    """Step ``k``'s metrics row: its compute, the wait for a peer plus the exchange, bytes."""
    after = worker.transport.counters()
    return RoundStats(
        worker=worker.rank, round=k, step=worker.step, train_loss=loss,
        compute_s=phase.elapsed_s(), comm_s=comm_s, wait_s=after["wait_s"] - before["wait_s"],
        bytes_sent=_total(after["bytes_sent"]) - _total(before["bytes_sent"]),
        bytes_recv=_total(after["bytes_recv"]) - _total(before["bytes_recv"]),
        peers=[] if peer is None else [peer], steps=phase.steps, speed=worker.compute.speed,
        overruns=phase.overruns, overrun_ratio=phase.worst_ratio)


def _total(per_peer: dict) -> int:
    return int(sum(per_peer.values()))
