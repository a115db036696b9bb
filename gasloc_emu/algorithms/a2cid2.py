"""A2CiD2: asynchronous pairwise gossip with a continuous momentum (Nabli, Belilovsky, Oyallon,
"A2CiD2: Accelerating Asynchronous Communication in Decentralized Deep Learning", NeurIPS 2023).

Each worker i keeps its parameters x_i and a momentum variable x~_i (equal at the start). Time t
is counted in units of this worker's gradient-step time. Three kinds of event change them:

- between events, the pair follows the linear ODE of the paper's Algorithm 1 (eq. 4):
      dx = eta (x~ - x) dt,   dx~ = eta (x - x~) dt,
  whose flow over a time tau is the matrix exponential of tau [[-eta, eta], [eta, -eta]]:
      x <- (1 + e)/2 x + (1 - e)/2 x~,   x~ <- (1 - e)/2 x + (1 + e)/2 x~,   e = exp(-2 eta tau)
  (``ode_mix``); it keeps x + x~ and shrinks x - x~;
- a gradient step moves both by the same update (the inner AdamW step's, where the paper has
  -gamma grad F: ``took_step``);
- a communication with a neighbour j at time t, both sides' values taken after the ODE up to t:
      x~_i <- x~_i + alpha~ (x_j - x_i),   x_i <- (x_i + x_j) / 2       (alpha = 1/2)
  (``exchanged``).

The constants come from the graph's expected Laplacian of communications (``acid_constants``):
with one communication per gradient step, Lambda = I - D^-1 A (each worker picks among its d_i
neighbours; symmetrised as (1/d_i + 1/d_j)/2 per edge for irregular graphs), chi_1 = 1 /
lambda_2(Lambda) (its smallest non-zero eigenvalue), chi_2 = max over edges of
(1/2) (e_i - e_j)^T Lambda^+ (e_i - e_j) (the largest effective resistance), and
      eta = 1 / (2 sqrt(chi_1 chi_2)),   alpha~ = (1/2) sqrt(chi_1 / chi_2)
(the paper's Theorem 3.4 with the authors' choices). With the momentum off (eta = alpha~ = 0)
x~ never feeds back into x and this is plain asynchronous pairwise gossip (a test checks it).

There are no rounds: a worker takes a step, then pairs with whichever neighbour is free
(``pairing.Pairer``); ``run.rounds`` counts its steps. The same object runs in the emulator and
in the simulator; ``send_half``/``receive_half`` split one exchange so that the simulator's
single thread can let both sides send before either receives.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from gasloc_emu.algorithms.base import Context, OuterAlgorithm, Supports
from gasloc_emu.topology import Topology
from gasloc_emu.transport.base import Transport

KIND = "pair"  # the wire kind of an exchange's parameters


def laplacian(n: int, edges) -> np.ndarray:
    """Lambda: the expected Laplacian of one communication per unit of time and worker, each to
    a uniformly chosen neighbour; rate (1/d_i + 1/d_j)/2 on edge (i, j)."""
    deg = np.zeros(n)
    for a, b in edges:
        deg[a] += 1
        deg[b] += 1
    lap = np.zeros((n, n))
    for a, b in edges:
        rate = 0.5 * (1 / deg[a] + 1 / deg[b])
        lap[a, b] -= rate
        lap[b, a] -= rate
        lap[a, a] += rate
        lap[b, b] += rate
    return lap


def momentum_constants(topology: Topology | None, enabled: bool = True) -> tuple[float, float]:
    """(eta, alpha~) a worker on this graph uses: the graph's, or (0, 0) with the momentum off
    (what the run record keeps, and what ``A2CiD2`` mixes with)."""
    if not enabled or topology is None:
        return 0.0, 0.0
    return acid_constants(topology.n, topology.possible_edges)


def acid_constants(n: int, edges) -> tuple[float, float]:
    """(eta, alpha~) of the continuous momentum for this graph (module docstring)."""
    edges = sorted(edges)
    if n < 2 or not edges:
        return 0.0, 0.0
    lap = laplacian(n, edges)
    eig = np.linalg.eigvalsh(lap)
    chi_1 = 1.0 / eig[1]
    pinv = np.linalg.pinv(lap)
    chi_2 = max(0.5 * (pinv[a, a] + pinv[b, b] - 2 * pinv[a, b]) for a, b in edges)
    return float(0.5 / math.sqrt(chi_1 * chi_2)), float(0.5 * math.sqrt(chi_1 / chi_2))


@torch.no_grad()
def ode_mix(x: torch.Tensor, x_tilde: torch.Tensor, eta: float, tau: float) -> None:
    """Follow dx = eta (x~ - x), dx~ = eta (x - x~) for a time tau, in place (closed form of
    the 2x2 matrix exponential; a test checks it against torch.linalg.matrix_exp)."""
    if eta == 0.0 or tau <= 0.0:
        return
    e = math.exp(-2.0 * eta * tau)
    mean = (x + x_tilde).mul_(0.5)
    half_gap = (x - x_tilde).mul_(0.5 * e)
    torch.add(mean, half_gap, out=x)
    torch.sub(mean, half_gap, out=x_tilde)


class A2CiD2(OuterAlgorithm):
    """One worker's side: ``before_step`` / ``took_step`` around each inner step, then
    ``exchange`` with the peer the pairing gave (or nothing when it gave none)."""

    name = "a2cid2"
    has_rounds = False
    supports = Supports(scenarios=False, time_budget=False)
    compressed_kinds = (KIND,)

    @classmethod
    def create(cls, ctx: Context) -> A2CiD2:
        return cls(ctx.rank, ctx.transport, ctx.topology, momentum=ctx.acfg.continuous_momentum)

    @classmethod
    def refusal(cls, cfg, topo: Topology | None, scenario: bool) -> str | None:
        """No rounds for a scenario's events to happen at, one step per exchange, and a graph
        to pick partners in."""
        if topo is None or not topo.possible_edges:
            return "algo.name = a2cid2 needs a graph with at least one edge"
        return super().refusal(cfg, topo, scenario)

    @classmethod
    def wire_kinds(cls, numel: int, params) -> dict[str, tuple[int, ...]]:
        return {KIND: (numel,)}

    @classmethod
    def pairing_constants(cls, acfg, topo: Topology | None) -> dict[str, float]:
        eta, alpha_tilde = momentum_constants(topo, acfg.continuous_momentum)
        return {"eta": eta, "alpha_tilde": alpha_tilde}

    def __init__(self, rank: int, transport: Transport, topology: Topology | None,
                 momentum: bool = True):
        super().__init__(rank, transport, topology)
        self.eta, self.alpha_tilde = momentum_constants(topology, momentum)
        self.x_tilde: torch.Tensor | None = None
        self.t_last = 0.0  # time of the last event, in gradient-step units
        self._before: torch.Tensor | None = None

    def begin(self, theta: torch.Tensor) -> None:
        self.x_tilde = theta.detach().clone()

    def advance(self, theta: torch.Tensor, t: float) -> None:
        """The ODE from the last event up to time ``t`` (gradient-step units)."""
        ode_mix(theta, self.x_tilde, self.eta, t - self.t_last)
        self.t_last = max(self.t_last, t)

    def before_step(self, theta: torch.Tensor, t: float) -> None:
        """After the step's backward pass, before the optimizer moves theta (the paper mixes
        at the time of the update)."""
        self.advance(theta, t)
        self._before = theta.detach().clone()

    @torch.no_grad()
    def took_step(self, theta: torch.Tensor) -> None:
        """x~ takes the same update as x."""
        self.x_tilde.add_(theta - self._before)
        self._before = None

    def send_half(self, peer: int, label: int, theta: torch.Tensor, t: float) -> None:
        """The ODE up to the pairing's time ``t``, then x_i goes out: both sides of the event
        use their values at the same instant, as in the paper (the authors' code sends first
        and mixes after, so there the pair's sum of x + x~ drifts by what the ODE moved)."""
        self.advance(theta, t)
        if self.channel is not None:
            self.channel.send(self.transport, peer, label, KIND, theta)
            return
        self.transport.send(peer, label, KIND, theta.detach().clone())

    @torch.no_grad()
    def receive_half(self, peer: int, label: int, theta: torch.Tensor) -> None:
        """Both sides' mix: x~ moves by alpha~ (x_j - x_i), x to the pair's mean; with a
        channel, x_j - x_i is the edge's difference of public copies (``comm.channel``)."""
        if self.channel is not None:
            self.channel.receive(self.transport, peer, label, KIND)
            gap = self.channel.pull(peer).to(theta.device)
            self.x_tilde.add_(gap, alpha=self.alpha_tilde)
            theta.add_(gap, alpha=0.5)
            return
        theirs = self.transport.recv(peer, label, KIND).to(theta.device)
        self.x_tilde.add_(theirs - theta, alpha=self.alpha_tilde)
        theta.add_(theirs).mul_(0.5)

    def exchange(self, peer: int, label: int, theta: torch.Tensor, t: float) -> None:
        """One pairwise communication at time ``t`` (gradient-step units): send, receive,
        mix; the transfer's duration counts in the next interval of the ODE."""
        self.send_half(peer, label, theta, t)
        self.receive_half(peer, label, theta)

    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        raise RuntimeError("a2cid2 has no rounds: its worker loop calls exchange() after "
                           "each step (asyncloop)")

    def peers(self, round_idx: int) -> list[int]:
        return []

    def _state(self) -> list[torch.Tensor | None]:
        return [self.x_tilde]
