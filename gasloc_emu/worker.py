"""One worker: its model, data shard, inner AdamW, and outer algorithm; one round at a time.

The same ``Worker`` runs inside a simulator thread (in-memory transport) and inside an emulator
process (ZeroMQ transport); only the transport and the device differ.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from . import algorithms, data, model, topology
from .config import Config


def make_optimizer(gpt: torch.nn.Module, icfg) -> torch.optim.AdamW:
    """Inner AdamW; matrices get weight decay, biases and norms do not (as in nanoGPT)."""
    decay = [p for p in gpt.parameters() if p.dim() >= 2]
    rest = [p for p in gpt.parameters() if p.dim() < 2]
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
        self.gpt, self.theta = model.build_model(cfg.model, cfg.seed, device)
        self.opt = make_optimizer(self.gpt, cfg.algo.inner)
        self.shard = corpus.shard(rank)
        self.eval_set = corpus.eval_batches()
        self.topology = topo if topo is not None else topology.build_topology(cfg)
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
            _, loss = self.gpt(x, y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(self.gpt.parameters(), clip)
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
        self.check_finite(round_idx, train_loss)
        after = self.transport.counters()
        return RoundStats(
            worker=self.rank, round=round_idx, step=self.step, train_loss=train_loss,
            compute_s=t1 - t0, comm_s=comm_s, wait_s=after["wait_s"] - before["wait_s"],
            bytes_sent=_total(after["bytes_sent"]) - _total(before["bytes_sent"]),
            bytes_recv=_total(after["bytes_recv"]) - _total(before["bytes_recv"]),
            peers=self.algo.peers(round_idx))

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


def _total(per_peer: dict) -> int:
    return int(sum(per_peer.values()))
