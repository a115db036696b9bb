"""Consensus distance and loss against N, graph, gamma and the outer step, on the quadratic
surrogate of ``gasloc-emu consensus`` (gasloc_emu/experiments/consensus.py), 16 to 4096 workers.

    PYTHONPATH=$PWD nice python benchmarks/consensus_scale.py \
        --out docs/results/consensus-scale.json

Two parts, every run from seed 0, d = 16, 32 rows per worker:

- rates: pure gossip of random starts (outer lr 0, so the inner phase is discarded; init
  spread 1) for 300 rounds, with gamma = 0 and gamma = gamma* (``algo.momentum = auto``) at
  alpha = 1, and gamma* at alpha = 0.5 (W then has no negative eigenvalue). The measured
  per-round factor of the consensus distance (fitted on rounds 150..300, or the second half of
  what stays above 1e-24 of the start) against the prediction from W's spectrum,
  ``Topology.momentum_growth(gamma)^2`` (lambda_2^2 at gamma = 0); random matchings get no
  prediction (their W changes every round).
- loss: GASLoC with H = 10 gradient steps (lr 0.1) on heterogeneous quadratics
  (heterogeneity 1) for 200 rounds, at (eta 0.7, gamma 0) and (eta 1 - gamma*, gamma*), and
  DiLoCo (eta 0.7, mu 0.9) on the same problems: final consensus distance, f(xbar) - f*, and the
  workers' own mean gap.

Prints two Markdown tables (docs/RESULTS.md, "Consensus at scale") and writes one JSON object
(machine, command, per-run summaries with the consensus distance at a few rounds).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gasloc_emu import config as C  # noqa: E402
from gasloc_emu.experiments.consensus import run_consensus  # noqa: E402
from gasloc_emu.plan import build_plan  # noqa: E402

SIZES = (16, 64, 256, 1024, 4096)
RATE_GRAPHS = ("ring", "exponential", "expander", "matching")
LOSS_GRAPHS = ("ring", "exponential", "expander")
RATE_ARMS = (("gamma 0", {"algo.momentum": 0.0, "algo.alpha": 1.0}),
             ("gamma*", {"algo.momentum": "auto", "algo.alpha": 1.0}),
             ("gamma*, alpha 0.5", {"algo.momentum": "auto", "algo.alpha": 0.5}))
LOSS_ARMS = (("gasloc eta 0.7, gamma 0", {"algo.outer_lr": 0.7, "algo.momentum": 0.0}),
             ("gasloc eta 1-gamma*, gamma*", {"algo.outer_lr": "1-momentum",
                                              "algo.momentum": "auto"}))
SHOWN_ROUNDS = (0, 1, 10, 50, 100, 200, 300)


class Graphs:
    """One Topology per (N, graph, alpha, degree), so its spectrum is computed once for every
    arm that runs on it (``Topology.spectrum`` is cached on the instance)."""

    def __init__(self):
        self.cache = {}

    def plan(self, sets: dict):
        plan = build_plan(C.resolve(None, sets), data=False)
        if plan.topology is None:
            return plan
        t = plan.topology
        key = (t.name, t.n, t.alpha, t.degree, t.seed, t.base)
        return dataclasses.replace(plan, topology=self.cache.setdefault(key, t))


def summary(part: str, arm: str, res) -> dict:
    out = {k: v for k, v in dataclasses.asdict(res).items()
           if k not in ("consensus", "loss_gap", "worker_gap", "settings")}
    out |= {"part": part, "arm": arm, "local_steps": sorted(set(res.local_steps)),
            "consensus_at": {str(t): res.consensus[t] for t in SHOWN_ROUNDS
                             if t < len(res.consensus)},
            "final_consensus": res.consensus[-1], "final_loss_gap": res.loss_gap[-1],
            "final_worker_gap": res.worker_gap[-1]}
    return out


def reference(plan, res) -> float | None:
    """Random one-peer matchings at alpha = 1, gamma = 0: each W_t averages pairs, so
    W_t^2 = W_t and E[c_{t+1} | x_t] = x_t^T (E[W] - J) x_t / N; on the complete base E[W] is
    lambda_2(E[W]) = 1 - n / (2 (n - 1)) on every disagreement, so the expected factor is exactly
    that (Boyd et al. 2006, randomized gossip). The measured factor is the mean of the log
    (Jensen: at most the log of the mean)."""
    topo = plan.topology
    if topo.time_varying and topo.alpha == 1.0 and res.gamma == 0.0:
        return topo.lambda2
    return None


def rate_runs(graphs: Graphs, sizes) -> list[dict]:
    rows = []
    base = {"algo.outer_lr": 0.0, "algo.local_steps": 1, "run.rounds": 300,
            "surrogate.init_spread": 1.0}
    for n in sizes:
        for graph in RATE_GRAPHS:
            for arm, sets in RATE_ARMS:
                if graph == "matching" and sets["algo.alpha"] != 1.0:
                    continue  # no prediction to compare with; one matching arm is enough
                plan = graphs.plan({**base, **sets, "workers": n, "topology.name": graph})
                res = run_consensus(plan)
                rows.append(summary("rates", arm, res) | {"alpha": plan.topology.alpha,
                                                          "reference": reference(plan, res)})
                print(f"rates N={n} {graph} {arm}: {res.measured_rate} vs {res.predicted_rate}"
                      f" ({res.seconds:.1f} s)", file=sys.stderr)
    return rows


def loss_runs(graphs: Graphs, sizes) -> list[dict]:
    rows = []
    base = {"algo.local_steps": 10, "run.rounds": 200}
    for n in sizes:
        for graph in LOSS_GRAPHS:
            for arm, sets in LOSS_ARMS:
                res = run_consensus(graphs.plan({**base, **sets, "workers": n,
                                                 "topology.name": graph}))
                rows.append(summary("loss", arm, res))
        res = run_consensus(graphs.plan({**base, "workers": n, "algo.name": "diloco",
                                         "algo.outer_lr": 0.7, "algo.momentum": 0.9}))
        rows.append(summary("loss", "diloco eta 0.7, mu 0.9", res))
        print(f"loss N={n} done", file=sys.stderr)
    return rows


def num(v, fmt: str = ".4f") -> str:
    return "-" if v is None else format(v, fmt)


def predicted(r: dict) -> str:
    if r["predicted_rate"] is not None:
        return f"{r['predicted_rate']:.6f}"
    return "-" if r["reference"] is None else f"{r['reference']:.6f} (E[W])"


def rate_table(rows: list[dict]) -> str:
    lines = ["| N | graph | arm | λ₂ | γ | predicted rate | measured rate | "
             "consensus after 100 rounds | s |", "|" + " --- |" * 9]
    for r in rows:
        if r["part"] != "rates":
            continue
        lines.append(
            f"| {r['workers']} | {r['topology']} | {r['arm']} | {num(r['lambda2'], '.6f')} | "
            f"{r['gamma']:.3f} | {predicted(r)} | "
            f"{num(r['measured_rate'], '.6f')} | {r['consensus_at']['100']:.2e} | "
            f"{r['seconds']:.1f} |")
    return "\n".join(lines)


def loss_table(rows: list[dict]) -> str:
    lines = ["| N | graph | arm | η | γ | consensus (final) | f(x̄) − f* | mean f(xᵢ) − f* | s |",
             "|" + " --- |" * 9]
    for r in rows:
        if r["part"] != "loss":
            continue
        lines.append(
            f"| {r['workers']} | {r['topology']} | {r['arm']} | {r['eta']:.3f} | "
            f"{r['gamma']:.3f} | {r['final_consensus']:.3e} | {r['final_loss_gap']:.3e} | "
            f"{r['final_worker_gap']:.3e} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/results/consensus-scale.json")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="comma-separated worker counts")
    args = ap.parse_args()
    sizes = tuple(int(v) for v in args.sizes.split(","))
    started = time.perf_counter()
    graphs = Graphs()
    rows = rate_runs(graphs, sizes) + loss_runs(graphs, sizes)
    record = {
        "command": "PYTHONPATH=$PWD nice python benchmarks/consensus_scale.py --out "
                   f"{args.out}" + ("" if sizes == SIZES else f" --sizes {args.sizes}"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__},
        "seconds": time.perf_counter() - started,
        "settings": {"dim": 16, "rows": 32, "seed": 0, "surrogate_lr": 0.1,
                     "heterogeneity": 1.0},
        "runs": rows}
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=1)
    print(rate_table(rows))
    print()
    print(loss_table(rows))
    print(f"\n{len(rows)} runs in {record['seconds']:.0f} s; data: {args.out}")


if __name__ == "__main__":
    main()
