"""One worker's compressed communication: the codec, and the state that keeps it unbiased.

Gossip compresses the difference to a public copy (CHOCO-gossip, Koloskova, Stich & Jaggi,
ICML 2019): for every directed edge i -> j both ends keep the same copy x^_ij of what i sent,
starting from theta_0 (every worker starts there). Worker i sends q = Q(z_i - x^_ij) and both
ends add decode(q) to x^_ij. The mix replaces the neighbours' z by the copies, in the form that
keeps the average:
    theta_i = z_i + s * sum_j W[i, j] (x^_ji - x^_ij)
With a symmetric W the terms cancel in the sum over workers, so compression does not move the
average; with an exact codec x^ = z and s = 1 this is sum_j W[i, j] z_j. The copies are kept per
edge, not per worker as in the paper, so that graphs that change every round (random matchings)
keep sender and receiver in step: a copy moves only when a message on its edge does. ``s`` is
CHOCO's consensus step (``comm.gossip_step``); aggressive codecs need it below 1.

The All-Reduce keeps an error-feedback residual instead (``comm.reduce``).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from gasloc_emu.comm.codecs import Codec
from gasloc_emu.comm.reduce import gather_sum, message_salt, ring_sum


class Channel:
    """The codec with one worker's copies and residual. ``start``: theta_0, the copies' common
    starting point; ``gossip_step``: s above, in (0, 1]; ``feedback_decay``: what the ring's
    residual is multiplied by each round, in [0, 1] (1: error feedback loses nothing; below 1,
    SparseLoCo's decayed accumulator, Sarfi et al. 2025)."""

    def __init__(self, codec: Codec, start: torch.Tensor, gossip_step: float = 1.0,
                 feedback_decay: float = 1.0):
        if not 0 < gossip_step <= 1:
            raise ValueError(f"gossip_step = {gossip_step!r} is out of range; expected a number "
                             "in (0, 1]")
        if not 0 <= feedback_decay <= 1:
            raise ValueError(f"feedback_decay = {feedback_decay!r} is out of range; expected a "
                             "number in [0, 1]")
        self.codec, self.step, self.decay = codec, gossip_step, feedback_decay
        self.start = start.detach().cpu().clone()
        self.sent: dict[int, torch.Tensor] = {}      # x^_ij: peer j's copy of this worker
        self.received: dict[int, torch.Tensor] = {}  # x^_ji: this worker's copy of peer j
        self.residual: torch.Tensor | None = None    # the All-Reduce's error feedback

    # -- gossip: the difference to the public copy
    def send(self, tp, peer: int, label: int, kind: str, x: torch.Tensor) -> None:
        """``x`` to ``peer`` as a frame of its difference to the edge's copy; the copy moves."""
        copy = self._copy(self.sent, peer)
        values = x.detach().to("cpu", torch.float32)
        frame = self.codec.encode(values - copy, message_salt(label, tp.rank, peer))
        copy.add_(self.codec.decode(frame, copy.numel()))
        tp.send(peer, label, kind, frame, raw_nbytes=4 * copy.numel())

    def receive(self, tp, peer: int, label: int, kind: str) -> None:
        """``peer``'s frame: its copy here moves as it did there."""
        copy = self._copy(self.received, peer)
        copy.add_(self.codec.decode(tp.recv(peer, label, kind), copy.numel()))

    def pull(self, peer: int) -> torch.Tensor:
        """x^_ji - x^_ij: what the edge to ``peer`` adds to this worker (times its weight)."""
        return self._copy(self.received, peer) - self._copy(self.sent, peer)

    @torch.no_grad()
    def mix(self, tp, peers: Sequence[int], weights: dict[int, float], label: int, kind: str,
            z: torch.Tensor, out: torch.Tensor) -> None:
        """Receive every peer's frame of round ``label``, then ``out`` = z + s sum_j W[i, j]
        (x^_ji - x^_ij), peers in increasing rank (the same bits in every transport)."""
        for j in peers:
            self.receive(tp, j, label, kind)
        out.copy_(z)
        for j in sorted(peers):
            out.add_(self.pull(j).to(out.device, non_blocking=True),
                     alpha=self.step * weights[j])

    def _copy(self, table: dict[int, torch.Tensor], peer: int) -> torch.Tensor:
        if peer not in table:
            table[peer] = self.start.clone()
        return table[peer]

    # -- the All-Reduce: error feedback on every compressed message
    def ring_sum(self, tp, round_idx: int, tensor: torch.Tensor,
                 members: Sequence[int] | None) -> torch.Tensor:
        """The ring's sum with this codec (``comm.reduce``); ``transport.all_reduce_mean``'s
        ``reduce``."""
        if self.residual is None:
            self.residual = torch.zeros(tensor.numel())
        elif self.decay != 1.0:
            self.residual.mul_(self.decay)  # each chunk's residual is used once a round
        values = tensor.detach().to("cpu", torch.float32)
        reduce = ring_sum if self.codec.summable else gather_sum
        return reduce(tp, round_idx, values, members, self.codec,
                      self.residual).to(tensor.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The copies and the residual, for a checkpoint: ``start``, ``sent.J``,
        ``received.J``, ``residual``."""
        out = {"start": self.start.clone()}
        out |= {f"sent.{j}": t.clone() for j, t in self.sent.items()}
        out |= {f"received.{j}": t.clone() for j, t in self.received.items()}
        if self.residual is not None:
            out["residual"] = self.residual.clone()
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.start = state["start"].clone()
        self.sent = {int(k.split(".")[1]): v.clone() for k, v in state.items()
                     if k.startswith("sent.")}
        self.received = {int(k.split(".")[1]): v.clone() for k, v in state.items()
                         if k.startswith("received.")}
        self.residual = state["residual"].clone() if "residual" in state else None

    def state_bytes(self) -> int:
        """Model-sized buffers kept for compression (memory reports)."""
        tensors = [*self.sent.values(), *self.received.values(), self.start]
        if self.residual is not None:
            tensors.append(self.residual)
        return sum(t.numel() * t.element_size() for t in tensors)
