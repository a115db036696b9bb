"""DiLoCo: local AdamW steps, then outer Nesterov SGD on the All-Reduced pseudo-gradient.

Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models" (2023).
The outer step is torch.optim.SGD(lr, momentum, nesterov=True) written out on flat tensors:
    delta = mean_i (theta - theta_i^+)     (a real ring All-Reduce over the transport)
    buf = mu * buf + delta                 (buf = delta on the first round)
    theta <- theta - lr * (delta + mu * buf)
"""
from __future__ import annotations

import torch

from ..transport.base import Transport
from .base import OuterAlgorithm


class DiLoCo(OuterAlgorithm):
    name = "diloco"

    def __init__(self, rank: int, transport: Transport, outer_lr: float, momentum: float):
        super().__init__(rank, transport, None)
        self.lr, self.mu = outer_lr, momentum
        self.buf: torch.Tensor | None = None

    @torch.no_grad()
    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        delta = self.transport.all_reduce_mean(round_idx, self.anchor - theta)
        if self.buf is None:
            self.buf = delta.clone()
        else:
            self.buf.mul_(self.mu).add_(delta)
        self.anchor.add_(delta.add(self.buf, alpha=self.mu), alpha=-self.lr)
        theta.copy_(self.anchor)

    def peers(self, round_idx: int) -> list[int]:
        n = self.transport.world_size
        return sorted({(self.rank - 1) % n, (self.rank + 1) % n} - {self.rank})

    def _state(self) -> list[torch.Tensor | None]:
        return [self.anchor, self.buf]
