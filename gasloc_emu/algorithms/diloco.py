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

A host lost without warning (``scenario.hostloss``, ``run.on_worker_loss = continue``), as
torchft's fault-tolerant DiLoCo does it (pytorch/torchft, torchft/local_sgd.py, class DiLoCo:
"if any error occurs during the DiLoCo step, the step will be discarded and the model
parameters will reset back to the last time DiLoCo synchronized"; the quorum then shrinks and
the next step goes on): until the round L node 0 fixed the loss at, the lost workers are on
the ring but dead; a chunk a survivor waits for from them stands as NaN and the ring goes on
(``transport.base.ring_all_reduce_sum``), so a survivor whose mean holds the gap does not
commit the round: anchor and momentum stay, theta goes back to the anchor (``uncommitted``,
in its row). Which survivors got a whole mean depends on when the host died (one killed
between its last two all-gather sends leaves the gap with its successor alone), so in round
L, the first on the survivors' ring, they first merge their states as after a partition
(``heals(L)``), then go on as after a leave.

Overlapped (``overlap = 1``; docs/ALGORITHM.md, "Overlapped DiLoCo"): the outer step is written
in GASLoC's form on the complete graph (lr = eta, mu = gamma; at overlap 0 the two are the
same iterates, a test checks it), and the All-Reduce that replaces gossip runs in the
background during the next round's inner steps, landing one round late:
    y_i = m + lr * w_i g_i,  g_i = theta_i^+ - z_i     drift from where this round started
    z_i = y_i + mu * (y_i - y_i^prev)                 All-Reduced during the next round
    m <- mean_j z_j                                    (m = theta_0 in round 0)
so a worker starts each round from its own outer step on its own drift, and the others'
drifts reach it one round late: the eager-update idea of Kale et al. (2025) with the own drift
standing in for the round's mean, and the overlapped All-Reduce of Streaming DiLoCo
(Douillard et al., 2025). The plain one-round delay (every worker waits for the mean before
moving at all) diverged here with lr 0.7, mu 0.9; docs/ALGORITHM.md gives the numbers.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection

import torch

from gasloc_emu.algorithms.base import (
    Context,
    Message,
    OuterAlgorithm,
    Supports,
    lagged_outer_step,
)
from gasloc_emu.algorithms.outer import momentum_value, outer_constants
from gasloc_emu.topology import Topology
from gasloc_emu.transport.base import Transport, gap_free, ring_steps

OUTER, HEAL = "outer", "heal"   # message kinds: a joiner's buffer; a member's state at a heal


def wire_kinds(numel: int) -> dict[str, tuple[int]]:
    """DiLoCo's messages besides the ring's and the join's, with their one shape each."""
    return {OUTER: (numel,), HEAL: (2 * numel,)}


@torch.no_grad()
def nesterov_step(anchor: torch.Tensor, buf: torch.Tensor | None, delta: torch.Tensor,
                  lr: float, mu: float) -> torch.Tensor:
    """torch.optim.SGD(lr, momentum mu, nesterov=True) on ``anchor`` (in place) with the
    gradient ``delta``; returns the momentum buffer (``delta`` itself on the first step, None
    ``buf``). Any shape: one worker's flat vector, or the consensus surrogate's."""
    if buf is None:
        buf = delta.clone()
    else:
        buf.mul_(mu).add_(delta)
    anchor.add_(delta.add(buf, alpha=mu), alpha=-lr)
    return buf


class DiLoCo(OuterAlgorithm):
    name = "diloco"
    checkpoint_state = ("anchor", "buf", "y_prev")
    needs_graph = False          # its peers are the ring All-Reduce's
    shows = ("gamma", "eta")
    supports = Supports(overlap=True)
    compressed_kinds = ()        # its ring's messages only (``reduce``)
    handover_kinds = (OUTER,)    # a joiner takes the shared momentum over

    @classmethod
    def create(cls, ctx: Context) -> DiLoCo:
        acfg = ctx.acfg
        return cls(ctx.rank, ctx.transport, acfg.outer_lr, momentum_value(acfg, None),
                   ctx.weight, ctx.members, ctx.heals, acfg.overlap, ctx.survives_loss)

    @classmethod
    def check_settings(cls, acfg, params) -> str | None:
        if isinstance(acfg.momentum, str):
            return (f"algo.momentum = {acfg.momentum!r} needs a gossip graph; diloco takes a "
                    "number in [0, 0.999]")
        return super().check_settings(acfg, params)

    @classmethod
    def constants(cls, acfg, topo: Topology | None) -> dict[str, float]:
        return outer_constants(acfg, None)

    @classmethod
    def wire_kinds(cls, numel: int, params) -> dict[str, tuple[int, ...]]:
        return wire_kinds(numel)

    @classmethod
    def reduces_in_background(cls, acfg) -> bool:
        return bool(acfg.overlap)

    @classmethod
    def weights_by_steps(cls, acfg) -> bool:
        return acfg.pseudo_grad_mean == "steps"

    @classmethod
    def groups_all_reduce(cls) -> bool:
        return True

    @classmethod
    def scenario_refusal(cls, cfg, churns: bool) -> str | None:
        if churns and cls.weights_by_steps(cfg.algo):
            return ("workers leave or join, and algo.pseudo_grad_mean = 'steps' weights every "
                    "worker by a share of all of them; use 'plain' with a scenario that changes "
                    "membership")
        return None

    @classmethod
    def host_loss_refusal(cls, cfg) -> str | None:
        """The plain ring goes on after a lost host (the module docstring's "A host lost");
        a compressed ring's error feedback would carry the lost chunk's gap (NaN) in every
        worker's residual into every later round."""
        if cfg.comm.codec != "none":
            return (f"comm.codec = {cfg.comm.codec!r}: each worker's error-feedback residual "
                    "would keep the lost workers' gap in every later round; use 'none'")
        return None

    def __init__(self, rank: int, transport: Transport, outer_lr: float, momentum: float,
                 weight: float = 1.0, members: Callable[[int], Collection[int]] | None = None,
                 heals: Callable[[int], bool] | None = None, overlap: int = 0,
                 survives_loss: bool = False):
        super().__init__(rank, transport, None)
        self.survives_loss = survives_loss   # a round's mean may hold a lost host's gap
        if overlap not in (0, 1):
            raise ValueError(f"overlap = {overlap!r} is out of range; expected 0 or 1")
        self.overlap = overlap
        self.pending = None  # overlap 1: the All-Reduce of z in flight (a PendingReduce)
        self.y_prev: torch.Tensor | None = None
        self.members, self.heals = members, heals
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight = {weight!r} is out of range; expected a finite number > 0")
        self.lr, self.mu, self.weight = outer_lr, momentum, weight
        self.buf: torch.Tensor | None = None

    @torch.no_grad()
    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        if self.overlap:
            self._overlapped_step(round_idx, theta)
            return
        drift = self.anchor - theta
        if self.weight != 1.0:  # the plain mean stays bit for bit what it was
            drift.mul_(self.weight)
        if self.heals is not None and self.heals(round_idx):
            self._heal(round_idx)
        mean = self.transport.all_reduce_mean(round_idx, drift, self._ring(round_idx),
                                              self.reduce())
        self.uncommitted = self.survives_loss and not gap_free(mean)
        if not self.uncommitted:   # else torchft's failed commit: back to the last mean
            self._step(mean)
        theta.copy_(self.anchor)

    def exchange(self, round_idx: int, last: bool, codec) -> list[Message] | None:
        """The ring All-Reduce of the round (the all-gather alone for a codec that does not
        sum); None where it is not declared: overlap (a background lane) and heals."""
        if self.overlap or (self.heals is not None and self.heals(round_idx)):
            return None
        ring = self._ring(round_idx) or list(range(self.transport.world_size))
        gather = codec is not None and not codec.summable
        return [Message(peer, round_idx, kind, sends)
                for peer, kind, sends in ring_steps(ring, self.rank, gather)]

    def _step(self, delta: torch.Tensor) -> None:
        """Outer Nesterov SGD on the anchor with the mean pseudo-gradient ``delta``."""
        self.buf = nesterov_step(self.anchor, self.buf, delta, self.lr, self.mu)

    def begin(self, theta: torch.Tensor) -> None:
        super().begin(theta)
        if self.overlap:
            self.y_prev = theta.detach().clone()  # as GASLoC's: no momentum in round 0

    def _overlapped_step(self, round_idx: int, theta: torch.Tensor) -> None:
        """The module docstring's overlapped update; ``anchor`` is z of the previous round."""
        self.y_prev, z = lagged_outer_step(theta, self.anchor, self._land(), self.y_prev,
                                           self.lr, self.mu, self.weight)
        self.anchor.copy_(z)  # before the All-Reduce takes z over (it sums into it in place)
        theta.copy_(z)
        self.pending = self.transport.start_all_reduce_mean(round_idx, z, self._ring(round_idx),
                                                            self.reduce())

    def _land(self) -> torch.Tensor:
        """The mean z of the round in flight (waiting for it); theta_0 in round 0."""
        if self.pending is None:
            return self.anchor.clone()
        pending, self.pending = self.pending, None
        return pending.wait()

    @torch.no_grad()
    def finish(self, theta: torch.Tensor) -> None:
        """The last round's mean, which overlap left in flight: every worker ends on it."""
        if self.pending is not None:
            theta.copy_(self._land())
            self.anchor.copy_(theta)

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
        return [self.anchor, self.buf, self.y_prev]
