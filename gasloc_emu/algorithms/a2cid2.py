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

There are no rounds. As in the authors' code, a worker's gradient steps and its communications
run at the same time on two lanes that meet at a barrier (``Slots``: ``algo.rate_com``
communications per gradient step, their flag); each communication pairs with whichever
neighbour is free (``pairing.Pairer``). With rate R the expected Laplacian is R Lambda, so eta
scales with R and alpha~ does not (the authors' ``compute_acid_constants``). ``run.rounds``
counts the gradient steps. The same object runs in the emulator (a thread per lane) and in the
simulator (a lane per worker on its event queue); ``send_half``, ``take`` and ``mix`` split one
exchange so that the value sent, the wait and the mix can each happen at their own time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from gasloc_emu.algorithms.base import Context, PairwiseAlgorithm, Supports
from gasloc_emu.topology import Topology
from gasloc_emu.transport.base import Transport

KIND = "pair"  # the wire kind of an exchange's parameters
MAX_EXCHANGES_PER_SLOT = 8   # algo.rate_com's upper bound
MAX_STEPS_PER_SLOT = 64      # 1 / algo.rate_com's upper bound


@dataclass(frozen=True)
class Slots:
    """The barrier schedule of ``rate_com``: ``steps`` and ``exchanges`` per slot."""

    steps: int
    exchanges: int

    @classmethod
    def of(cls, rate_com: float) -> Slots:
        """R (a whole number in 1..8) or 1/m (m a whole number in 2..64); ValueError naming
        the value and the allowed ones otherwise."""
        if 1 <= rate_com <= MAX_EXCHANGES_PER_SLOT and rate_com == int(rate_com):
            return cls(1, int(rate_com))
        m = round(1 / rate_com) if rate_com > 0 else 0
        if 2 <= m <= MAX_STEPS_PER_SLOT and math.isclose(m * rate_com, 1.0, rel_tol=1e-9):
            return cls(m, 1)
        raise ValueError(f"algo.rate_com = {rate_com!r} is not allowed; expected a whole number "
                         f"1..{MAX_EXCHANGES_PER_SLOT} or 1/m with m a whole number "
                         f"2..{MAX_STEPS_PER_SLOT}")

    def count(self, steps: int) -> int:
        """Slots in a run of ``steps`` gradient steps (the last may hold fewer steps)."""
        return -(-steps // self.steps)

    def steps_in(self, slot: int, steps: int) -> int:
        """Gradient steps of slot ``slot`` in a run of ``steps``."""
        return min(self.steps, steps - slot * self.steps)

    def requests(self, steps: int) -> int:
        """Exchange requests a worker makes in a run of ``steps`` (the pairer's bound)."""
        return self.count(steps) * self.exchanges




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


def momentum_constants(topology: Topology | None, enabled: bool = True,
                       rate_com: float = 1.0) -> tuple[float, float]:
    """(eta, alpha~) a worker on this graph uses: the graph's at ``rate_com`` communications
    per unit of time, or (0, 0) with the momentum off (what the run record keeps, and what
    ``A2CiD2`` mixes with)."""
    if not enabled or topology is None:
        return 0.0, 0.0
    return acid_constants(topology.n, topology.possible_edges, rate_com)


def acid_constants(n: int, edges, rate_com: float = 1.0) -> tuple[float, float]:
    """(eta, alpha~) of the continuous momentum for this graph, with ``rate_com``
    communications per unit of time and worker (module docstring)."""
    edges = sorted(edges)
    if n < 2 or not edges:
        return 0.0, 0.0
    lap = rate_com * laplacian(n, edges)
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


class A2CiD2(PairwiseAlgorithm):
    """One worker's side: ``before_step`` / ``took_step`` around each inner step, then
    ``exchange`` with the peer the pairing gave (or nothing when it gave none)."""

    name = "a2cid2"
    supports = Supports(scenarios=False, time_budget=False)
    compressed_kinds = (KIND,)

    @classmethod
    def create(cls, ctx: Context) -> A2CiD2:
        return cls(ctx.rank, ctx.transport, ctx.topology, momentum=ctx.acfg.continuous_momentum,
                   rate_com=ctx.acfg.rate_com)

    @classmethod
    def check_settings(cls, acfg, params) -> str | None:
        """``algo.rate_com`` must be a schedule the two lanes can keep (``Slots.of``)."""
        try:
            Slots.of(acfg.rate_com)
        except ValueError as e:
            return str(e)
        return super().check_settings(acfg, params)

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
        eta, alpha_tilde = momentum_constants(topo, acfg.continuous_momentum, acfg.rate_com)
        return {"eta": eta, "alpha_tilde": alpha_tilde, "rate_com": acfg.rate_com}

    @classmethod
    def slots(cls, acfg) -> Slots:
        """The two lanes' barrier schedule, which both runners keep (``driver = "pairwise"``)."""
        return Slots.of(acfg.rate_com)

    @classmethod
    def exchange_requests(cls, acfg, steps: int) -> int:
        return Slots.of(acfg.rate_com).requests(steps)

    def __init__(self, rank: int, transport: Transport, topology: Topology | None,
                 momentum: bool = True, rate_com: float = 1.0):
        super().__init__(rank, transport, topology)
        self.eta, self.alpha_tilde = momentum_constants(topology, momentum, rate_com)
        self.x_tilde: torch.Tensor | None = None
        self.t_last = 0.0  # time of the last event, in gradient-step units
        self._before: torch.Tensor | None = None
        self._sent: tuple[int, torch.Tensor] | None = None  # (label, x_i at the send instant)

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
        """The ODE up to the pairing's time ``t``, then x_i(t) goes out and is kept until the
        mix: both sides of the event use their values at the same instant, as in the paper
        (the authors' code sends first and mixes after, so there the pair's sum of x + x~
        drifts by what the ODE moved)."""
        self.advance(theta, t)
        if self.channel is not None:
            self.channel.send(self.transport, peer, label, KIND, theta)
            return
        self._sent = (label, theta.detach().clone())
        self.transport.send(peer, label, KIND, self._sent[1])

    def take(self, peer: int, label: int) -> torch.Tensor:
        """Wait for the partner's side of exchange ``label``; the pair's difference at the
        instant both sent, x_j(t) - x_i(t) (with a channel, the edge's difference of public
        copies x^_ji - x^_ij, ``comm.channel``)."""
        if self.channel is not None:
            self.channel.receive(self.transport, peer, label, KIND)
            return self.channel.pull(peer)
        sent_label, mine = self._sent
        if sent_label != label:
            raise RuntimeError(f"worker {self.rank}: exchange {label} taken, {sent_label} sent")
        self._sent = None
        return self.transport.recv(peer, label, KIND).to(mine.device) - mine

    @torch.no_grad()
    def mix(self, theta: torch.Tensor, gap: torch.Tensor, t: float) -> None:
        """The ODE up to ``t`` (when the partner's side has arrived, as the authors mix), then
        x~ moves by alpha~ gap and x by gap / 2, each element in one in-place operation (a
        gradient lane reading x sees old or new values only). With the gap taken at the send
        instant, an update that landed on x during the transfer is kept whole; the authors'
        x <- (x + x_j) / 2 with the live x halves it, and the pair's sum with it."""
        self.advance(theta, t)
        gap = gap.to(theta.device)
        self.x_tilde.add_(gap, alpha=self.alpha_tilde)
        theta.add_(gap, alpha=0.5)

    def _state(self) -> list[torch.Tensor | None]:
        return [self.x_tilde]
