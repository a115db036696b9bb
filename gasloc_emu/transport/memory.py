"""In-process transport for the simulator: mailboxes in one process, plus a virtual clock.

All simulated workers share one ``Hub``. Worker threads take turns: a worker holds the hub's lock
while it computes and gives it up only while it waits for a message, so exactly one worker runs at
a time (no oversubscribed cores, and each worker's compute time can be measured cleanly).

The virtual clock predicts wall-clock time on a shaped network: every worker has a clock that its
compute time advances; a message leaves at the sender's clock, queues behind earlier messages on
its directed link, takes bytes * 8 / rate plus the link's latency, and a receiver's clock jumps to
the arrival time when it has to wait. With no link model every transfer is instantaneous.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

from .base import TransportBase, TransportError

# (src, dst, nbytes) -> (seconds on the wire, one-way latency in seconds)
LinkModel = Callable[[int, int, int], tuple[float, float]]


class Hub:
    """Mailboxes, the turn lock, and the virtual clocks of every simulated worker."""

    def __init__(self, world_size: int, link_model: LinkModel | None = None,
                 timeout_s: float = 600.0):
        self.world_size = world_size
        self.cond = threading.Condition(threading.RLock())
        self.mail: dict[tuple, tuple[torch.Tensor, float]] = {}
        self.link_model = link_model
        self.link_free: dict[tuple[int, int], float] = {}
        self.clock = [0.0] * world_size
        self.timeout_s = timeout_s
        self.error: BaseException | None = None

    def abort(self, exc: BaseException) -> None:
        """Wake every waiting worker so that the whole simulation stops with ``exc``."""
        with self.cond:
            self.error = self.error or exc
            self.cond.notify_all()

    def arrival(self, src: int, dst: int, nbytes: int) -> float:
        """Virtual arrival time of a message sent now by ``src``; links serialise their messages."""
        if self.link_model is None:
            return self.clock[src]
        wire_s, latency_s = self.link_model(src, dst, nbytes)
        start = max(self.clock[src], self.link_free.get((src, dst), 0.0))
        self.link_free[(src, dst)] = start + wire_s
        return start + wire_s + latency_s

    def transport(self, rank: int) -> "InMemoryTransport":
        return InMemoryTransport(self, rank)


class InMemoryTransport(TransportBase):
    def __init__(self, hub: Hub, rank: int):
        super().__init__(rank, hub.world_size)
        self.hub = hub
        self.virtual_wait_s = 0.0

    def _send(self, peer: int, round_idx: int, kind: str, tensor: torch.Tensor) -> None:
        hub = self.hub
        with hub.cond:
            key = (peer, self.rank, round_idx, kind)
            if key in hub.mail:
                raise TransportError(f"worker {self.rank} sent {kind!r} of round {round_idx} "
                                     f"to worker {peer} twice")
            hub.mail[key] = (tensor, hub.arrival(self.rank, peer, tensor.numel() * tensor.element_size()))
            hub.cond.notify_all()

    def _recv(self, peer: int, round_idx: int, kind: str) -> torch.Tensor:
        hub, key = self.hub, (self.rank, peer, round_idx, kind)
        with hub.cond:
            ok = hub.cond.wait_for(lambda: key in hub.mail or hub.error is not None, hub.timeout_s)
            if hub.error is not None:
                raise TransportError(f"worker {self.rank}: simulation aborted ({hub.error})")
            if not ok:
                raise TransportError(f"worker {self.rank} waited {hub.timeout_s:.0f} s for "
                                     f"{kind!r} of round {round_idx} from worker {peer}")
            tensor, arrival = hub.mail.pop(key)
            self.virtual_wait_s += max(0.0, arrival - hub.clock[self.rank])
            hub.clock[self.rank] = max(hub.clock[self.rank], arrival)
            return tensor

    def counters(self) -> dict:
        # waits in virtual time: the real time a thread sleeps while others compute means nothing
        return super().counters() | {"wait_s": self.virtual_wait_s}

    def clock(self) -> float:
        return self.hub.clock[self.rank]

    def advance(self, seconds: float) -> None:
        """Add measured compute time to this worker's virtual clock."""
        self.hub.clock[self.rank] += seconds
