"""The simulator's clock: what the worker threads did, replayed in virtual time with shared cores.

Simulated workers take turns (see ``transport.memory``), so their real order says nothing about
time. Each thread reports, in program order, what it did: computed for ``work_s`` seconds
(measured while it ran alone), sent a message, waited for one, finished a round. This module
replays those reports as a discrete-event simulation:

- a message leaves at the sender's virtual time, queues behind earlier messages on its directed
  link, and takes ``bytes * 8 / rate`` plus the link's latency (the ``LinkModel``; a model with
  an ``at_round`` method, a scenario's ``netplan.RoundLinkModel``, gets the round in the
  message's key and the time it is sent, so a link event at round R times the messages of
  rounds >= R, and one at a time those sent from then on; a model with a ``transfer`` method,
  ``netplan.TcpLinkModel`` where TCP sees the latency, also gets the time the message starts
  on its link, and times it as its link's TCP connection would: slow start, the restart
  after idle, window limits and loss; a model with ``fresh`` is copied without its state
  first, so each replay starts from new connections);
- a receiver that needs a message before it has arrived waits, and uses no CPU meanwhile;
- k workers computing at once share the machine as Linux's fair scheduler shares it among busy
  processes (processor sharing): each progresses at ``min(1, slots / k)`` seconds of work per
  second, where ``slots`` = cores / threads per worker. This is what the emulator's processes
  see when there are fewer cores than workers: a worker that waits on a slow link leaves its
  share to the others, so charging every worker the full contention would over-predict gossip.
- a worker may have a second, *background* lane (an overlapped All-Reduce, ``lanes_per_worker
  = 2``): lane ``n + rank`` runs its messages alongside the worker's compute on lane ``rank``.
  The two hand over with zero-byte messages between lanes of the same worker, which arrive at
  once; messages between workers queue on the workers' link whichever lane sends them;
- a worker's speed and pause events at a time (``timed_self``: a ``world.SelfTimeline`` and
  the speed its thread computes at) are applied when its lane begins a compute at or after
  their time: a pause stands the lane still first; a speed scales the compute's work by the
  thread's speed over the new one, and the round's row gets the new speed and compute_s;
- leaves, joins and partitions at a time (``timed_world``: the simulator's side of
  ``fixing.RoundFixer``) are fixed at rounds when the replay reaches their times (``alarm``,
  before anything else happens at that time) from the round starts replayed so far (``Start``,
  reported by a worker thread that then waits until the replay reaches it, so that it plays the
  fixings due by then); a worker absent until a join at a time not fixed yet is *parked*
  (``Park``): the replay goes on without it until an alarm unparks it, or, once every other
  worker is done, releases it;
- a *dedicated* compute (a nominal step time, ``compute.step_time_s`` > 0) runs on the worker's
  own emulated device: it progresses at rate 1 whatever else computes, and takes no share from
  the others. The emulator sleeps each step to its nominal time, so as long as the host keeps
  up (no overruns) nothing else changes its duration.

The replay is conservative: it only moves past a time when every worker's next step at that time
is known, so it lags the threads a little and emits each round's row (with ``time_s``,
``comm_s`` and ``wait_s`` on the virtual clock) once that round's end is settled. Its steps
cost what changes, not the number of lanes: the ends of dedicated computes and the wakes of
waiting lanes are kept on a heap (a dedicated compute ends at its start plus its work, one
addition), only the shared computes are walked at each event, and only the lanes that are
ready are visited (in rank order, so the order of what happens at one time is the lanes').
A ``source`` (``source(lane)``: the lane's next steps, or None when it has none) feeds lanes
whose steps are known without threads (``simulator.timing``): a ready lane with no step
left asks it for more.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

# (src, dst, nbytes) -> (seconds on the wire, one-way latency in seconds)
LinkModel = Callable[[int, int, int], tuple[float, float]]
Emit = Callable[[dict], None]

_READY, _COMPUTING, _WAITING, _DONE = "ready", "computing", "waiting", "done"
_PARKED = "parked"


@dataclass(frozen=True)
class Compute:
    work_s: float  # seconds this compute took with the machine to itself
    dedicated: bool = False  # on the worker's own emulated device: never shared, never slowed
    idle: bool = False  # standing still (a pause, waiting out a failure detection): not compute
    timed: bool = False  # the worker's timed speed and pause events are applied to it already


# The three steps of every message and round are named tuples (immutable, like the frozen
# dataclasses of the others, and a third of their cost to make: a long timing run makes
# millions of them).
class Send(NamedTuple):
    key: tuple  # (dst, src, round, kind): the mailbox key the receiver waits on
    nbytes: int


class Recv(NamedTuple):
    key: tuple


class Mark(NamedTuple):
    row: dict  # a round's metrics row; time_s, comm_s and wait_s are filled in on the clock


@dataclass(frozen=True)
class Done:
    pass


@dataclass(frozen=True)
class Start:
    round: int  # the worker starts this round (its thread waits until the replay is here)


@dataclass(frozen=True)
class Park:
    pass  # absent until a join at a time is fixed: the replay goes on without this worker


@dataclass(slots=True)   # read and set at every step: slots are faster and smaller
class _Lane:
    """One worker as the replay sees it."""
    ops: deque
    index: int = 0  # its place among the clock's lanes
    state: str = _READY
    remaining_s: float = 0.0  # work left in the current shared compute
    end_s: float = 0.0  # when the current dedicated compute ends
    token: int = 0  # bumped at every timed state, so the heap's stale entries are known
    dedicated: bool = False  # the current compute progresses at rate 1 (see ``Compute``)
    wake_s: float | None = None  # when a waiting worker's message arrives, once it is sent
    waiting_key: tuple | None = None
    waiting_since_s: float = 0.0
    wait_total_s: float = 0.0
    wait_at_mark_s: float = 0.0
    compute_end_s: float = 0.0
    idle: bool = False  # the current Compute is idle time: its end is not a compute end
    timeline: object = None  # the worker's speed and pause events at a time (SelfTimeline)
    base_speed: float = 1.0  # the speed its thread computes at
    speed: float | None = None  # the speed a timed event set (None: none yet)
    started: int = -1  # the last round whose Start the replay has reached
    released: bool = False  # parked until the end: its join at a time never came
    woken: int = 0  # how many times it was unparked or released


class VirtualClock:
    """Processor-sharing discrete-event replay of every worker's compute and messages."""

    def __init__(self, world_size: int, link_model: LinkModel | None, slots: float,
                 emit: Emit | None = None, lanes_per_worker: int = 1,
                 timed_self: dict | None = None, timed_world=None,
                 source: Callable[[int], object] | None = None):
        """``timed_world``: fixes events at a time at rounds (``next_alarm_s()``,
        ``alarm(now_s)``, ``started(rank, round)``, ``released()``; see the module
        docstring), or None; ``source(lane)``: more steps for a ready lane that has none
        left (an iterable, or None: none yet)."""
        if not slots > 0:
            raise ValueError(f"slots (cores per worker's threads) must be > 0, got {slots!r}")
        if lanes_per_worker not in (1, 2):
            raise ValueError(f"lanes_per_worker = {lanes_per_worker!r}; expected 1 or 2")
        fresh = getattr(link_model, "fresh", None)   # a stateful model: new connections
        self.link_model = fresh() if fresh is not None else link_model
        # what the model times a message with (``_timer``), found once
        self._transfer = getattr(self.link_model, "transfer", None)
        self._at_round = getattr(self.link_model, "at_round", None)
        self._link_timer = getattr(self.link_model, "link_timer", None)
        self.slots, self.emit = float(slots), emit
        self.world_size = world_size
        self.lanes = [_Lane(deque(), index) for index in range(world_size * lanes_per_worker)]
        for rank, (timeline, speed) in (timed_self or {}).items():
            self.lanes[rank].timeline, self.lanes[rank].base_speed = timeline, speed
        self.timed_world = timed_world
        self.source = source
        self.now_s = 0.0
        self.arrivals: dict[tuple, float] = {}
        # each directed link src -> dst that carried a message, by src * world_size + dst (an
        # int hashes and compares faster than a pair): [when it is free, seconds it carried
        # bytes, its timer (``_timer``)], one lookup per message
        self._links: dict[int, list] = {}
        self._ready = set(range(len(self.lanes)))  # the lanes in _READY
        self._shared: set[int] = set()  # the lanes in a shared (not dedicated) compute
        self._heap: list[tuple[float, int, int]] = []  # heap: (time, lane, token)

    # -- what the threads call (under the simulator's turn lock)

    def report(self, rank: int, op) -> None:
        """Append one step of ``rank``'s program, then replay as far as is now known."""
        self.lanes[rank].ops.append(op)
        self._advance()

    def wait_s(self, rank: int) -> float:
        """Virtual seconds ``rank`` has spent waiting for messages, as far as replayed."""
        return self.lanes[rank].wait_total_s

    def unpark(self, rank: int) -> None:
        """A parked worker goes on from now (its join may have been fixed). So does one whose
        thread has reported its ``Park`` that the lagging replay has not reached yet: that
        Park is dropped (parked and woken at once), else the lane would park after the very
        alarm that fixed its join, with none left to wake it, and every worker expecting it
        at that round would wait for ever."""
        lane = self.lanes[rank]
        if lane.state == _PARKED:
            self._to_ready(lane)
            lane.woken += 1
        elif any(isinstance(op, Park) for op in lane.ops):
            lane.ops = deque(op for op in lane.ops if not isinstance(op, Park))
            lane.woken += 1

    @property
    def link_busy_s(self) -> dict[tuple[int, int], float]:
        """Seconds each directed link carried bytes (those that carried a message): a new
        dict, made from the links' records at each call (read it once)."""
        n = self.world_size
        return {divmod(link, n): busy for link, (_, busy, _) in self._links.items()}

    def finished(self) -> bool:
        return all(lane.state == _DONE for lane in self.lanes)

    def unsettled_rows(self) -> list[dict]:
        """Rows of rounds the replay never reached (the run failed first): no times for them."""
        return [op.row | {"time_s": None, "comm_s": None, "wait_s": None}
                for lane in self.lanes for op in lane.ops if isinstance(op, Mark)]

    # -- the replay

    def run(self) -> None:
        """Replay as far as is known (a clock fed by a ``source`` runs to its end here)."""
        self._advance()

    def _advance(self) -> None:
        while True:
            self._alarms()
            self._run_instant_ops()
            if self._ready:
                return  # a worker's next step is not reported yet: it may start computing now
            t_next = self._next_event_s()
            if t_next is None:
                self._release_parked()
                return  # everyone is done, or waits on a message not sent yet
            self._step_to(t_next)

    def _to_ready(self, lane: _Lane) -> None:
        lane.state = _READY
        self._ready.add(lane.index)

    def _alarms(self) -> None:
        """Fix the events at a time that are due, before anything else happens now."""
        tw = self.timed_world
        while tw is not None and (alarm_s := tw.next_alarm_s()) is not None \
                and alarm_s <= self.now_s:
            tw.alarm(self.now_s)

    def _release_parked(self) -> None:
        """Once every other worker is done, the parked ones' joins will never come."""
        parked = [lane for lane in self.lanes if lane.state == _PARKED]
        if parked and all(lane.state in (_DONE, _PARKED) for lane in self.lanes):
            for lane in parked:
                self._to_ready(lane)
                lane.released, lane.woken = True, lane.woken + 1
            self.timed_world.released()

    def _run_instant_ops(self) -> None:
        """Apply every reported step that takes no time, for every worker that is ready, in
        rank order.

        One pass is enough: a step changes only its own worker's state (a send only sets when
        the receiver will wake, which takes effect in ``_step_to``).
        """
        source, send, recv = self.source, self._send, self._recv
        for rank in sorted(self._ready):
            lane = self.lanes[rank]
            ops = lane.ops
            while lane.state == _READY:
                if not ops:
                    more = source(rank) if source is not None else None
                    if not more:
                        break
                    ops.extend(more)
                op = ops.popleft()
                kind = op.__class__     # the two most frequent steps here, the rest in _apply
                if kind is Send:
                    send(rank, op)
                elif kind is Recv:
                    recv(lane, op.key)
                else:
                    self._apply(rank, lane, op)

    def _apply(self, rank: int, lane: _Lane, op) -> None:
        kind = op.__class__       # the most frequent steps first, by their class
        if kind is Send:
            self._send(rank, op)
        elif kind is Recv:
            self._recv(lane, op.key)
        elif kind is Mark:
            self._mark(lane, op.row)
        elif isinstance(op, Compute):
            if lane.timeline is not None and op.work_s > 0 and not op.idle and not op.timed:
                op = self._timed(lane, op)
            self._compute(rank, lane, op)
        elif isinstance(op, Send):
            self._send(rank, op)
        elif isinstance(op, Recv):
            self._recv(lane, op.key)
        elif isinstance(op, Mark):
            self._mark(lane, op.row)
        elif isinstance(op, Done):
            lane.state = _DONE
            self._ready.discard(rank)
        elif isinstance(op, Start):
            lane.started = op.round
            if self.timed_world is not None:
                self.timed_world.started(rank, op.round)
        elif isinstance(op, Park):
            lane.state = _PARKED
            self._ready.discard(rank)
        else:
            raise TypeError(f"unknown virtual-clock step {op!r}")

    def _compute(self, rank: int, lane: _Lane, op: Compute) -> None:
        """The lane starts computing ``op`` now (a compute of no work only marks its end)."""
        if op.work_s > 0:
            self._ready.discard(rank)
            lane.state, lane.dedicated, lane.idle = _COMPUTING, op.dedicated, op.idle
            if op.dedicated:
                lane.end_s = self.now_s + op.work_s
                self._wake_at(lane, lane.end_s)
            else:
                lane.remaining_s = op.work_s
                self._shared.add(rank)
        elif not op.idle:
            lane.compute_end_s = self.now_s

    def _wake_at(self, lane: _Lane, t_s: float) -> None:
        """The lane's timed state (a dedicated compute, a wait with its message sent) ends at
        ``t_s``."""
        lane.token += 1
        heapq.heappush(self._heap, (t_s, lane.index, lane.token))

    def _timed(self, lane: _Lane, op: Compute) -> Compute:
        """A compute that begins now, after the worker's due timed events: a pause first (the
        compute waits behind it), then the work at the speed in force."""
        speed, pause_s = lane.timeline.due(self.now_s)
        if speed is not None:
            lane.speed = speed
        scaled = Compute(op.work_s * lane.base_speed / (lane.speed or lane.base_speed),
                         op.dedicated, timed=True)
        if pause_s > 0:
            lane.ops.appendleft(scaled)
            return Compute(pause_s, dedicated=True, idle=True)
        return scaled

    def _send(self, src_lane: int, op: Send) -> None:
        key = op.key
        dst_lane = key[0]
        n = self.world_size
        src, dst = src_lane % n, dst_lane % n  # lanes -> workers
        now = arrival = self.now_s
        if self.link_model is not None and src != dst:  # a hand-over between lanes is instant
            link = self._links.get(src * n + dst)
            if link is None:
                link = self._links[src * n + dst] = [0.0, 0.0, self._timer(src, dst)]
            free = link[0]
            start = now if now >= free else free
            wire_s, latency_s = link[2](op.nbytes, start, key[2])
            link[0] = start + wire_s
            link[1] += wire_s
            arrival = start + wire_s + latency_s
        receiver = self.lanes[dst_lane]
        if receiver.state == _WAITING and receiver.waiting_key == key:
            receiver.wake_s, receiver.waiting_key = arrival, None
            self._wake_at(receiver, arrival)
        else:
            self.arrivals[key] = arrival

    def _timer(self, src: int, dst: int):
        """``timer(nbytes, start_s, round_idx)``: (wire s, latency s) of one message on src ->
        dst, found once per link. A model with ``link_timer`` gives its own (the TCP model's:
        its connection found once); one with ``transfer`` (``netplan.TcpLinkModel``: TCP sees
        the latency) gets the time the message starts on its link, ``start_s`` (after the
        link's earlier messages: a connection's idle time ends then), and the round; one
        with ``at_round`` (a scenario's links change by round or by time) gets the round in
        the message's key and the send time; a plain model the bytes."""
        if self._link_timer is not None:
            return self._link_timer(src, dst)
        transfer, at_round, model = self._transfer, self._at_round, self.link_model
        if transfer is not None:
            return lambda nbytes, start_s, round_idx: transfer(src, dst, nbytes, start_s,
                                                                round_idx)
        if at_round is not None:
            return lambda nbytes, start_s, round_idx: at_round(src, dst, nbytes, round_idx,
                                                                self.now_s)
        return lambda nbytes, start_s, round_idx: model(src, dst, nbytes)

    def _recv(self, lane: _Lane, key: tuple) -> None:
        arrival = self.arrivals.pop(key, None)
        if arrival is not None and arrival <= self.now_s:
            return
        self._ready.discard(lane.index)
        lane.state, lane.waiting_since_s = _WAITING, self.now_s
        lane.wake_s, lane.waiting_key = arrival, (key if arrival is None else None)
        if arrival is not None:
            self._wake_at(lane, arrival)

    def _mark(self, lane: _Lane, row: dict) -> None:
        if lane.speed is not None and "compute_s" in row:  # a speed set at a time
            row = row | {"speed": lane.speed,
                         "compute_s": row["compute_s"] * lane.base_speed / lane.speed}
        row = {**row, "time_s": self.now_s, "comm_s": self.now_s - lane.compute_end_s,
               "wait_s": lane.wait_total_s - lane.wait_at_mark_s}   # one new dict, not two
        lane.wait_at_mark_s = lane.wait_total_s
        if self.emit is not None:
            self.emit(row)

    def _rate(self) -> float:
        """Seconds of work per second for each worker computing on the host: cores shared
        fairly among them (dedicated computes neither share nor count)."""
        k = len(self._shared)
        return min(1.0, self.slots / k) if k else 1.0

    def _next_timed_s(self) -> float | None:
        """The earliest end of a dedicated compute or wake of a waiting lane (stale heap
        entries, of states that have ended since, are dropped on the way)."""
        heap, lanes = self._heap, self.lanes
        while heap:
            t_s, index, token = heap[0]
            if lanes[index].token == token and lanes[index].state in (_COMPUTING, _WAITING):
                return t_s
            heapq.heappop(heap)
        return None

    def _next_event_s(self) -> float | None:
        shared, times = self._rate(), []
        for index in self._shared:
            lane = self.lanes[index]
            times.append(self.now_s + lane.remaining_s / shared)
        timed_s = self._next_timed_s()
        if timed_s is not None:
            times.append(timed_s)
        alarm_s = self.timed_world.next_alarm_s() if self.timed_world is not None else None
        if times and alarm_s is not None:
            times.append(alarm_s)   # the replay stops there to fix what is due
        return min(times) if times else None

    def _step_to(self, t_s: float) -> None:
        shared, dt = self._rate(), t_s - self.now_s
        for index in list(self._shared):
            lane = self.lanes[index]
            # the same expression as in _next_event_s, so the earliest finisher is exact
            if self.now_s + lane.remaining_s / shared <= t_s:
                lane.remaining_s = 0.0
                self._shared.discard(index)
                self._end_compute(lane, t_s)
            else:
                lane.remaining_s -= shared * dt
        heap, lanes = self._heap, self.lanes
        while heap and heap[0][0] <= t_s:
            _, index, token = heapq.heappop(heap)
            lane = lanes[index]
            if lane.token != token:
                continue   # stale: that state ended before
            if lane.state == _COMPUTING:
                self._end_compute(lane, t_s)
            elif lane.state == _WAITING:
                lane.wait_total_s += lane.wake_s - lane.waiting_since_s
                lane.wake_s = None
                self._to_ready(lane)
        self.now_s = t_s

    def _end_compute(self, lane: _Lane, t_s: float) -> None:
        self._to_ready(lane)
        if not lane.idle:
            lane.compute_end_s = t_s


def slots_for(cores: int, threads_per_worker: int) -> float:
    """How many workers can compute at full speed at once: cores over each one's threads."""
    return max(cores, 1) / max(threads_per_worker, 1)
