"""One worker: its model, data shard, inner AdamW, and outer algorithm; one round at a time.

The same ``Worker`` runs inside a simulator thread (in-memory transport) and inside an emulator
process (ZeroMQ transport); only the transport and the device differ.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from . import algorithms, data, model, topology
from .config import Config


def threads_per_worker(cfg: Config) -> int:
    """Torch CPU threads per worker, so that N emulator processes do not oversubscribe the cores.

    The simulator uses the same number: CPU kernels sum in an order that depends on the thread
    count, so equal counts are what make simulator and emulator agree to the last bit.
    """
    return cfg.run.threads_per_worker or max(1, (os.cpu_count() or 1) // cfg.workers)


def make_optimizer(net: torch.nn.Module, icfg) -> torch.optim.AdamW:
    """Inner AdamW; matrices get weight decay, biases and norms do not (as in nanoGPT)."""
    decay = [p for p in net.parameters() if p.dim() >= 2]
    rest = [p for p in net.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": icfg.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=icfg.lr, betas=(icfg.beta1, icfg.beta2))


@lru_cache(maxsize=16)
def build_topology(cfg: Config) -> topology.Topology | None:
    """The gossip graph, or None for DiLoCo (its peers are fixed by the ring All-Reduce).

    Memoised per (frozen, hashable) config: validation, the momentum check, the link probe, the
    dashboard header and the summary all share one graph and its cached lambda_2.
    """
    if cfg.algo.name == "diloco":
        return None
    return topology.from_config(cfg)


@dataclass
class RoundStats:
    """What one worker reports after one round (one line of metrics.jsonl)."""

    worker: int
    round: int
    step: int
    train_loss: float
    compute_s: float
    comm_s: float
    wait_s: float
    bytes_sent: int
    bytes_recv: int
    peers: list[int] = field(default_factory=list)
    eval_loss: float | None = None

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        if out["eval_loss"] is None:
            del out["eval_loss"]
        return out


class Worker:
    def __init__(self, cfg: Config, rank: int, transport, corpus: data.Corpus,
                 device: str | torch.device = "cpu", topo: topology.Topology | None = None):
        self.cfg, self.rank, self.transport, self.device = cfg, rank, transport, device
        self.net, self.theta = model.build_model(cfg.model, cfg.seed, device)
        self.opt = make_optimizer(self.net, cfg.algo.inner)
        self.shard = corpus.shard(rank)
        self.eval_set = corpus.eval_batches()
        self.topology = topo if topo is not None else build_topology(cfg)
        self.algo = algorithms.make(cfg.algo, rank, transport, self.topology)
        self.algo.begin(self.theta)
        self.steps_per_round = cfg.algo.steps_for(rank)
        self.step = 0

    def inner_phase(self) -> float:
        """H steps of AdamW on this worker's shard; the mean training loss (NaN if H = 0)."""
        losses = []
        clip = self.cfg.algo.inner.grad_clip
        for _ in range(self.steps_per_round):
            x, y = self.shard.batch(self.device)
            _, loss = self.net(x, y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(self.net.parameters(), clip)
            self.opt.step()
            losses.append(loss.detach())
            self.step += 1
        return torch.stack(losses).mean().item() if losses else math.nan

    def run_round(self, round_idx: int, on_compute_done=None) -> RoundStats:
        """One outer round: inner phase, then the algorithm's communication and outer step."""
        before = self.transport.counters()
        t0 = time.perf_counter()
        train_loss = self.inner_phase()
        t1 = time.perf_counter()
        if on_compute_done is not None:
            on_compute_done(t1 - t0)
        c1 = self.transport.clock()
        self.algo.outer_step(round_idx, self.theta)
        comm_s = self.transport.clock() - c1
        after = self.transport.counters()
        return RoundStats(
            worker=self.rank, round=round_idx, step=self.step, train_loss=train_loss,
            compute_s=t1 - t0, comm_s=comm_s, wait_s=after["wait_s"] - before["wait_s"],
            bytes_sent=_total(after["bytes_sent"]) - _total(before["bytes_sent"]),
            bytes_recv=_total(after["bytes_recv"]) - _total(before["bytes_recv"]),
            peers=self.algo.peers(round_idx))

    def evaluate(self) -> float:
        return data.evaluate(self.net, self.eval_set, self.device)

    def should_eval(self, round_idx: int) -> bool:
        every = self.cfg.run.eval_every
        return every > 0 and (round_idx + 1) % every == 0


def _total(per_peer: dict) -> int:
    return int(sum(per_peer.values()))


def average_and_consensus(thetas: list[torch.Tensor]) -> tuple[torch.Tensor, float]:
    """The average model (summed in rank order) and the RMS distance of workers to it."""
    mean = thetas[0].detach().to("cpu", torch.float64).clone()
    for t in thetas[1:]:
        mean.add_(t.detach().to("cpu", torch.float64))
    mean.div_(len(thetas))
    sq = [float((t.detach().to("cpu", torch.float64) - mean).pow(2).sum()) for t in thetas]
    return mean.to(thetas[0].dtype), math.sqrt(sum(sq) / len(sq))


def final_summary(cfg: Config, thetas: list[torch.Tensor], worker_eval: list[float], eval_set,
                  wall_s: float, bytes_sent: int, topo: topology.Topology | None) -> dict:
    """The summary every run record ends with; the average model is evaluated on the CPU."""
    avg, consensus = average_and_consensus(thetas)
    net, flat = model.build_model(cfg.model, cfg.seed, "cpu")
    with torch.no_grad():
        flat.copy_(avg)
    return {
        "status": "ok", "algorithm": cfg.algo.name,
        "topology": "ring-allreduce" if topo is None else cfg.topology.name,
        "workers": cfg.workers, "rounds": cfg.run.rounds,
        "local_steps": [cfg.algo.steps_for(r) for r in range(cfg.workers)],
        "lambda2": None if topo is None else topo.lambda2,
        "gamma": algorithms.momentum_value(cfg.algo, topo)
        if cfg.algo.name in ("gasloc", "diloco") else None,  # plain gossip has no momentum
        "final_eval_loss": data.evaluate(net, eval_set), "worker_eval_loss": worker_eval,
        "consensus_distance": consensus, "bytes_sent_total": bytes_sent, "wall_s": wall_s,
        # the simulator's virtual clock fills these in: its prediction, and the CPU slots
        # (cores / threads per worker) it shared among workers computing at once
        "predicted_wall_s": None, "cpu_slots": None,
    }
