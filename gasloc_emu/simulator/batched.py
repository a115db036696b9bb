"""The simulator's batched inner phase: every worker's AdamW steps as one computation.

When the workers share a model (they always do: one ``model.preset``), their inner phases differ
only in the parameters, the optimizer state and the batches. This module stacks them: the
parameters as rows of one (N, P) tensor, the forward and backward pass as one call of the model
over the rows (``torch.func.vmap`` of ``functional_call``), gradient clipping per row, and AdamW
(Loshchilov & Hutter 2019, Algorithm 2, with PyTorch's bias corrections) on the stacked state.
A worker's batches come from its own shard in the order its per-worker inner phase would draw
them, so the two paths differ only in the order floating-point sums are taken (the agreement is
tested to 1e-4 relative in the final loss); the per-worker path (``sim.batched = false``) stays
the reference, and the one that equals ``run`` to the bit.

The worker threads of ``simulate`` meet at each round's inner phase (a ``BatchedInner`` gate):
the last to arrive computes every worker's phase, and each goes on with its own outer step. A
round's sends all happen before its senders reach the next round's gate, so the gate cannot
deadlock the gossip.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch.func import functional_call, vmap

from gasloc_emu.simulator import stacked_gpt
from gasloc_emu.training import compute, recipe
from gasloc_emu.transport.base import TransportError


class StackedAdamW:
    """AdamW over rows of a stacked flat parameter tensor, one row per worker.

    Each row is updated exactly as ``torch.optim.AdamW`` (single-tensor path) updates one
    worker's flat parameters: decoupled weight decay where ``decay_mask`` says
    (``training.recipe.decays``, as ``training.worker.make_optimizer`` groups them), then the
    moment updates and the bias-corrected step. Rows keep their own step count, so workers
    with different H_i stay exact.
    """

    def __init__(self, rows: int, decay_mask: torch.Tensor, icfg):
        self.lr, self.beta1, self.beta2, self.eps = icfg.lr, icfg.beta1, icfg.beta2, 1e-8
        self.decay = decay_mask * icfg.weight_decay          # (P,) per-element weight decay
        self.m = torch.zeros(rows, decay_mask.numel(), dtype=decay_mask.dtype,
                             device=decay_mask.device)
        self.v = torch.zeros_like(self.m)
        self.steps = [0] * rows

    def step(self, rows: torch.Tensor, theta: torch.Tensor, grad: torch.Tensor,
             lrs: list[float] | None = None) -> None:
        """Update ``theta`` (the parameters of ``rows``, in place) with their gradients;
        ``lrs``: each row's lr of this step (an lr schedule), else the constant lr."""
        every = rows.numel() == self.m.shape[0]  # the usual case: no gather, no scatter
        m, v = (self.m, self.v) if every else (self.m[rows], self.v[rows])
        for r in rows.tolist():
            self.steps[r] += 1
        step = torch.tensor([self.steps[r] for r in rows.tolist()], dtype=theta.dtype,
                            device=theta.device)[:, None]
        lr = self.lr if lrs is None else torch.tensor(lrs, dtype=theta.dtype,
                                                      device=theta.device)[:, None]
        theta.mul_(1 - lr * self.decay)
        m.lerp_(grad, 1 - self.beta1)
        v.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        step_size = lr / (1 - self.beta1 ** step)
        denom = (v.sqrt() / (1 - self.beta2 ** step).sqrt()).add_(self.eps)
        theta.addcmul_(m / denom, step_size, value=-1.0)
        if not every:
            self.m[rows], self.v[rows] = m, v


@dataclass
class _Arrival:
    """One worker at a round's gate: itself, and what the batched phase hands back to it."""

    worker: object
    loss: float = math.nan
    phase: compute.InnerPhase | None = None


class BatchedInner:
    """The gate where the simulated workers' inner phases of a round become one computation.

    ``phase(worker)`` is each ``Worker``'s inner phase in batched mode: it waits (giving up the
    hub's turn lock) until all ``members`` workers have arrived for the round, the last one
    computes them together, and each gets back its mean loss and its ``InnerPhase``.
    """

    def __init__(self, hub, template: torch.nn.Module, icfg, workers: int):
        self.hub, self.net, self.icfg, self.workers = hub, template, icfg, workers
        self.layout = [(name, p.numel(), p.shape) for name, p in template.named_parameters()]
        decay = torch.cat([torch.full((p.numel(),), float(d), dtype=p.dtype, device=p.device)
                           for p, d in zip(template.parameters(), recipe.decays(template, icfg),
                                           strict=True)])
        self.opt = StackedAdamW(workers, decay, icfg)
        self.arrived: dict[int, dict[int, _Arrival]] = {}
        self.ready: set[int] = set()

    def phase(self, worker, t: int) -> tuple[float, compute.InnerPhase]:
        """Worker ``worker``'s inner phase of round ``t``, computed with the others'."""
        hub = self.hub
        with hub.cond:
            group = self.arrived.setdefault(t, {})
            group[worker.rank] = arrival = _Arrival(worker)
            if len(group) == self.workers:
                self._compute(group)
                self.ready.add(t)
                hub.cond.notify_all()
            elif not hub.wait_until(lambda: t in self.ready):
                raise TransportError(f"worker {worker.rank} waited for the others' inner phase "
                                     f"of round {t} while no worker moved for "
                                     f"{hub.timeout_s:.0f} s")
            if t not in self.ready:
                raise TransportError(f"worker {worker.rank}: simulation aborted ({hub.error})")
            del group[worker.rank]
            if not group:
                del self.arrived[t]
                self.ready.discard(t)
        return arrival.loss, arrival.phase

    def _compute(self, group: dict[int, _Arrival]) -> None:
        ranks = sorted(group)
        arrivals = [group[r] for r in ranks]
        theta = torch.stack([a.worker.theta.detach() for a in arrivals])
        clock = _ShareClock()
        for a in arrivals:
            w = a.worker
            a.phase = compute.InnerPhase(w.compute, w.steps_per_round, clock.of(w.rank), None)
        losses: dict[int, list[torch.Tensor]] = {r: [] for r in ranks}
        while active := [i for i, a in enumerate(arrivals) if a.phase.another()]:
            clock.start()
            step_losses = self._step(theta, active, [arrivals[i].worker for i in active])
            clock.share([arrivals[i].worker.rank for i in active])
            for i, loss in zip(active, step_losses, strict=True):
                losses[ranks[i]].append(loss)
                arrivals[i].phase.step_done()
                arrivals[i].worker.step += 1
        for i, a in enumerate(arrivals):
            with torch.no_grad():
                a.worker.theta.copy_(theta[i])
            done = losses[ranks[i]]
            a.loss = torch.stack(done).mean().item() if done else math.nan

    def _step(self, theta: torch.Tensor, active: list[int], workers: list) -> torch.Tensor:
        """One AdamW step of the ``active`` rows of ``theta`` on each one's next batch."""
        rows = torch.tensor(active, device=theta.device)
        every = len(active) == theta.shape[0]   # every row steps: update theta in place
        batches = [w.shard.batch(w.device) for w in workers]
        x = torch.stack([b[0] for b in batches])
        y = torch.stack([b[1] for b in batches])
        own = (theta.detach() if every else theta[rows]).requires_grad_(True)
        losses = self._losses(self._views(own), x, y)
        (grad,) = torch.autograd.grad(losses.sum(), own)
        if self.icfg.grad_clip > 0:   # clip_grad_norm_ of each worker's whole gradient
            norm = grad.norm(dim=1, keepdim=True)
            grad.mul_((self.icfg.grad_clip / (norm + 1e-6)).clamp(max=1.0))
        # each worker's lr of the step it takes now, on its own counter (Worker.update's rule)
        lrs = [w.schedule.lr_at(w.step) for w in workers] \
            if workers[0].schedule is not None else None
        with torch.no_grad():
            own = own.detach()
            self.opt.step(rows, own, grad, lrs)
            if not every:
                theta[rows] = own
        return losses.detach()

    def _views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The parameters by name as views of the stacked rows (the flat layout of
        ``model.flatten_parameters``: ``named_parameters`` order, tied weights once)."""
        views, offset = {}, 0
        for name, n, shape in self.layout:
            views[name] = flat[:, offset:offset + n].view(flat.shape[0], *shape)
            offset += n
        return views

    def _losses(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                y: torch.Tensor) -> torch.Tensor:
        """Each row's loss: the built-in GPT's grouped forward, else the model vmapped over
        the rows (a plugin model, dropout: each row draws its own mask)."""
        if stacked_gpt.supports(self.net):
            return stacked_gpt.stacked_loss(self.net, params, x, y)
        return vmap(self._loss, randomness="different")(params, x, y)

    def _loss(self, params: dict[str, torch.Tensor], x: torch.Tensor,
              y: torch.Tensor) -> torch.Tensor:
        return functional_call(self.net, params, (x, y))[1]


class _ShareClock:
    """The real time of each batched step, shared equally among the workers it updated: the
    clock each worker's ``InnerPhase`` reads (used only where step times are measured)."""

    def __init__(self):
        self.spent: dict[int, float] = {}
        self.t0 = 0.0

    def of(self, rank: int):
        self.spent[rank] = 0.0
        return lambda: self.spent[rank]

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def share(self, ranks: list[int]) -> None:
        each = (time.perf_counter() - self.t0) / len(ranks)
        for r in ranks:
            self.spent[r] += each
