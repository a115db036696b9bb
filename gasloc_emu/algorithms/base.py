"""What every outer algorithm shares: the interface the worker calls, and gossip mixing."""
from __future__ import annotations

import torch

from ..topology import Topology
from ..transport.base import Transport


class OuterAlgorithm:
    """State between rounds and the outer step; never sees sockets, only a ``Transport``.

    The worker calls ``begin(theta)`` once with the flat parameter buffer, then after each inner
    phase ``outer_step(t, theta)``: ``theta`` holds the inner result on entry and the next
    round's starting point on exit (modified in place).
    """

    name = "base"

    def __init__(self, rank: int, transport: Transport, topology: Topology | None):
        self.rank, self.transport, self.topology = rank, transport, topology
        self.anchor: torch.Tensor | None = None  # theta at the start of the inner phase

    def begin(self, theta: torch.Tensor) -> None:
        self.anchor = theta.detach().clone()

    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        raise NotImplementedError

    def finish(self, theta: torch.Tensor) -> None:
        """After the last round: complete what is still in flight (an overlapped algorithm's
        last exchange) so that ``theta`` is the final model; nothing here."""

    def peers(self, round_idx: int) -> list[int]:
        """The workers this one exchanges with in round ``round_idx``."""
        return self.topology.peers(self.rank, round_idx) if self.topology else []

    def handover(self) -> dict[str, torch.Tensor]:
        """What a joiner takes over from its donor besides theta, by message kind: nothing
        here (a gossip worker's outer state is its own; docs/ALGORITHM.md, "Churn")."""
        return {}

    def take_over(self, state: dict[str, torch.Tensor]) -> None:
        """A joiner's side of ``handover``, after ``begin``."""

    def state_bytes(self) -> int:
        """Model-sized buffers this algorithm keeps between rounds (for memory reports)."""
        return sum(t.numel() * t.element_size() for t in self._state() if t is not None)

    def _state(self) -> list[torch.Tensor | None]:
        return [self.anchor]


@torch.no_grad()
def lagged_outer_step(theta: torch.Tensor, start: torch.Tensor, mixed: torch.Tensor,
                      y_prev: torch.Tensor, eta: float, gamma: float,
                      weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, z) of an overlapped round (docs/ALGORITHM.md, "Overlap"): the inner result
    ``theta`` started from ``start`` (this worker's z of the round before), and the mix of
    that round's z landed as ``mixed``; y = m + eta w (theta^+ - start), z = y + gamma (y -
    y_prev). ``theta`` is overwritten (with m + w g on the way)."""
    theta.sub_(start)
    if weight != 1.0:
        theta.mul_(weight)
    theta.add_(mixed)                                   # the correction m - z, applied
    y = torch.lerp(mixed, theta, eta)
    return y, torch.lerp(y_prev, y, 1.0 + gamma)


@torch.no_grad()
def gossip(tp: Transport, topo: Topology, rank: int, round_idx: int, z: torch.Tensor,
           out: torch.Tensor) -> None:
    """Send ``z`` to this round's neighbours and write sum_j W[i, j] z_j into ``out``.

    ``z`` is handed over to the transport (ownership rule) and must not be ``out``.
    """
    gossip_send(tp, topo, rank, round_idx, z)
    gossip_mix(tp, topo, rank, round_idx, z, out)


def gossip_send(tp: Transport, topo: Topology, rank: int, round_idx: int,
                z: torch.Tensor) -> None:
    """The first half of ``gossip``: ``z`` to every neighbour of round ``round_idx``."""
    for j in topo.peers(rank, round_idx):
        tp.send(j, round_idx, "z", z)


@torch.no_grad()
def gossip_mix(tp: Transport, topo: Topology, rank: int, round_idx: int, z: torch.Tensor,
               out: torch.Tensor) -> None:
    """The second half: receive the neighbours' z of round ``round_idx`` and write
    sum_j W[i, j] z_j into ``out``, self first, then peers in increasing rank, so every
    transport gives the same bits (``z`` is this worker's own, as sent)."""
    peers = topo.peers(rank, round_idx)
    self_w, weights = topo.row(rank, round_idx)
    received = {j: tp.recv(j, round_idx, "z") for j in peers}
    torch.mul(z, self_w, out=out)
    for j in peers:
        out.add_(received[j].to(out.device, non_blocking=True), alpha=weights[j])
