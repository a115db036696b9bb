"""In-process transport for the simulator: mailboxes in one process, timed by a virtual clock.

All simulated workers share one ``Hub``. Worker threads take turns: a worker holds the hub's lock
while it computes and gives it up only while it waits for a message, so exactly one worker runs at
a time (no oversubscribed cores, and each worker's compute time can be measured cleanly).

Timing is not decided here: every send, receive and measured compute is reported to the hub's
``VirtualClock``, which replays them in virtual time (links that queue and take bytes * 8 / rate
plus latency, cores shared among the workers computing at once). With no link model every
transfer is instantaneous and only compute takes time.

A background All-Reduce (``start_all_reduce_mean`` on a hub made with ``background=True``, for
overlapped DiLoCo) runs on the worker's second clock lane: the thread does the ring's sends and
receives when ``wait`` is called, in program order as always, but the clock replays them on
the lane that started when the All-Reduce was started, alongside the compute in between.
"""
from __future__ import annotations

import threading
import time

import torch

from gasloc_emu.simulator.virtual_clock import (
    Compute,
    Done,
    Emit,
    LinkModel,
    Mark,
    Park,
    Recv,
    Send,
    Start,
    VirtualClock,
)
from gasloc_emu.transport.base import PeerLost, PendingReduce, TransportBase, TransportError

__all__ = ["Hub", "InMemoryTransport", "LinkModel"]

WAIT_SLICE_S = 1.0         # a waiting worker looks at the others' progress this often
# a slice that took this long or more was not waiting on others' progress: the process was
# suspended, or a worker held the turn lock all along computing; either way it is not counted
SUSPENDED_AFTER_S = 30.0


class Hub:
    """Mailboxes, the turn lock, and the virtual clock of every simulated worker."""

    def __init__(self, world_size: int, link_model: LinkModel | None = None,
                 timeout_s: float = 600.0, slots: float | None = None, emit: Emit | None = None,
                 background: bool = False, timed_self: dict | None = None,
                 timed_world=None, threads: tuple[int, ...] | None = None,
                 dead: frozenset = frozenset()):
        """``timed_self``: {rank: (timeline, speed)} of workers with speed or pause events at a
        time; ``timed_world``: what fixes leaves, joins and partitions at a time at rounds; both
        for the clock (``VirtualClock``). ``threads``: each worker's torch CPU threads (a
        run's, for its replay); None: the process's setting for all."""
        self.world_size, self.background = world_size, background
        # (dst, src, round, kind) of each message a run's worker did without, its sender lost
        # with its host (the run record's rows, ``--replay``): lost here too
        self.dead = dead
        self.threads = threads
        self._turn = threading.local()
        self.cond = threading.Condition(threading.RLock())
        self.mail: dict[tuple, torch.Tensor] = {}
        # slots=None: as many cores as workers, i.e. no CPU sharing in the prediction
        self.clock = VirtualClock(world_size, link_model, slots or world_size, emit,
                                  lanes_per_worker=2 if background else 1,
                                  timed_self=timed_self, timed_world=timed_world)
        self.timeout_s = timeout_s
        self.progress = 0   # every message and clock report: what a wait's patience counts from
        self.error: BaseException | None = None
        # for the stall check: who waits for which message, who hangs (since which round), who ended
        self.waiting: dict[int, tuple] = {}
        self.hung: dict[int, int] = {}
        self.done: set[int] = set()

    def take_turn(self, rank: int) -> None:
        """The calling thread computes for ``rank`` from now on (it holds ``cond``)."""
        self._turn.threads = self.threads[rank] if self.threads else None
        self._own_threads()

    def _own_threads(self) -> None:
        """Torch's thread count for the worker whose turn it now is: CPU kernels sum in an
        order that depends on it, so a worker replayed with the count it ran with computes
        what it computed. Set at every turn: the count is per thread under OpenMP but global
        for MKL, and only one worker computes at a time."""
        n = getattr(self._turn, "threads", None)
        if n:
            torch.set_num_threads(n)

    def report(self, lane: int, op) -> None:
        """Hand one operation to the clock (the caller holds ``cond``); it counts as progress."""
        self.progress += 1
        self.clock.report(lane, op)

    def wait_until(self, done) -> bool:
        """Wait on ``cond`` (held) until ``done()`` or an error; False once no worker has made
        progress for ``timeout_s``. A slice of ``SUSPENDED_AFTER_S`` or more is not counted (the
        process was suspended, Ctrl-Z or SIGSTOP, or a worker computed that long holding the
        turn lock), and any worker's progress starts the patience again."""
        idle_s, seen = 0.0, self.progress
        while not (done() or self.error is not None):
            t0 = time.monotonic()
            self.cond.wait(WAIT_SLICE_S)
            took = time.monotonic() - t0
            if self.progress != seen:
                idle_s, seen = 0.0, self.progress
            elif took < SUSPENDED_AFTER_S:
                idle_s += took
            if idle_s >= self.timeout_s:
                return False
        self._own_threads()
        return True

    def abort(self, exc: BaseException) -> None:
        """Wake every waiting worker so that the whole simulation stops with ``exc``."""
        with self.cond:
            self.error = self.error or exc
            self.cond.notify_all()

    def check_stalled(self) -> None:
        """Abort when no worker can move again: each is waiting for a message nobody sent yet, or
        hangs. Without this a hung worker would stall the simulation for ``timeout_s``."""
        live = set(range(self.world_size)) - self.done
        blocked = {r for r, key in self.waiting.items() if key not in self.mail} | set(self.hung)
        if live and live <= blocked:
            self.abort(TransportError(self._stall_message()))

    def _stall_message(self) -> str:
        waiting = sorted(self.waiting)
        if self.hung:
            rank, round_idx = min(self.hung.items())
            return (f"worker {rank} stopped responding at round {round_idx}; workers {waiting} "
                    "were waiting for messages")
        return f"simulation stalled: workers {waiting} wait for messages no worker will send"

    def hang(self, rank: int, round_idx: int) -> None:
        """Worker ``rank`` stops for good (an injected hang); returns once the run is aborted."""
        with self.cond:
            self.hung[rank] = round_idx
            self.check_stalled()
            self.cond.wait_for(lambda: self.error is not None)

    def transport(self, rank: int) -> InMemoryTransport:
        return InMemoryTransport(self, rank)


class InMemoryTransport(TransportBase):
    def __init__(self, hub: Hub, rank: int):
        super().__init__(rank, hub.world_size)
        self.hub = hub
        self.lane = rank  # the clock lane this worker's messages are reported on now
        self.bg_lane = rank + hub.world_size  # its background lane (a hub with background)

    def _clock_key(self, key: tuple) -> tuple:
        """A mailbox key (dst, src, round, kind) with the workers as clock lanes."""
        offset = self.lane - self.rank
        return (key[0] + offset, key[1] + offset, *key[2:])

    def start_all_reduce_mean(self, round_idx: int, tensor: torch.Tensor,
                              members=None, reduce=None) -> PendingReduce:
        if not self.hub.background:
            return super().start_all_reduce_mean(round_idx, tensor, members, reduce)
        fork = (self.bg_lane, self.rank, round_idx, "fork")
        with self.hub.cond:
            self.hub.report(self.rank, Send(fork, 0))
            self.hub.report(self.bg_lane, Recv(fork))
        return _DeferredReduce(self, round_idx, tensor, members, reduce)

    def _send(self, peer: int, round_idx: int, kind: str, tensor: torch.Tensor) -> None:
        hub = self.hub
        with hub.cond:
            key = (peer, self.rank, round_idx, kind)
            if key in hub.mail:
                raise TransportError(f"worker {self.rank} sent {kind!r} of round {round_idx} "
                                     f"to worker {peer} twice")
            hub.mail[key] = tensor
            hub.report(self.lane, Send(self._clock_key(key),
                                             tensor.numel() * tensor.element_size()))
            hub.cond.notify_all()

    def _recv(self, peer: int, round_idx: int, kind: str) -> torch.Tensor:
        hub, key = self.hub, (self.rank, peer, round_idx, kind)
        if key in hub.dead:   # as in the run it replays: never waited for, never taken
            self.dead_peer_losses.append((peer, round_idx, kind))
            raise PeerLost(self.rank, peer, round_idx, kind)
        with hub.cond:
            hub.report(self.lane, Recv(self._clock_key(key)))
            hub.waiting[self.rank] = key
            try:
                hub.check_stalled()
                ok = hub.wait_until(lambda: key in hub.mail)
            finally:
                del hub.waiting[self.rank]
            if hub.error is not None:
                raise TransportError(f"worker {self.rank}: simulation aborted ({hub.error})")
            if not ok:
                raise TransportError(f"worker {self.rank} waited for {kind!r} of round "
                                     f"{round_idx} from worker {peer} while no worker moved for "
                                     f"{hub.timeout_s:.0f} s")
            return hub.mail.pop(key)

    def counters(self) -> dict:
        # waits in virtual time (as far as replayed): real sleeps while others compute mean nothing
        return super().counters() | {"wait_s": self.hub.clock.wait_s(self.rank)}

    def clock(self) -> float:
        """How far the replay has got. It lags the threads, so a row's times come from the clock
        when it emits the row (``end_round``), not from differences of this."""
        return self.hub.clock.now_s

    def advance(self, seconds: float, dedicated: bool = False) -> None:
        """Report compute time to the clock: measured (seconds with the machine to itself,
        shared with the others computing at once), or ``dedicated`` (a nominal time, on the
        worker's own emulated device)."""
        with self.hub.cond:
            self.hub.report(self.rank, Compute(seconds, dedicated))

    def idle(self, seconds: float) -> None:
        """Stand still for ``seconds`` of virtual time (a pause, a failure detection's wait):
        like a nominal compute it takes its time whatever else runs, but it is not compute."""
        with self.hub.cond:
            self.hub.report(self.rank, Compute(seconds, dedicated=True, idle=True))

    def end_round(self, row: dict) -> None:
        """Hand a finished round's row to the clock, which emits it with its virtual times."""
        with self.hub.cond:
            self.hub.report(self.rank, Mark(row))

    def start_round(self, round_idx: int) -> None:
        """Tell the clock this worker starts ``round_idx`` and wait until its replay is here:
        the leaves, joins and partitions at a time due by then are fixed at their rounds."""
        self._clock_wait(Start(round_idx),
                         lambda lane: lane.started >= round_idx, f"round {round_idx}'s start")

    def park(self) -> bool:
        """Absent until a join at a time: wait, without holding up the clock, until an alarm
        wakes this worker (True) or the run ends without its join (False)."""
        woken = self.hub.clock.lanes[self.rank].woken
        self._clock_wait(Park(), lambda lane: lane.woken > woken, "its join")
        return not self.hub.clock.lanes[self.rank].released

    def _clock_wait(self, op, reached, what: str) -> None:
        hub, lane = self.hub, self.hub.clock.lanes[self.rank]
        with hub.cond:
            hub.report(self.rank, op)
            hub.cond.notify_all()
            ok = hub.wait_until(lambda: reached(lane))
            if hub.error is not None:
                raise TransportError(f"worker {self.rank}: simulation aborted ({hub.error})")
            if not ok:
                raise TransportError(f"worker {self.rank} waited for the virtual clock to reach "
                                     f"{what} while no worker moved for {hub.timeout_s:.0f} s")

    def finish(self) -> None:
        with self.hub.cond:
            self.hub.report(self.rank, Done())
            if self.hub.background:
                self.hub.report(self.bg_lane, Done())
            self.hub.done.add(self.rank)
            self.hub.check_stalled()  # the workers left may be waiting for this one


class _DeferredReduce(PendingReduce):
    """The simulator's background All-Reduce: run by ``wait`` on the worker's own thread, timed
    on its background lane, which hands the mean back to the worker's lane when done."""

    def __init__(self, tp: InMemoryTransport, round_idx: int, tensor: torch.Tensor, members,
                 reduce=None):
        super().__init__()
        self.tp, self.round_idx, self.tensor, self.members = tp, round_idx, tensor, members
        self.reduce = reduce

    def wait(self) -> torch.Tensor:
        tp, rank, bg = self.tp, self.tp.rank, self.tp.bg_lane
        tp.lane = bg
        try:
            mean = tp.all_reduce_mean(self.round_idx, self.tensor, self.members, self.reduce)
        finally:
            tp.lane = rank
        done = (rank, bg, self.round_idx, "joined")
        with tp.hub.cond:
            tp.hub.report(bg, Send(done, 0))
            tp.hub.report(rank, Recv(done))
        return mean
