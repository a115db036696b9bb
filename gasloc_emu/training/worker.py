"""One worker: its model, data shard, inner AdamW, and outer algorithm; one round at a time.

The same ``Worker`` runs inside a simulator thread (in-memory transport) and inside an emulator
process (ZeroMQ transport); only the transport and the device differ.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import torch

from gasloc_emu import algorithms
from gasloc_emu.comm.channel import Channel
from gasloc_emu.scenario.world import RoundPlan, World, living_graph
from gasloc_emu.training import compute, data, model, recipe


def make_optimizer(gpt: torch.nn.Module, icfg) -> torch.optim.AdamW:
    """Inner AdamW; matrices get weight decay, biases and norms do not (as in nanoGPT), the
    embedding tables only with ``algo.inner.decay_embeddings`` (``recipe.decays``)."""
    flags = recipe.decays(gpt, icfg)
    params = list(gpt.parameters())
    decay = [p for p, d in zip(params, flags, strict=True) if d]
    rest = [p for p, d in zip(params, flags, strict=True) if not d]
    groups = [{"params": decay, "weight_decay": icfg.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=icfg.lr, betas=(icfg.beta1, icfg.beta2))


class Diverged(RuntimeError):
    """Non-finite parameters or losses: the run is over, and it is not a success."""

    def __init__(self, worker: int, round_idx: int, what: str):
        super().__init__(f"worker {worker} diverged in round {round_idx}: {what}")
        self.where = {"worker": worker, "round": round_idx}


@dataclass
class RoundStats:
    """What one worker reports after one round (one line of metrics.jsonl)."""

    worker: int
    round: int
    step: int
    train_loss: float
    compute_s: float  # emulated compute seconds of the inner phase (its speed and pacing included)
    comm_s: float
    wait_s: float
    bytes_sent: int
    bytes_recv: int
    peers: list[int] = field(default_factory=list)
    steps: int = 0  # inner steps this round (H_i; fewer for a slow worker under a budget)
    speed: float = 1.0
    overruns: int = 0  # steps whose real time exceeded their nominal time (step_time_s > 0)
    overrun_ratio: float = 0.0  # the round's worst real / nominal step time; 0 when measured
    eval_loss: float | None = None
    tokens: int = 0  # tokens trained on this round (steps * micro batches * batch * context)
    lr: float | None = None  # the inner lr of the round's last step; None: constant (the lr)
    # the ZeroMQ transport's link observations of this round's messages, by source (str rank):
    # {"bytes", "messages", "transfer_s", "sent_s"} (``link_row``); None: not measured
    recv_links: dict[str, dict] | None = None
    # A2CiD2's lanes: the step's [start, end] on the run's clock and, on a slot's last step,
    # every exchange of the slot's [start, end] (its partners in ``peers``, in order)
    step_span_s: list[float] | None = None
    exchange_spans_s: list[list[float]] | None = None
    # True: the outer step was not taken (its exchange lost a dead peer's part); None: taken
    uncommitted: bool | None = None

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        for name in ("eval_loss", "lr", "recv_links", "step_span_s", "exchange_spans_s",
                     "uncommitted"):
            if out[name] is None:
                del out[name]
        return out


def link_row(use, t0_s: float, clock=None) -> dict:
    """One source's ``recv_links`` entry from its ``mailbox.LinkUse``; ``sent_s``: the earliest
    message's send time on the run's clock (seconds since ``t0_s``, a time.time() value).
    ``clock`` (a ``dilation.WorkerClock``): both times emulated (wall / K); None: wall."""
    if clock is None:
        return {"bytes": use.nbytes, "messages": use.messages, "transfer_s": use.transfer_s,
                "sent_s": use.first_sent_at - t0_s}
    return {"bytes": use.nbytes, "messages": use.messages,
            "transfer_s": clock.emulated_s(use.transfer_s),
            "sent_s": clock.since_s(t0_s, use.first_sent_at)}


class Worker:
    """One worker of a ``RunPlan``. ``pace``: sleep so that each inner phase keeps the compute
    model's schedule (an emulator process); False in the simulator, whose virtual clock is told
    the emulated time instead.

    Under time dilation (``plan.time_scale`` = K, netplan's "Time dilation") a paced worker's
    clock is the plan's ``WorkerClock``: every time it measures (a step, the communication,
    the waits, its link observations) is emulated (wall / K) where it is measured, and every
    time it stands still (a nominal step's pacing, a pause, the failure-detect wait) lasts K
    times longer in wall time. A measured step time (compute.step_time_s = 0) is this host's
    compute / K: the emulated machine is K times faster than this one."""

    clock = None   # the simulator's and a bare worker's: times as measured (no dilation)

    def __init__(self, plan, rank: int, transport, device: str | torch.device = "cpu",
                 *, pace: bool = True, batched=None):
        """``batched``: the simulator's gate that computes every worker's inner phase of a
        round together (``simulator.batched.BatchedInner``); None: this worker computes its own."""
        cfg = plan.cfg
        self.plan, self.cfg, self.rank, self.transport, self.device = \
            plan, cfg, rank, transport, device
        self.compute = plan.compute.models[rank]
        self.clock = plan.clock() if pace else None   # emulated time; sleeps dilated
        self.sleep = self.clock.sleep if pace else None
        self.batched = batched
        self.gpt, self.theta = model.build_model(cfg.model, cfg.seed, device)
        self.opt = make_optimizer(self.gpt, cfg.algo.inner)
        self.shard = plan.corpus.shard(rank)
        self.set_recipe(plan, rank)
        self.eval_set = plan.corpus.eval_batches()
        self.topology = plan.topology
        self.world = plan.world
        channel = Channel(plan.codec, self.theta, cfg.comm.gossip_step,
                          cfg.comm.feedback_decay) if plan.codec else None
        self.algo = build_algorithm(plan, rank, transport, channel)
        self.algo.begin(self.theta)
        self.steps_per_round = plan.compute.fixed_steps[rank]  # H, unless a budget decides
        self.step = 0
        self.mean_step_s = 0.0  # measured steps' mean (A2CiD2's time unit without a nominal one)
        self.overruns = 0  # over the whole run, for the record's compute block
        # the run's start (time.time()), set by the worker process: link observations are
        # reported on the run's clock. None (the simulator): no observations are reported
        self.t0: float | None = None
        # the transport's counters where the next round's count starts, when something of
        # that round crossed before it (a join's parameters: ``count_from_here``)
        self._counted_from: dict | None = None

    def count_from_here(self) -> None:
        """Count what crosses from now on in the next round's stats: a joiner's copy of its
        donor's parameters, and the donor's, are traffic of the round they start."""
        if self._counted_from is None:
            self._counted_from = self.transport.counters()

    def set_recipe(self, plan, rank: int) -> None:
        """The inner recipe (docs/RECIPE.md): the lr schedule on this worker's step counter,
        gradient accumulation, the forward pass's precision and compilation."""
        icfg = self.cfg.algo.inner
        steps = plan.steps
        planned = (self.cfg.run.rounds if plan.drive.rounds_count_steps
                   else None if steps is None else steps[rank] * self.cfg.run.rounds)
        self.schedule = recipe.schedule_for(icfg, planned)
        self.precision = recipe.PRECISION[icfg.precision]
        self.scaler = self.precision.scaler(self.device)
        self.forward = torch.compile(self.gpt) if icfg.compile else self.gpt
        self.tokens_per_step = (icfg.micro_batches * self.shard.batch_size
                                * self.shard.block_size)

    def inner_phase(self) -> tuple[float, compute.InnerPhase]:
        """AdamW steps on this worker's shard, as many as the compute model says; the mean
        training loss (NaN with no step) and the phase's timing."""
        losses = []
        phase = compute.InnerPhase(self.compute, self.steps_per_round,
                                   self.clock.now_s if self.clock is not None
                                   else time.perf_counter, self.sleep)
        while phase.another():
            losses.append(self.train_step())
            if not self.compute.at_host_speed:
                _sync(self.device)  # the step's time must include its kernels
            phase.step_done()
        self.overruns += phase.overruns
        return (torch.stack(losses).mean().item() if losses else math.nan), phase

    def train_step(self, before_update=None) -> torch.Tensor:
        """One AdamW step on the next batch of the shard; its loss (not synchronised).
        ``before_update()`` runs between the backward pass and the optimizer's update (A2CiD2
        advances its momentum's ODE there, as the paper does at the time of the update)."""
        loss = self.gradient()
        self.update(before_update)
        return loss

    def gradient(self) -> torch.Tensor:
        """The backward pass of the next step, on the parameters as they are now; its loss.
        With ``algo.inner.micro_batches`` = k, k passes over the shard's next batches, each
        loss scaled by 1/k: the gradients add up to the mean over the k batches together."""
        icfg = self.cfg.algo.inner
        k = icfg.micro_batches
        self.opt.zero_grad(set_to_none=True)
        total = None
        for _ in range(k):
            x, y = self.shard.batch(self.device)
            with self.precision.autocast(self.device):
                _, loss = self.forward(x, y)
            if k > 1:
                loss = loss / k
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if icfg.grad_clip > 0:
            if self.scaler is not None:
                self.scaler.unscale_(self.opt)  # clip the true gradient, not the scaled one
            torch.nn.utils.clip_grad_norm_(self.gpt.parameters(), icfg.grad_clip)
        return total

    def update(self, before_update=None) -> None:
        """The optimizer's update with the gradient of ``gradient()`` (A2CiD2's lanes take it
        when the step's time is up, the parameters having moved meanwhile)."""
        if before_update is not None:
            before_update()
        if self.schedule is not None:
            for group in self.opt.param_groups:
                group["lr"] = self.schedule.lr_at(self.step)
        if self.scaler is None:
            self.opt.step()
        else:
            self.scaler.step(self.opt)  # skips the step on inf/NaN gradients, as torch.amp does
            self.scaler.update()
        self.step += 1

    def current_lr(self) -> float | None:
        """The lr of the last step taken, where a schedule moves it; None: constant."""
        return self.schedule_lr(max(0, self.step - 1))

    def schedule_lr(self, step: int) -> float | None:
        """The lr of step ``step`` (0: the first) where a schedule moves it; None: constant."""
        return None if self.schedule is None else self.schedule.lr_at(step)

    def run_round(self, round_idx: int, on_compute_done=None,
                  plan: RoundPlan | None = None) -> RoundStats:
        """One outer round: inner phase, then the algorithm's communication and outer step.

        ``on_compute_done(seconds, nominal)`` is called between the two with the phase's compute
        time, and whether it is nominal (it then takes that long whatever else runs). ``plan``
        (a scenario's round): a new speed and a pause before the inner phase, and the time spent
        noticing departed peers before communicating."""
        before, self._counted_from = self._counted_from or self.transport.counters(), None
        if plan is not None:
            self.begin_round(plan)
        train_loss, phase = (self.inner_phase() if self.batched is None
                             else self.batched.phase(self, round_idx))
        compute_s = phase.elapsed_s()
        if on_compute_done is not None:
            on_compute_done(compute_s, self.compute.nominal)
        c1 = self.transport.clock()
        if plan is not None and plan.detect_s > 0:
            self.idle(plan.detect_s)  # a heartbeat timeout's worth of waiting for the departed
        self.algo.outer_step(round_idx, self.theta)
        if round_idx == self.cfg.run.rounds - 1:
            self.algo.finish(self.theta)  # an overlapped last exchange lands here
        comm_s = self.emulated(self.transport.clock() - c1)
        self.check_finite(round_idx, train_loss)
        after = self.transport.counters()
        return RoundStats(
            worker=self.rank, round=round_idx, step=self.step, train_loss=train_loss,
            compute_s=compute_s, comm_s=comm_s,
            wait_s=self.emulated(after["wait_s"] - before["wait_s"]),
            bytes_sent=_total(after["bytes_sent"]) - _total(before["bytes_sent"]),
            bytes_recv=_total(after["bytes_recv"]) - _total(before["bytes_recv"]),
            peers=self.algo.peers(round_idx), steps=phase.steps, speed=self.compute.speed,
            overruns=phase.overruns, overrun_ratio=phase.worst_ratio,
            tokens=phase.steps * self.tokens_per_step, lr=self.current_lr(),
            recv_links=self.recv_links(round_idx - self.cfg.algo.overlap),
            uncommitted=self.algo.uncommitted or None)

    def recv_links(self, round_idx: int) -> dict[str, dict] | None:
        """The transport's link observations of round ``round_idx`` (``link_row``), or None
        where it measures none (the simulator's) or the run's clock is unknown."""
        observe = getattr(self.transport, "recv_links", None)
        if observe is None or self.t0 is None or round_idx < 0:
            return None
        return {str(src): link_row(use, self.t0, self.clock)
                for src, use in sorted(observe(round_idx).items())}

    def emulated(self, wall_s: float) -> float:
        """A duration the transport measured (wall seconds, or the simulator's virtual ones)
        as the run reports it: / K in an emulator process, as is in the simulator."""
        return self.clock.emulated_s(wall_s) if self.clock is not None else wall_s

    def begin_round(self, plan: RoundPlan) -> None:
        """A scenario's speed change and pause at the start of a round."""
        if plan.speed is not None:
            self.compute = dataclasses.replace(self.compute, speed=plan.speed)
        if plan.pause_s > 0:
            self.idle(plan.pause_s)

    def idle(self, seconds: float) -> None:
        """Stand still: really (an emulator process), or on the simulator's virtual clock."""
        if self.sleep is not None:
            self.sleep(seconds)
        else:
            self.transport.idle(seconds)

    def peer_joined(self, peer: int) -> None:
        """``peer`` joins now as a new process: nothing sent to it may go to its predecessor."""
        self.transport.peer_restarted(peer)

    def donate(self, joiner: int, round_idx: int) -> None:
        """Send this worker's parameters (the start of round ``round_idx``) to a joiner:
        traffic of that round."""
        handover = self.algo.handover()   # DiLoCo: its shared momentum
        if sorted(handover) != sorted(self.algo.handover_kinds):
            raise RuntimeError(f"{self.algo.name}: handover() gives kinds {sorted(handover)}; "
                               f"its handover_kinds declares {list(self.algo.handover_kinds)}")
        self.count_from_here()
        self.transport.send(joiner, round_idx, "join", self.theta.detach().clone())
        for kind, tensor in handover.items():
            self.transport.send(joiner, round_idx, kind, tensor)

    def join(self, donor: int, round_idx: int) -> None:
        """Start from ``donor``'s parameters at the start of round ``round_idx``: a fresh inner
        optimizer and outer state around them, but what the algorithm hands over (DiLoCo's
        shared momentum buffer; docs/ALGORITHM.md, "Churn"). The copy is traffic of that
        round."""
        self.count_from_here()
        received = self.transport.recv(donor, round_idx, "join")
        with torch.no_grad():
            self.theta.copy_(received.to(self.theta.device))
        self.algo.begin(self.theta)
        self.algo.take_over({kind: self.transport.recv(donor, round_idx, kind).to(self.theta.device)
                             for kind in self.algo.handover()})

    def checkpoint(self) -> dict:
        """Everything this worker needs to go on from the end of its last round exactly
        (``training.checkpoint``): parameters, the inner optimizer, the algorithm and its
        channel, its data shard's generator, its counters and compute speed. Training draws
        nothing from torch's global generator (which the simulator's workers share), so it is
        not kept."""
        return {"theta": self.theta.detach().to("cpu", copy=True),
                "optimizer": self.opt.state_dict(), "algorithm": self.algo.state_dict(),
                "shard_rng": self.shard.generator.get_state(), "step": self.step,
                "speed": self.compute.speed, "overruns": self.overruns,
                "mean_step_s": self.mean_step_s,
                **({"scaler": self.scaler.state_dict()} if self.scaler is not None else {})}

    def restore(self, state: dict) -> None:
        """Take a checkpoint's state (``checkpoint``) in place of the fresh one."""
        with torch.no_grad():
            self.theta.copy_(state["theta"].to(self.theta.device))
        self.opt.load_state_dict(state["optimizer"])
        self.algo.begin(self.theta)
        self.algo.load_state_dict(state["algorithm"], self.theta.device)
        self.shard.generator.set_state(state["shard_rng"])
        self.step, self.overruns = int(state["step"]), int(state["overruns"])
        self.mean_step_s = float(state["mean_step_s"])
        if self.scaler is not None and "scaler" in state:   # fp16: its loss scale goes on
            self.scaler.load_state_dict(state["scaler"])
        self.compute = dataclasses.replace(self.compute, speed=float(state["speed"]))

    def check_finite(self, round_idx: int, loss: float) -> None:
        """Raise ``Diverged`` on a non-finite loss or parameter: NaN spreads to every neighbour
        within rounds, and a run that ends in NaN must not be reported as a result."""
        if not math.isfinite(loss):
            raise Diverged(self.rank, round_idx, f"loss {loss}")
        if not bool(torch.isfinite(self.theta).all()):
            bad = int((~torch.isfinite(self.theta)).sum())
            raise Diverged(self.rank, round_idx, f"{bad} non-finite parameters")

    def evaluate(self, round_idx: int | None = None) -> float:
        """Mean eval loss; with ``round_idx``, a non-finite loss is a divergence in that round."""
        loss = data.evaluate(self.gpt, self.eval_set, self.device)
        if round_idx is not None:
            self.check_finite(round_idx, loss)
        return loss

    def should_eval(self, round_idx: int) -> bool:
        every = self.cfg.run.eval_every
        return every > 0 and (round_idx + 1) % every == 0


def build_algorithm(plan, rank: int, transport, channel: Channel | None = None):
    """Worker ``rank``'s algorithm over ``transport`` (not begun): its graph as the world has
    it, its settings, weight, ring members and heals (``simulate --timing-only`` builds one
    the same way, to ask it which messages it sends)."""
    world = plan.world
    return plan.algo.build(algorithms.Context(
        rank, transport, living_graph(plan.topology, world), plan.cfg.algo,
        plan.algorithm.params, weight=plan.compute.pseudo_grad_weight(rank),
        members=ring_members(world, rank),
        heals=world.heals if world is not None and (world.partitions or world.armed) else None,
        channel=channel, survives_loss=world is not None and world.armed))


def ring_members(world: World | None, rank: int):
    """DiLoCo's ``members(t)`` for ``rank``: None (the full ring) without churn or partition,
    else the living workers of its side of a partition (``World.ring_members``)."""
    if world is None or not world.reshapes:
        return None
    return world.ring_members(rank)


def _sync(device) -> None:
    """Wait for a GPU's queued kernels; a no-op on the CPU, where they ran already."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _total(per_peer: dict) -> int:
    return int(sum(per_peer.values()))
