"""The numbers every run record ends with: the average model, its loss, the consensus distance.

Both the simulator and the launcher call ``final_summary`` with the workers' final parameters;
the average is summed in rank order and evaluated on the CPU, so both give the same numbers.
"""
from __future__ import annotations

import math

import torch

from gasloc_emu.report.schema import RunSummary
from gasloc_emu.training import data, model


def average_and_consensus(thetas: list[torch.Tensor]) -> tuple[torch.Tensor, float]:
    """The average model (summed in rank order) and the RMS distance of workers to it."""
    mean = thetas[0].detach().to("cpu", torch.float64).clone()
    for t in thetas[1:]:
        mean.add_(t.detach().to("cpu", torch.float64))
    mean.div_(len(thetas))
    sq = [float((t.detach().to("cpu", torch.float64) - mean).pow(2).sum()) for t in thetas]
    return mean.to(thetas[0].dtype), math.sqrt(sum(sq) / len(sq))


def final_summary(plan, thetas: list[torch.Tensor], worker_eval: list[float], eval_set,
                  wall_s: float, bytes_sent: int, overruns: list[int] | None = None,
                  raw_bytes_sent: int | None = None) -> RunSummary:
    """The summary every run record ends with (``plan``: the run's ``RunPlan``); the average
    model is evaluated on the CPU.

    ``overruns``: per worker, the inner steps slower than their nominal time (None where the
    caller did not collect them); ``raw_bytes_sent``: what the bytes sent stood for before
    compression (None: no codec, the same)."""
    avg, consensus = average_and_consensus(thetas)
    gpt, flat = model.build_model(plan.cfg.model, plan.cfg.seed, "cpu")
    with torch.no_grad():
        flat.copy_(avg)
    loss = data.evaluate(gpt, eval_set)
    return run_summary(plan, wall_s, bytes_sent, overruns, raw_bytes_sent).replace(
        final_eval_loss=loss, final_perplexity=perplexity(loss), worker_eval_loss=worker_eval,
        consensus_distance=consensus)


def run_summary(plan, wall_s: float, bytes_sent: int, overruns: list[int] | None = None,
                raw_bytes_sent: int | None = None) -> RunSummary:
    """What a finished run's summary says besides its losses (``final_summary`` adds them;
    ``simulate --timing-only`` has none)."""
    cfg, topo = plan.cfg, plan.topology
    steps = plan.steps
    constants = plan.constants()   # only what the algorithm shows (plain gossip: nothing)
    return RunSummary(
        status="ok", algorithm=cfg.algo.name, algorithm_source=plan.algorithm.record(),
        topology=plan.topology_label(), workers=cfg.workers, rounds=cfg.run.rounds,
        local_steps=None if steps is None else list(steps),
        lambda2=None if topo is None else topo.lambda2,
        peers=None if topo is None else topo.peers_record(),
        gamma=constants.get("gamma"), eta=constants.get("eta"),
        bytes_sent_total=bytes_sent, wall_s=wall_s,
        # the simulator's virtual clock fills in predicted_wall_s and cpu_slots; the launcher
        # replaces drops and control_drops with what its workers and its control plane
        # dropped (the simulator has no wire, so nothing can be dropped there but what a
        # replay's run lost with a dead peer: ``with_dead_sends``)
        drops=drops_summary({r: {} for r in range(cfg.workers)}), control_drops={},
        compute=plan.compute.record(overruns),
        comm=comm_record(plan, bytes_sent, raw_bytes_sent),
        corpus=plan.corpus.describe() if plan.corpus is not None else None)


def perplexity(loss: float) -> float | None:
    """exp(mean cross-entropy in nats per token): the held-out perplexity per token of the
    corpus's tokenizer (per byte for byte tokens); None for a non-finite loss or one whose
    exponential overflows."""
    if not math.isfinite(loss) or loss > 700:
        return None
    return math.exp(loss)


def comm_record(plan, bytes_sent: int, raw_bytes_sent: int | None) -> dict:
    """summary.json's ``comm``: the codec, and the bytes on the wire against what they stood
    for as float32 values."""
    raw = bytes_sent if raw_bytes_sent is None else raw_bytes_sent
    return {"codec": plan.codec.describe() if plan.codec is not None else "none",
            "bytes_sent_total": bytes_sent, "raw_bytes_sent_total": raw,
            "ratio": bytes_sent / raw if raw else None}


def with_dead_sends(plan, by_worker: dict[int, dict], reason: str) -> dict[int, dict]:
    """Each worker's drops by reason, with its messages to workers lost with their hosts
    (``reason``: the transport's ``DEAD_PEER``; from the rounds' exchanges,
    ``World.sent_to_dead``) added to those it did without (counted under the same reason)."""
    extra = plan.world.sent_to_dead() if plan.world is not None else {}
    out = {rank: dict(reasons) for rank, reasons in by_worker.items()}
    for rank, n in extra.items():
        mine = out.setdefault(rank, {})
        mine[reason] = mine.get(reason, 0) + n
    return out


def drops_summary(by_worker: dict[int, dict[str, int]]) -> dict:
    """summary.json's ``drops``: every data-plane message a worker dropped, counted by reason,
    in total and per worker, so a run that lost messages cannot pass for an undisturbed one."""
    by_reason: dict[str, int] = {}
    for reasons in by_worker.values():
        for reason, n in reasons.items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    return {"total": sum(by_reason.values()), "by_reason": dict(sorted(by_reason.items())),
            "by_worker": {str(r): dict(sorted(by_worker[r].items())) for r in sorted(by_worker)}}
