"""DiLoCo: local AdamW steps, then outer Nesterov SGD on the All-Reduced pseudo-gradient.

Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models" (2023).
The outer step is torch.optim.SGD(lr, momentum, nesterov=True) written out on flat tensors:
    delta = mean_i w_i (theta - theta_i^+) (a real ring All-Reduce over the transport)
    buf = mu * buf + delta                 (buf = delta on the first round)
    theta <- theta - lr * (delta + mu * buf)
w_i = 1 is DiLoCo's plain mean (``algo.pseudo_grad_mean = plain``); with ``steps``,
w_i = n * H_i / sum_j H_j, so the mean weights each worker's drift by its share of the round's
inner steps (docs/ALGORITHM.md, "Unequal H_i").

When workers leave and join (a scenario), ``members(t)`` gives the living workers of round t:
the ring All-Reduce re-forms over them and the mean divides by their number, as elastic DiLoCo
implementations do (torchft's and prime's), so a departed worker's drift is simply missing.
DiLoCo's outer state is one state shared by every worker (the same theta and momentum buffer
everywhere), so a joiner takes both over from its donor (``handover``/``take_over``), as
torchft's live recovery hands a new replica the optimizer state with the model. During a
partition ``members`` is this worker's (``World.ring_members(rank)``): each group all-reduces
over its own living members, and the groups' states drift apart. When the links come back
(``heals(t)``), the ring first averages the states (theta and buffer, in rank order, so every
worker gets the same bits), then takes the round's step from that one state again.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection

import torch

from ..transport.base import Transport
from .base import OuterAlgorithm

OUTER, HEAL = "outer", "heal"   # message kinds: a joiner's buffer; a member's state at a heal


def wire_kinds(numel: int) -> dict[str, tuple[int]]:
    """DiLoCo's messages besides the ring's and the join's, with their one shape each."""
    return {OUTER: (numel,), HEAL: (2 * numel,)}


class DiLoCo(OuterAlgorithm):
    name = "diloco"

    def __init__(self, rank: int, transport: Transport, outer_lr: float, momentum: float,
                 weight: float = 1.0, members: Callable[[int], Collection[int]] | None = None,
                 heals: Callable[[int], bool] | None = None):
        super().__init__(rank, transport, None)
        self.members, self.heals = members, heals
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight = {weight!r} is out of range; expected a finite number > 0")
        self.lr, self.mu, self.weight = outer_lr, momentum, weight
        self.buf: torch.Tensor | None = None

    @torch.no_grad()
    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        drift = self.anchor - theta
        if self.weight != 1.0:  # the plain mean stays bit for bit what it was
            drift.mul_(self.weight)
        if self.heals is not None and self.heals(round_idx):
            self._heal(round_idx)
        delta = self.transport.all_reduce_mean(round_idx, drift, self._ring(round_idx))
        if self.buf is None:
            self.buf = delta.clone()
        else:
            self.buf.mul_(self.mu).add_(delta)
        self.anchor.add_(delta.add(self.buf, alpha=self.mu), alpha=-self.lr)
        theta.copy_(self.anchor)

    def _heal(self, round_idx: int) -> None:
        """After a partition: the mean of the ring's states, summed in rank order (the same
        bits on every worker); each member sends its state to every other (``HEAL``)."""
        ring = self._ring(round_idx) or list(range(self.transport.world_size))
        mine = torch.cat([self.anchor, self._buf_or_zeros()])
        for peer in ring:
            if peer != self.rank:
                self.transport.send(peer, round_idx, HEAL, mine)
        total = torch.zeros_like(mine)
        for peer in ring:
            total.add_(mine if peer == self.rank else self.transport.recv(peer, round_idx, HEAL))
        total.div_(len(ring))
        n = self.anchor.numel()
        self.anchor.copy_(total[:n])
        self.buf = total[n:].clone()

    def _buf_or_zeros(self) -> torch.Tensor:
        """The momentum buffer; zeros before the first step (mu * 0 + delta = delta exactly, so
        a zero buffer takes the same first step as none)."""
        return self.buf if self.buf is not None else torch.zeros_like(self.anchor)

    def handover(self) -> dict[str, torch.Tensor]:
        """What a joiner needs besides theta: the momentum buffer."""
        return {OUTER: self._buf_or_zeros().clone()}

    def take_over(self, state: dict[str, torch.Tensor]) -> None:
        self.buf = state[OUTER].clone()

    def _ring(self, round_idx: int) -> list[int] | None:
        """The living workers of the round, in rank order; None when all of them live (the
        full ring, bit for bit as without a scenario)."""
        if self.members is None:
            return None
        ring = sorted(self.members(round_idx))
        return None if len(ring) == self.transport.world_size else ring

    def peers(self, round_idx: int) -> list[int]:
        ring = self._ring(round_idx) or list(range(self.transport.world_size))
        k, n = ring.index(self.rank), len(ring)
        return sorted({ring[(k - 1) % n], ring[(k + 1) % n]} - {self.rank})

    def _state(self) -> list[torch.Tensor | None]:
        return [self.anchor, self.buf]
