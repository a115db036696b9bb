"""GASLoC: local steps, an outer step whose momentum accelerates gossip, sparse peers.

Per worker i and round t (docs/ALGORITHM.md, "The update"; Cagnasso, Belilovsky, Oyallon,
arXiv 2606.11081):
    g_i = theta_i^+ - theta_i                      pseudo-gradient after H_i inner steps
    y_i = theta_i + eta * g_i                      outer proposal
    z_i = y_i + gamma * (y_i - y_i^prev)           momentum extrapolation; y_i^prev <- y_i
    theta_i <- sum_j W_t[i, j] z_j                 gossip, W_t = I - alpha * Laplacian_t
On a complete graph with W = 11^T / n this is DiLoCo with Nesterov outer SGD (lr eta, momentum
gamma); with eta = 0 it is accelerated gossip averaging.
"""
from __future__ import annotations

import torch

from ..topology import Topology
from ..transport.base import Transport
from .base import OuterAlgorithm, gossip


class GASLoC(OuterAlgorithm):
    name = "gasloc"

    def __init__(self, rank: int, transport: Transport, topology: Topology,
                 outer_lr: float, momentum: float):
        super().__init__(rank, transport, topology)
        self.eta, self.gamma = outer_lr, momentum
        self.y_prev: torch.Tensor | None = None

    def begin(self, theta: torch.Tensor) -> None:
        super().begin(theta)
        self.y_prev = theta.detach().clone()  # y^prev = theta_0, so round 0 has no momentum

    @torch.no_grad()
    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        # lerp is exact at its end points: y == theta^+ bit for bit when eta = 1, and
        # z == y when gamma = 0, so the dsgd / local-gossip special cases hold exactly.
        y = torch.lerp(self.anchor, theta, self.eta)
        z = torch.lerp(self.y_prev, y, 1.0 + self.gamma)  # y + gamma (y - y_prev)
        self.y_prev = y
        gossip(self.transport, self.topology, self.rank, round_idx, z, theta)
        self.anchor.copy_(theta)

    def _state(self) -> list[torch.Tensor | None]:
        return [self.anchor, self.y_prev]
