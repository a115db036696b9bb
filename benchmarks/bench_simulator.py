"""Simulator overhead: inner steps per second of ``simulate`` against a plain AdamW loop.

For each configuration the simulator runs N workers x R rounds x H inner steps; the plain loop is
one model, one AdamW optimizer, the same batch size, gradient clipping and total number of steps
(N x R x H) in a single process. Both build their model(s) inside the timed region and both end
with an evaluation (the simulator evaluates every worker and the average model, as every run
record does; the plain loop evaluates its one model), on the same shared evaluation batches.

Runs alternate plain / simulator and repeat; the table shows medians of wall-clock time (steps/s
and overhead) and of this process's CPU time, which other programs on a shared machine disturb
far less than wall-clock time. Usage:

    python benchmarks/bench_simulator.py                 # small and tiny, H = 10, 3 repeats
    python benchmarks/bench_simulator.py --repeats 5 --presets small --threads 2
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.simulate import simulate
from gasloc_emu.training import data, model
from gasloc_emu.training.data import build_corpus
from gasloc_emu.training.worker import make_optimizer


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads) since ``t0``."""
    wall, cpu = _now()
    return wall - t0[0], cpu - t0[1]


def plain_loop(cfg: C.Config, corpus: data.Corpus, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds for ``steps`` AdamW steps on one model (the simulator's inner step)."""
    t0 = _now()
    net, _ = model.build_model(cfg.model, cfg.seed)
    opt = make_optimizer(net, cfg.algo.inner)
    shard = corpus.shard(0)
    clip = cfg.algo.inner.grad_clip
    losses = []
    for _ in range(steps):
        x, y = shard.batch()
        _, loss = net(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        losses.append(loss.detach())
    torch.stack(losses).mean().item()
    data.evaluate(net, corpus.eval_batches())
    return _since(t0)


def sim_run(cfg: C.Config, corpus: data.Corpus) -> tuple[float, float, float]:
    """(wall, CPU) seconds of the whole simulate call, and the CPU seconds of N evaluations.

    The last number is what the simulator's summary adds over the plain loop's one evaluation
    (every worker's model is evaluated, plus the average), timed separately on the side.
    """
    with tempfile.TemporaryDirectory() as tmp:
        t0 = _now()
        simulate(build_plan(cfg, corpus=corpus), Path(tmp) / "run")
        wall, cpu = _since(t0)
    net, _ = model.build_model(cfg.model, cfg.seed)
    batches = corpus.eval_batches()
    t1 = _now()
    for _ in range(cfg.workers):
        data.evaluate(net, batches)
    return wall, cpu, _since(t1)[1]


def bench(preset: str, workers: int, rounds: int, h: int, repeats: int, threads: int) -> dict:
    # run.threads_per_worker: the simulator sets torch's thread count to it for its workers;
    # the plain loop runs with the same count (set in main), so both sides compute alike
    cfg = C.resolve(overrides={"model.preset": preset, "workers": workers, "run.rounds": rounds,
                               "algo.local_steps": h, "run.dashboard": "off",
                               "topology.name": "ring", "algo.name": "gasloc",
                               "run.threads_per_worker": threads})
    corpus = build_corpus(cfg)
    steps = workers * rounds * h
    plain_loop(cfg, corpus, 5)  # warm up allocator and kernels once
    plain, sim, extra = [], [], []
    for k in range(repeats):
        order = ("plain", "sim") if k % 2 == 0 else ("sim", "plain")
        for which in order:
            if which == "plain":
                plain.append(plain_loop(cfg, corpus, steps))
            else:
                wall, cpu, ev = sim_run(cfg, corpus)
                sim.append((wall, cpu))
                extra.append(ev)
    med = statistics.median
    pw, pc = med(w for w, _ in plain), med(c for _, c in plain)
    sw, sc = med(w for w, _ in sim), med(c for _, c in sim)
    return {
        "config": f"{preset} N={workers} H={h} R={rounds} ({steps} steps)",
        "plain": steps / pw, "sim": steps / sw, "overhead": 100.0 * (sw / pw - 1.0),
        "overhead_cpu": 100.0 * (sc / pc - 1.0),
        # CPU time, without the N extra evaluations the simulator's summary adds
        "overhead_cpu_no_eval": 100.0 * ((sc - med(extra)) / pc - 1.0),
        "plain_s": plain, "sim_s": sim,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="small,tiny")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads, the same for both sides. With more than one on "
                         "a busy machine, OpenMP spin-waiting makes timings erratic, and far "
                         "worse on the main thread (the plain loop) than on worker threads.")
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} alternating runs", flush=True)
    rows = []
    for preset in args.presets.split(","):
        rows.append(bench(preset.strip(), args.workers, args.rounds, args.local_steps,
                          args.repeats, args.threads))
        r = rows[-1]
        fmt = lambda runs: " ".join(f"{w:.1f}/{c:.1f}" for w, c in runs)  # noqa: E731
        print(f"  {r['config']}: wall/CPU s, plain {fmt(r['plain_s'])}; "
              f"simulator {fmt(r['sim_s'])}", flush=True)
    cols = ["config", "plain steps/s", "simulator steps/s", "overhead % (wall)",
            "overhead % (CPU)", "CPU, excl. extra evals %"]
    widths = [max(len(c), 34) if i == 0 else len(c) for i, c in enumerate(cols)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        vals = [r["config"], f"{r['plain']:.1f}", f"{r['sim']:.1f}", f"{r['overhead']:+.1f}",
                f"{r['overhead_cpu']:+.1f}", f"{r['overhead_cpu_no_eval']:+.1f}"]
        print("| " + " | ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                for i, (v, w) in enumerate(zip(vals, widths, strict=True))) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
