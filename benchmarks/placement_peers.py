"""Bandwidth-aware gossip peers against random ones on a measured placement: bottleneck, lambda_2
and max-plus time per round.

    python benchmarks/placement_peers.py [--placement aws8] [--degree 3] [--seeds 10]
        [--step-time-s 0.05] [--local-steps 10] [--rounds 600]

Each graph is the run plan's (``plan.build_plan`` with ``net.bw_profile = cloud``, no corpus),
so the rates are those of the run's link plan (``netem/data/cloud_regions.json``: Skyplane's
64-stream capacity or intercloud's single-stream goodput, RTT / 2 each way). For each rate kind
and graph: the slowest edge a round may use (the bottleneck, the slower direction of each
edge), lambda_2 of (E[]) W and the spectral gap, and the long-run time per round of
neighbour-synchronous GASLoC from the max-plus recurrence of ``benchmarks/max_plus.py``

    s_i(t + 1) = max(s_i(t) + c, max over round t's peers j of s_j(t) + c + tau(j -> i)),

with c = local steps x step time and tau(j -> i) = latency + model bytes x 8 / rate (no queueing:
a lower bound). Random graphs (expander d, one-peer matchings) over seeds 0..seeds-1: mean and
(min-max). DiLoCo's ring All-Reduce beside them, 2 (N - 1) chunk steps of N-th of the model,
each as slow as the slowest ring link's latency + transfer (one line, no seeds): a crude
pessimistic figure (aws8 capacity: 1.76 s here, 1.21 s a round in the simulator's runs of
docs/RESULTS.md, "Measured networks"). No training.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gasloc_emu import config as C  # noqa: E402
from gasloc_emu.plan import build_plan  # noqa: E402
from gasloc_emu.training.model import build_model  # noqa: E402
from netem.cloud import parse_placement  # noqa: E402

WARMUP = 100  # rounds discarded before measuring the slope


def plan_of(args, kind: str, name: str, seed: int, slack: float = 0.0):
    cfg = C.resolve(None, {"workers": len(parse_placement(args.placement)), "seed": seed,
                           "algo.name": "gasloc", "topology.name": name,
                           "topology.degree": args.degree, "topology.rate_slack": slack,
                           "net.bw_profile": "cloud", "net.placement": args.placement,
                           "net.cloud_rate": kind})
    return build_plan(cfg, data=False)


def transfer_s(plan, model_bytes: int) -> np.ndarray:
    """tau[i, j]: seconds of one full-model message i -> j on the plan's links."""
    n = plan.cfg.workers
    tau = np.zeros((n, n))
    for (i, j), link in plan.link_plan.links.items():
        tau[i, j] = link.latency_ms / 1e3 + model_bytes * 8 / (
            plan.link_plan.effective_rate_mbit(i, j) * 1e6)
    return tau


def gossip_round_s(plan, tau: np.ndarray, compute_s: float, rounds: int) -> float:
    """Long-run seconds per round of neighbour-synchronous gossip on the plan's graph."""
    topo, n = plan.topology, plan.cfg.workers
    s = np.zeros(n)
    late = None
    for t in range(rounds):
        finish = s + compute_s
        adj = topo.neighbors(t)
        s = np.array([max([finish[i]] + [finish[j] + tau[j, i] for j in adj[i]])
                      for i in range(n)])
        if t == WARMUP:
            late = s.max()
    return float((s.max() - late) / (rounds - 1 - WARMUP))


def ring_round_s(tau_chunk: np.ndarray, compute_s: float) -> float:
    n = tau_chunk.shape[0]
    return compute_s + 2 * (n - 1) * max(tau_chunk[r, (r + 1) % n] for r in range(n))


def cell(values: list[float], fmt: str) -> str:
    lo, hi, mean = min(values), max(values), float(np.mean(values))
    if fmt.format(lo) == fmt.format(hi):
        return fmt.format(mean)
    return f"{fmt.format(mean)} ({fmt.format(lo)}-{fmt.format(hi)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placement", default="aws8", help="net.placement (a preset or regions)")
    ap.add_argument("--degree", type=int, default=3, help="topology.degree of both graphs")
    ap.add_argument("--slacks", default="0,0.2", help="topology.rate_slack values of fastest")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--step-time-s", type=float, default=0.05)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=600)
    args = ap.parse_args()
    if args.rounds <= WARMUP + 1 or args.seeds < 1:
        ap.error(f"need --rounds > {WARMUP + 1} and --seeds >= 1")
    compute_s = args.step_time_s * args.local_steps
    probe = plan_of(args, "capacity", "expander", 0)
    _, flat = build_model(probe.cfg.model, 0, "cpu")
    model_bytes = flat.numel() * 4
    print(f"placement {args.placement}, tiny GPT ({model_bytes / 1e6:.2f} MB as float32), "
          f"compute {compute_s:g} s per round; random graphs: mean (min-max) over seeds "
          f"0-{args.seeds - 1}; max-plus over rounds {WARMUP}-{args.rounds}\n")
    print("| rates | graph | edges | bottleneck (Mbit/s) | lambda2 | spectral gap "
          "| GASLoC s per round (max-plus) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for kind in ("capacity", "single-stream"):
        arms = [(f"fastest d <= {args.degree}, slack {float(s):g}", "fastest", [0], float(s))
                for s in args.slacks.split(",")]
        arms += [(f"expander d = {args.degree}", "expander", range(args.seeds), 0.0),
                 ("matching (one peer)", "matching", range(args.seeds), 0.0)]
        for label, name, seeds, slack in arms:
            rows = []
            for seed in seeds:
                plan = plan_of(args, kind, name, seed, slack)
                topo = plan.topology
                tau = transfer_s(plan, model_bytes)
                rows.append((len(topo.possible_edges) if not topo.time_varying else
                             topo.n // 2, topo.bottleneck_mbit(), topo.lambda2,
                             topo.spectral_gap,
                             gossip_round_s(plan, tau, compute_s, args.rounds)))
            cols = list(zip(*rows, strict=True))
            print(f"| {kind} | {label} | {cell(cols[0], '{:.0f}')} | {cell(cols[1], '{:.0f}')} "
                  f"| {cell(cols[2], '{:.3f}')} | {cell(cols[3], '{:.3f}')} "
                  f"| {cell(cols[4], '{:.3f}')} |")
        plan = plan_of(args, kind, "expander", 0)
        chunk = transfer_s(plan, model_bytes // plan.cfg.workers)
        print(f"| {kind} | DiLoCo ring All-Reduce | {plan.cfg.workers} | - | - | - "
              f"| {ring_round_s(chunk, compute_s):.3f} |")
    print("\nmatching: its bottleneck is the slowest link of the complete graph any round may "
          "draw; lambda2 of E[W] over rounds.")


if __name__ == "__main__":
    main()
