"""The inner recipe measured on one worker of the tiny model (CPU): gradient accumulation against
one big batch, and fp32 against bf16 autocast after N steps (held-out loss and tokens/s).

Accumulation: the same 4 * B sequences as one batch and as 4 micro batches of B; the largest
absolute difference of the two gradients (gradient clipping off), against the largest gradient.
Precision: the same seed, data order and steps in fp32 and in bf16; the eval loss on the corpus's
held-out batches (evaluated in fp32) and tokens per second of the steps (wall clock; a shared
host makes these noisy, so take the median of --repeats runs).
Usage:

    python benchmarks/bench_recipe.py                  # 200 steps, batch 8
    python benchmarks/bench_recipe.py --steps 500 --repeats 3
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.memory import Hub
from gasloc_emu.training.data import evaluate
from gasloc_emu.training.worker import Worker

BASE = {"workers": 1, "data.max_corpus_mb": 1.0, "data.eval_batches": 4, "run.rounds": 1,
        "algo.local_steps": 1, "algo.name": "diloco", "algo.inner.grad_clip": 0.0}


def worker(**over) -> Worker:
    return Worker(build_plan(C.resolve(overrides=BASE | over)), 0, Hub(1).transport(0))


class Fixed:
    """Slices of one fixed batch, in order: the same sequences for both ways of stepping."""

    def __init__(self, x, y, size):
        self.x, self.y, self.size, self.at = x, y, size, 0

    def batch(self, device="cpu"):
        lo, self.at = self.at, self.at + self.size
        return self.x[lo:self.at], self.y[lo:self.at]


def grad(w: Worker) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in w.gpt.parameters()])


def accumulation(batch: int) -> tuple[float, float]:
    w = worker(**{"data.batch_size": batch})
    x, y = (torch.cat(t) for t in zip(*[w.shard.batch() for _ in range(4)], strict=True))
    big = worker(**{"data.batch_size": 4 * batch})
    big.shard = Fixed(x, y, 4 * batch)
    big.gradient()
    acc = worker(**{"data.batch_size": batch, "algo.inner.micro_batches": 4})
    acc.shard = Fixed(x, y, batch)
    acc.gradient()
    return float((grad(acc) - grad(big)).abs().max()), float(grad(big).abs().max())


def precision(name: str, steps: int, batch: int) -> tuple[float, float]:
    w = worker(**{"algo.inner.precision": name, "algo.inner.grad_clip": 1.0,
                  "data.batch_size": batch})
    t0 = time.perf_counter()
    for _ in range(steps):
        w.train_step()
    dt = time.perf_counter() - t0
    return evaluate(w.gpt, w.eval_set), steps * w.tokens_per_step / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    err, top = accumulation(args.batch)
    print(f"accumulation 4 x {args.batch} vs {4 * args.batch}: max |grad diff| {err:.3g} "
          f"(max |grad| {top:.3g}, relative {err / top:.2g})")
    for name in ("fp32", "bf16"):
        runs = [precision(name, args.steps, args.batch) for _ in range(args.repeats)]
        loss = runs[0][0]
        tps = statistics.median(r[1] for r in runs)
        print(f"{name}: eval loss after {args.steps} steps {loss:.6f}, {tps:,.0f} tokens/s "
              f"(median of {args.repeats})")


if __name__ == "__main__":
    main()
