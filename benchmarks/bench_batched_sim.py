"""The batched simulator against the per-worker one: wall time of the same run, side by side.

For each worker count the same configuration (the tiny model, R rounds of H inner steps, one
shared corpus built outside the timed region) is simulated with ``sim.batched = false`` (the
per-worker reference: one worker computes at a time, with the emulator's thread count) and
``sim.batched = true`` (every worker's inner steps of a round as one computation on all
cores), alternately, several times. The table shows the median wall time of each path, their
ratio, and the largest relative difference in final eval loss between the paths. Usage:

    python benchmarks/bench_batched_sim.py                       # 8 and 32 workers, 3 repeats
    python benchmarks/bench_batched_sim.py --workers 8 --algo diloco --rounds 10 --repeats 5
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.simulate import simulate
from gasloc_emu.training.data import build_corpus


def settings(args, workers: int, batched: bool) -> dict:
    return {"model.preset": args.model, "workers": workers, "algo.name": args.algo,
            "run.rounds": args.rounds, "algo.local_steps": args.local_steps,
            "data.eval_batches": 2, "data.max_corpus_mb": 2.0, "run.dashboard": "off",
            "sim.batched": batched, "seed": 1}


def timed_run(args, workers: int, batched: bool, corpus) -> tuple[float, float]:
    """(wall seconds, final eval loss) of one simulate run."""
    cfg = C.resolve(overrides=settings(args, workers, batched))
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        summary = simulate(build_plan(cfg, corpus=corpus), out)
        return time.perf_counter() - t0, summary["final_eval_loss"]


def measure(args, workers: int) -> dict:
    corpus = build_corpus(C.resolve(overrides=settings(args, workers, False)))
    walls = {False: [], True: []}
    losses = {False: [], True: []}
    for _ in range(args.repeats):
        for batched in (False, True):
            wall, loss = timed_run(args, workers, batched, corpus)
            walls[batched].append(wall)
            losses[batched].append(loss)
    diff = max(abs(b - a) / abs(a) for a, b in zip(losses[False], losses[True], strict=True))
    ref, got = statistics.median(walls[False]), statistics.median(walls[True])
    return {"workers": workers, "ref_s": ref, "batched_s": got, "ratio": ref / got,
            "rel_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--algo", default="gasloc")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{args.model}, {args.algo}, {args.rounds} rounds x H={args.local_steps}, "
          f"{os.cpu_count()} cores, median of {args.repeats}")
    print(f"{'workers':>7}  {'per-worker s':>12}  {'batched s':>9}  {'speed-up':>8}  "
          f"{'max rel diff':>12}")
    for n in args.workers:
        r = measure(args, n)
        print(f"{r['workers']:>7}  {r['ref_s']:>12.2f}  {r['batched_s']:>9.2f}  "
              f"{r['ratio']:>7.2f}x  {r['rel_diff']:>12.1e}")


if __name__ == "__main__":
    main()
