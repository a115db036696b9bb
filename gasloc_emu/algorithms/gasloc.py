"""GASLoC: local steps, an outer step whose momentum accelerates gossip, sparse peers.

Per worker i and round t (docs/ALGORITHM.md, "The update"; Cagnasso, Belilovsky, Oyallon,
arXiv 2606.11081):
    g_i = theta_i^+ - theta_i                      pseudo-gradient after H_i inner steps
    y_i = theta_i + eta * g_i                      outer proposal
    z_i = y_i + gamma * (y_i - y_i^prev)           momentum extrapolation; y_i^prev <- y_i
    theta_i <- sum_j W_t[i, j] z_j                 gossip, W_t = I - alpha * Laplacian_t
On a complete graph with W = 11^T / n this is DiLoCo with Nesterov outer SGD (lr eta, momentum
gamma); with eta = 0 it is accelerated gossip averaging.

Overlapped (``overlap = 1``; docs/ALGORITHM.md, "Overlapped GASLoC"): z_i leaves at the end of
round t and the inner phase of round t+1 starts from z_i at once; at the end of round t+1 the
neighbours' z of round t are mixed in, as the correction sum_j W_t[i, j] z_j - z_i added to the
inner result, before the outer step of round t+1:
    g_i = theta_i^+ - z_i^{t}                     drift of round t+1, started from z_i^t
    y_i = m_i + eta * g_i,  m_i = sum_j W_t[i, j] z_j^t   (m_i = theta_0 in round 0)
    z_i^{t+1} = y_i + gamma * (y_i - y_i^prev)    sent; round t+2 starts from it
The only difference from overlap 0 is where g_i is evaluated (z_i instead of m_i); after the
last round ``finish`` mixes the last z. Stable for W with no negative eigenvalue (the config
refuses others): docs/ALGORITHM.md derives why.
"""
from __future__ import annotations

import math

import torch

from gasloc_emu.algorithms.base import (
    Context,
    Message,
    OuterAlgorithm,
    Supports,
    gossip,
    gossip_messages,
    gossip_mix,
    gossip_send,
    lagged_outer_step,
)
from gasloc_emu.algorithms.outer import momentum_value, outer_constants, outer_lr_value
from gasloc_emu.topology import Topology
from gasloc_emu.transport.base import Transport


@torch.no_grad()
def outer_proposal(anchor: torch.Tensor, theta: torch.Tensor, y_prev: torch.Tensor, eta: float,
                   gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, z) of a round without overlap: y = anchor + eta (theta^+ - anchor), z = y + gamma
    (y - y_prev), in fresh tensors. Elementwise, so one worker's flat vector and a stack of
    all workers' (the consensus surrogate, ``experiments/consensus.py``) take the same rule.
    lerp is exact at its end points: y == theta^+ bit for bit when eta = 1, and z == y when
    gamma = 0, so the dsgd / local-gossip special cases hold exactly."""
    y = torch.lerp(anchor, theta, eta)
    return y, torch.lerp(y_prev, y, 1.0 + gamma)


class GASLoC(OuterAlgorithm):
    name = "gasloc"
    checkpoint_state = ("anchor", "y_prev")
    shows = ("gamma", "eta")
    supports = Supports(overlap=True)

    @classmethod
    def create(cls, ctx: Context) -> GASLoC:
        topo, acfg = ctx.topology, ctx.acfg
        return cls(ctx.rank, ctx.transport, topo, outer_lr_value(acfg, topo),
                   momentum_value(acfg, topo), acfg.overlap)

    @classmethod
    def check_settings(cls, acfg, params) -> str | None:
        """Any outer lr the config takes, '1-momentum' (eta = 1 - gamma) included."""
        return cls.overlap_refusal(acfg)

    @classmethod
    def constants(cls, acfg, topo: Topology | None) -> dict[str, float]:
        return outer_constants(acfg, topo)

    @classmethod
    def warnings(cls, cfg, topo: Topology | None) -> tuple[str, ...]:
        """The outer momentum accelerates gossip only below the stability edge of its two-term
        recursion on W's spectrum (docs/ALGORITHM.md, "gamma*"); past it a mode grows every
        round."""
        gamma = momentum_value(cfg.algo, topo)
        growth = topo.momentum_growth(gamma)
        if growth < 1.0 - 1e-9:
            return ()
        return (f"algo.momentum = {gamma:g} makes gossip on this {topo.name} graph unstable "
                f"(a mode grows {growth:.3f}x per round); gamma* = {topo.gamma_star:.3f} is "
                "stable",)

    @classmethod
    def refusal(cls, cfg, topo: Topology | None, scenario: bool) -> str | None:
        """Overlapped GASLoC takes the inner phase's drift at the unmixed z; on a W with a
        negative eigenvalue mu that drift adds to mu's sign flip and, with outer momentum, a
        disagreement grows every round (docs/ALGORITHM.md, "Overlapped GASLoC": stable when W
        has no negative eigenvalue)."""
        if not cfg.algo.overlap or topo is None:
            return super().refusal(cfg, topo, scenario)
        low = topo.min_eigenvalue()
        if low >= -1e-12:
            return super().refusal(cfg, topo, scenario)
        return (f"algo.overlap = 1 needs gossip weights with no negative eigenvalue (W >= 0); "
                f"this {topo.name} graph's W has {low:.3f} at algo.alpha = {topo.alpha:g}; set "
                f"algo.alpha <= {math.floor(topo.lazy_alpha() * 1000) / 1000:g}")

    def __init__(self, rank: int, transport: Transport, topology: Topology,
                 outer_lr: float, momentum: float, overlap: int = 0):
        super().__init__(rank, transport, topology)
        if overlap not in (0, 1):
            raise ValueError(f"overlap = {overlap!r} is out of range; expected 0 or 1")
        self.eta, self.gamma, self.overlap = outer_lr, momentum, overlap
        self.y_prev: torch.Tensor | None = None
        # overlap 1: this worker's z in flight (as sent, read-only) and its round
        self.sent: torch.Tensor | None = None
        self.sent_round: int | None = None

    def begin(self, theta: torch.Tensor) -> None:
        super().begin(theta)
        self.y_prev = theta.detach().clone()  # y^prev = theta_0, so round 0 has no momentum

    @torch.no_grad()
    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        if self.overlap:
            self._overlapped_step(round_idx, theta)
            return
        y, z = outer_proposal(self.anchor, theta, self.y_prev, self.eta, self.gamma)
        self.y_prev = y
        gossip(self.transport, self.topology, self.rank, round_idx, z, theta, self.channel)
        self.anchor.copy_(theta)

    def exchange(self, round_idx: int, last: bool, codec) -> list[Message]:
        """Overlap 0: the round's gossip; overlap 1: the previous round's receives
        (``_land``), then this round's sends, and after the last round its receives."""
        topo, rank = self.topology, self.rank
        if not self.overlap:
            return gossip_messages(topo, rank, round_idx)
        landed = gossip_messages(topo, rank, round_idx - 1, send=False) if round_idx else []
        tail = gossip_messages(topo, rank, round_idx, send=False) if last else []
        return landed + gossip_messages(topo, rank, round_idx, receive=False) + tail

    def _overlapped_step(self, round_idx: int, theta: torch.Tensor) -> None:
        """The outer step of round ``round_idx`` with the previous round's gossip landing now
        (see the module docstring); ``anchor`` is z of the previous round, where this round's
        inner phase started."""
        mixed = self._land(theta)
        self.y_prev, z = lagged_outer_step(theta, self.anchor, mixed, self.y_prev, self.eta,
                                           self.gamma)
        gossip_send(self.transport, self.topology, self.rank, round_idx, z, self.channel)
        self.sent, self.sent_round = z, round_idx
        self.anchor.copy_(z)
        theta.copy_(z)

    def _land(self, like: torch.Tensor) -> torch.Tensor:
        """m_i = sum_j W[i, j] z_j of the round in flight, in a fresh tensor; the anchor (theta_0)
        when nothing is in flight (round 0)."""
        if self.sent is None:
            return self.anchor.clone()
        mixed = torch.empty_like(like)
        gossip_mix(self.transport, self.topology, self.rank, self.sent_round, self.sent, mixed,
                   self.channel)
        self.sent, self.sent_round = None, None
        return mixed

    @torch.no_grad()
    def finish(self, theta: torch.Tensor) -> None:
        """Mix the last round's z in: the final model is sum_j W[i, j] z_j, as without overlap."""
        if self.sent is not None:
            theta.copy_(self._land(theta))
            self.anchor.copy_(theta)

    def _state(self) -> list[torch.Tensor | None]:
        return [self.anchor, self.y_prev, self.sent]
