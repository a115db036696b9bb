"""Max-plus estimate of the long-run time per round: synchronous GASLoC vs DiLoCo's All-Reduce.

    python benchmarks/max_plus.py [--workers 8] [--compute 1.0] [--transfer 0.2]
        [--rate-mbit 50] [--slow-rate-mbit 5] [--rounds 2000] [--seeds 10]

No training and no network: only the waiting structure of the rounds, under the project's own
bandwidth profiles (``netem.profiles``, by default with the 50 / 5 Mbit/s fast / slow rates of
net.rate_mbit and net.slow_rate_mbit) and the project's own per-round matchings
(``gasloc_emu.topology``). Time is in units of one round's compute; ``--transfer`` is the time
of one full-model message over a fast link, so a link of rate r takes transfer * rate_mbit / r
(2.0 on a 5 Mbit/s link with the defaults).

- GASLoC, random one-peer matchings (``matching``), neighbour-synchronous: worker i finishes
  its inner phase at s_i(t) + compute and starts round t + 1 at
      s_i(t + 1) = max(s_i(t) + compute, max over its peers j of s_j(t) + compute + tau(j -> i)).
  Sends are asynchronous (a worker does not wait for its own message to leave), links are full
  duplex with independent rates, and there is no latency and no queueing behind an earlier
  message on the same link: a lower bound on the real thing.
- GASLoC on a fixed 3-regular expander: the same recurrence, all neighbours every round.
- DiLoCo: every worker waits for the ring All-Reduce (``transport/base.py``), which moves
  2 (n - 1) / n of the model over each ring link i -> i + 1, one chunk after another, so a round
  takes at least compute + 2 (n - 1) / n * tau(slowest ring link).

Each profile is drawn with seeds 0..seeds-1 (the seed picks the slow pairs or the slow worker,
the matchings and the expander); the table gives the mean over seeds and, in brackets, the
smallest and largest. Runs in about three seconds; needs numpy and nothing else (the project
modules it imports use only numpy and the standard library). docs/ALGORITHM.md reads the table.
"""
from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gasloc_emu.topology import Topology
from netem.profiles import build_link_plan

PROFILES = ("uniform", "skewed", "skewed-worker", "two-cluster")
WARMUP = 200  # rounds discarded before measuring the slope


def transfer_times(profile: str, args, seed: int) -> np.ndarray:
    """tau[i, j]: time (in compute units) of one full-model message i -> j under the profile."""
    net = SimpleNamespace(bw_profile=profile, rate_mbit=args.rate_mbit, mtu=1500,
                          slow_rate_mbit=args.slow_rate_mbit, latency_ms=0.0, jitter_ms=0.0,
                          loss_pct=0.0)   # the fields of net.* that build_link_plan reads
    plan = build_link_plan(net, args.workers, seed)
    tau = np.zeros((args.workers, args.workers))
    for (i, j), link in plan.links.items():
        tau[i, j] = args.transfer * args.rate_mbit / link.rate_mbit
    return tau


def slope(starts: list[np.ndarray]) -> float:
    """Long-run time per round: growth of the latest start time after the warm-up."""
    return float((starts[-1].max() - starts[WARMUP].max()) / (len(starts) - 1 - WARMUP))


def peer_table(topo: Topology, rounds: int) -> np.ndarray:
    """peers[t, i, k]: the k-th peer of worker i in round t (every worker has the same degree)."""
    return np.array([topo.neighbors(t) for t in range(rounds)], dtype=np.intp)


def synchronous_gossip(tau: np.ndarray, peers: np.ndarray, compute: float) -> float:
    """Time per round when each worker waits for this round's peers' messages."""
    n = tau.shape[0]
    me = np.arange(n)[:, None]
    s = np.zeros(n)
    starts = [s]
    for p in peers:  # p[i, k] = k-th peer of worker i in this round
        finish = s + compute
        s = np.maximum(finish, (finish[p] + tau[p, me]).max(axis=1))
        starts.append(s)
    return slope(starts)


def ring_all_reduce(tau: np.ndarray, compute: float) -> float:
    n = tau.shape[0]
    slowest = max(tau[r, (r + 1) % n] for r in range(n))
    return compute + 2 * (n - 1) / n * slowest


def row(profile: str, args, tables: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, list]:
    out: dict[str, list[float]] = {"matching": [], "expander": [], "diloco": [], "slow_share": []}
    for seed, (match, expander) in enumerate(tables):
        tau = transfer_times(profile, args, seed)
        out["matching"].append(synchronous_gossip(tau, match, args.compute))
        out["expander"].append(synchronous_gossip(tau, expander, args.compute))
        out["diloco"].append(ring_all_reduce(tau, args.compute))
        slow = tau > tau[tau > 0].min()
        out["slow_share"].append(float(slow[np.arange(args.workers), match[:, :, 0]].any(1).mean()))
    return out


def cell(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi, mean = min(values), max(values), sum(values) / len(values)
    if hi - lo < 0.005:
        return fmt.format(mean)
    return f"{fmt.format(mean)} ({fmt.format(lo)}–{fmt.format(hi)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--compute", type=float, default=1.0, help="compute time of one round")
    ap.add_argument("--transfer", type=float, default=0.2,
                    help="one full-model message over a fast (rate_mbit) link")
    ap.add_argument("--rate-mbit", type=float, default=50.0, help="fast links (net.rate_mbit)")
    ap.add_argument("--slow-rate-mbit", type=float, default=5.0,
                    help="slow links (net.slow_rate_mbit)")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    if args.rounds <= WARMUP or args.seeds < 1 or args.workers < 4 or args.workers % 2:
        ap.error(f"need --rounds > {WARMUP}, --seeds >= 1 and an even --workers >= 4")
    if min(args.rate_mbit, args.slow_rate_mbit, args.compute, args.transfer) <= 0:
        ap.error("rates, --compute and --transfer must be positive")
    slow = args.transfer * args.rate_mbit / args.slow_rate_mbit
    print(f"{args.workers} workers, compute {args.compute:g} per round, full-model transfer "
          f"{args.transfer:g} on a {args.rate_mbit:g} Mbit/s link and {slow:g} on a "
          f"{args.slow_rate_mbit:g} Mbit/s link; mean (min–max) over seeds 0–{args.seeds - 1}, "
          f"rounds {WARMUP}–{args.rounds}\n")
    print("| profile | GASLoC, one-peer matchings | GASLoC, expander d = 3 "
          "| DiLoCo, ring All-Reduce | matching rounds that use a slow link |")
    print("| --- | --- | --- | --- | --- |")
    tables = [(peer_table(Topology("matching", args.workers, seed=seed), args.rounds),
               peer_table(Topology("expander", args.workers, degree=3, seed=seed), args.rounds))
              for seed in range(args.seeds)]
    for profile in PROFILES:
        r = row(profile, args, tables)
        print(f"| {profile} | {cell(r['matching'])} | {cell(r['expander'])} | "
              f"{cell(r['diloco'])} | {cell([100 * v for v in r['slow_share']], '{:.0f}')} % |")
    print(f"\nLower bound for every column: compute + fast transfer = "
          f"{args.compute + args.transfer:g} per round.")


if __name__ == "__main__":
    main()
