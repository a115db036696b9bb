"""The narrow interface between algorithms and the network, and what every transport shares.

An algorithm only ever calls ``send``, ``recv`` and ``all_reduce_mean`` (or its background
form, ``start_all_reduce_mean``, whose ``wait`` gives the same value). Two implementations
exist: ``memory.InMemoryTransport`` (the in-process simulator) and ``zmq_transport.ZmqTransport``
(the multi-process emulator). The ring All-Reduce is written once, here, over send/recv, so the
simulator and the emulator sum in exactly the same order.

Ownership rule: ``send`` takes ownership of the tensor. The caller must not modify it afterwards,
because a zero-copy transport may still be reading it. Algorithms therefore send freshly
allocated tensors (or views of them that are final for the rest of the round).
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch


def check_rank(rank: int, world_size: int) -> None:
    """ValueError unless ``world_size`` is an int >= 1 and ``rank`` an int in [0, world_size)."""
    if type(world_size) is not int or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if type(rank) is not int or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank!r} outside [0, {world_size})")


class TransportError(RuntimeError):
    """A peer is gone, a wait timed out, or the run was aborted."""


DEAD_PEER = "dead_peer"   # the drop reason of a message lost with a peer whose host was lost


class PeerLost(TransportError):
    """The message waited for will never come: its sender was lost with its host
    (``scenario.hostloss``). Counted (reason ``dead_peer``) and listed in ``dead_peer_losses``
    by the transport that raises it; the receiver decides what stands in for it."""

    def __init__(self, rank: int, peer: int, round_idx: int, kind: str):
        super().__init__(f"worker {rank}: {kind!r} of round {round_idx} from worker {peer} is "
                         "lost with its host")
        self.peer, self.round, self.kind = peer, round_idx, kind


@runtime_checkable
class Transport(Protocol):
    rank: int
    world_size: int

    def send(self, peer: int, round_idx: int, kind: str, tensor: torch.Tensor,
             raw_nbytes: int | None = None) -> None:
        """Send ``tensor`` to ``peer`` for round ``round_idx``, labelled ``kind``; a compressed
        frame (uint8) says in ``raw_nbytes`` how many bytes it stands for."""

    def recv(self, peer: int, round_idx: int, kind: str) -> torch.Tensor:
        """Block until ``peer``'s message (round_idx, kind) is here and return it (read-only)."""

    def all_reduce_mean(self, round_idx: int, tensor: torch.Tensor,
                        members: Sequence[int] | None = None,
                        reduce: RingSum | None = None) -> torch.Tensor:
        """The mean of ``tensor`` over all workers, or over ``members`` (sorted ranks including
        this one) when some have left (same value on every worker taking part). ``reduce``: the
        sum to divide (a compressed ring, ``comm.reduce``); None is ``ring_all_reduce_sum``."""

    def start_all_reduce_mean(self, round_idx: int, tensor: torch.Tensor,
                              members: Sequence[int] | None = None,
                              reduce: RingSum | None = None) -> PendingReduce:
        """``all_reduce_mean`` in the background: the caller computes meanwhile and must not use
        the transport for anything else until ``wait()`` has returned the mean."""

    def counters(self) -> dict:
        """Cumulative bytes per peer, dropped messages and seconds spent waiting."""

    def peer_restarted(self, peer: int) -> None:
        """``peer`` is a new process from now on (a successor that joins): whatever this
        worker still holds for its predecessor goes, and the next send reaches the new one."""

    def clock(self) -> float:
        """Seconds on the clock the run is measured in (wall-clock, or the simulator's virtual
        one)."""


# (transport, round, tensor, members) -> the sum over the ring, a new tensor
RingSum = Callable[["Transport", int, torch.Tensor, "Sequence[int] | None"], torch.Tensor]


class PendingReduce:
    """A background All-Reduce's handle: ``wait()`` returns its mean (once)."""

    def __init__(self, value: torch.Tensor | None = None):
        self._value = value

    def wait(self) -> torch.Tensor:
        return self._value


class TransportBase:
    """Byte and wait accounting plus the ring All-Reduce, over ``_send``/``_recv``."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.bytes_sent: dict[int, int] = defaultdict(int)
        self.bytes_recv: dict[int, int] = defaultdict(int)
        self.raw_bytes_sent: dict[int, int] = defaultdict(int)  # before compression
        self.dropped = 0
        self.wait_s = 0.0
        self.waiting_for: int | None = None
        # a background All-Reduce's thread: its receives are not the worker's waits (the
        # worker's wait is the time ``PendingReduce.wait`` blocks), so they are not counted
        self.uncounted_thread: int | None = None
        # messages this worker did without because their sender's host was lost, in order:
        # (src, round, kind); the worker reports them in its rows (``scenario.hostloss``)
        self.dead_peer_losses: list[tuple[int, int, str]] = []

    # -- implemented by subclasses
    def _send(self, peer: int, round_idx: int, kind: str, tensor: torch.Tensor) -> None:
        raise NotImplementedError

    def _recv(self, peer: int, round_idx: int, kind: str) -> torch.Tensor:
        raise NotImplementedError

    # -- the interface
    def send(self, peer: int, round_idx: int, kind: str, tensor: torch.Tensor,
             raw_nbytes: int | None = None) -> None:
        self._check_peer(peer)
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes_sent[peer] += nbytes
        self.raw_bytes_sent[peer] += nbytes if raw_nbytes is None else raw_nbytes
        self._send(peer, round_idx, kind, tensor)

    def recv(self, peer: int, round_idx: int, kind: str) -> torch.Tensor:
        self._check_peer(peer)
        t0, self.waiting_for = time.perf_counter(), peer
        try:
            out = self._recv(peer, round_idx, kind)
        finally:
            if threading.get_ident() != self.uncounted_thread:
                self.wait_s += time.perf_counter() - t0
            self.waiting_for = None
        self.bytes_recv[peer] += out.numel() * out.element_size()
        return out

    def all_reduce_mean(self, round_idx: int, tensor: torch.Tensor,
                        members: Sequence[int] | None = None,
                        reduce: RingSum | None = None) -> torch.Tensor:
        total = (reduce or ring_all_reduce_sum)(self, round_idx, tensor, members)
        return total.div_(self.world_size if members is None else len(members))

    def start_all_reduce_mean(self, round_idx: int, tensor: torch.Tensor,
                              members: Sequence[int] | None = None,
                              reduce: RingSum | None = None) -> PendingReduce:
        """Here: at once (the same value; transports that can overlap override this)."""
        return PendingReduce(self.all_reduce_mean(round_idx, tensor, members, reduce))

    def counters(self) -> dict:
        """Cumulative bytes per peer (on the wire, and before compression), drops, waits."""
        return {"bytes_sent": dict(self.bytes_sent), "bytes_recv": dict(self.bytes_recv),
                "raw_bytes_sent": dict(self.raw_bytes_sent), "dropped": self.dropped,
                "wait_s": self.wait_s}

    def peer_restarted(self, peer: int) -> None:
        """Here: nothing (a transport without connections to renew)."""
        self._check_peer(peer)

    def clock(self) -> float:
        return time.perf_counter()

    def _check_peer(self, peer: int) -> None:
        if not (0 <= peer < self.world_size) or peer == self.rank:
            raise TransportError(f"worker {self.rank}: invalid peer {peer} "
                                 f"(world size {self.world_size})")


def ring_all_reduce_sum(tp: Transport, round_idx: int, tensor: torch.Tensor,
                        members: Sequence[int] | None = None) -> torch.Tensor:
    """Ring All-Reduce (reduce-scatter, then all-gather) of a 1-D tensor; returns a new tensor.

    n - 1 steps of each phase, each moving 1/n of the tensor to the next worker on the ring, so
    every worker sends 2(n-1)/n of the model and the round is paced by the slowest ring link
    (Patarasuk & Yuan 2009). Chunk c is summed in the order c, c+1, ..., c-1 (mod n) of ring
    positions on every worker and in every transport, so results are bitwise reproducible.

    ``members`` (sorted ranks, this one included) re-forms the ring over the workers still there
    when others have left: it runs over them in increasing rank order, n = len(members). None is
    every worker, the ring 0, 1, ..., world_size - 1.

    Zero-copy safety (the ownership rule): ``tensor`` is handed over and only ever modified in
    chunks that have not been sent yet; the all-gather writes into a fresh output and forwards
    the chunks it receives as they are, so nothing that is in flight is ever written to.

    A chunk lost with a dead peer (``PeerLost``: its host was lost, ``scenario.hostloss``)
    stands as NaN and the ring goes on: every worker still sends every message, so none waits
    for a living peer that gave up, and the NaN reaches every sum that would have needed the
    chunk, so each worker can tell from its own result whether the round's mean is whole
    (``gap_free``; DiLoCo then does not commit it).
    """
    ring = _ring(tp, members)
    n, r = len(ring), ring.index(tp.rank)  # r: this worker's position on the ring
    if n == 1:
        return tensor.clone()
    chunks = torch.tensor_split(tensor, n)
    nxt, prv = (r + 1) % n, (r - 1) % n
    to, frm = ring[nxt], ring[prv]
    for s in range(n - 1):  # reduce-scatter: after this, chunk (r+1) % n is fully summed here
        tp.send(to, round_idx, f"rs{s}", chunks[(r - s) % n])
        mine = chunks[(r - s - 1) % n]
        mine.add_(recv_or_gap(tp, frm, round_idx, f"rs{s}", mine))
    out = torch.empty_like(tensor)
    out_chunks = torch.tensor_split(out, n)
    out_chunks[nxt].copy_(chunks[nxt])
    passing = chunks[nxt]
    for s in range(n - 1):  # all-gather: pass each summed chunk once around the ring
        tp.send(to, round_idx, f"ag{s}", passing)
        passing = recv_or_gap(tp, frm, round_idx, f"ag{s}", out_chunks[(r - s) % n])
        out_chunks[(r - s) % n].copy_(passing)
    return out


def recv_or_gap(tp: Transport, peer: int, round_idx: int, kind: str,
                like: torch.Tensor) -> torch.Tensor:
    """``peer``'s message, or NaN of ``like``'s shape where it is lost with its host (counted
    and listed by the transport, ``PeerLost``): the ring's gap (``ring_all_reduce_sum``)."""
    try:
        return tp.recv(peer, round_idx, kind)
    except PeerLost:
        return torch.full_like(like, float("nan"))


def gap_free(mean: torch.Tensor) -> bool:
    """Whether a ring's result holds no chunk lost with a dead peer (no NaN)."""
    return not bool(torch.isnan(mean).any())


def ring_steps(ring: Sequence[int], rank: int, gather_only: bool = False
               ) -> list[tuple[int, str, bool]]:
    """The ring All-Reduce's messages for ``rank`` on ``ring`` in program order, as
    (peer, kind, sends): each step a send to the next worker, then a receive from the one
    before; ``ring_all_reduce_sum`` (and ``comm.reduce.ring_sum``) do n - 1 steps of
    reduce-scatter (``rs<s>``), then n - 1 of all-gather (``ag<s>``); ``gather_only``:
    ``comm.reduce.gather_sum``, the all-gather alone."""
    n, r = len(ring), list(ring).index(rank)
    if n == 1:
        return []
    to, frm = ring[(r + 1) % n], ring[(r - 1) % n]
    phases = ("ag",) if gather_only else ("rs", "ag")
    return [step for phase in phases for s in range(n - 1)
            for step in ((to, f"{phase}{s}", True), (frm, f"{phase}{s}", False))]


def ring_positions(tp: Transport, members: Sequence[int] | None) -> tuple[Sequence[int], int]:
    """The ranks on the ring, in order, and this worker's position on it."""
    ring = _ring(tp, members)
    return ring, ring.index(tp.rank)


def _ring(tp: Transport, members: Sequence[int] | None) -> Sequence[int]:
    """The ranks on the ring, in order; ValueError unless ``members`` is strictly increasing
    ranks in [0, world_size) that include ``tp.rank`` (every member must pass the same list)."""
    if members is None:
        return range(tp.world_size)
    ring = list(members)
    for rank in ring:
        if type(rank) is not int or not 0 <= rank < tp.world_size:
            raise ValueError(f"ring member {rank!r} outside [0, {tp.world_size})")
    if ring != sorted(set(ring)):
        raise ValueError(f"ring members must be strictly increasing ranks, got {ring}")
    if tp.rank not in ring:
        raise ValueError(f"ring members {ring} do not include this worker, rank {tp.rank}")
    return ring
