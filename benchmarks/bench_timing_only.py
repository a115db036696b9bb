"""``simulate --timing-only`` at growing worker counts: plan time, replay wall time, events/s,
peak memory, and for N <= 64 whether its times equal full ``simulate``'s to the float.

Each worker count runs in a fresh process (its peak RSS is its own): GASLoC on an expander
under the skewed profile with 20 ms latency (the TCP-aware link model), nominal steps of
``--step-time-s``. ``plan s`` is ``build_plan`` (graph, link plan, link model); ``wall s`` is
the timing simulation alone (the clock's replay, ``timing.play``); ``CPU s`` the process's CPU
time over both (the machine is shared: wall time is not the code's alone); ``events`` are the
steps handed to the clock (computes, sends, receives, rows). The goal (``--goal-workers``,
``--goal-s``, ``--goal-mb``: 4096 workers, plan + wall under 60 s, peak RSS under 2 GB) is
checked when its N is run, printed, and the exit status is 1 when it is not met. For
N <= ``--check-upto`` the same
settings with ``--check-rounds`` rounds are simulated in full as well, and ``equal`` says
whether every row's times, bytes and peers, every link's bytes and busy seconds and the
predicted wall-clock match exactly. Usage:

    python benchmarks/bench_timing_only.py                          # 8 .. 256 workers
    python benchmarks/bench_timing_only.py --workers 8 32 64 256 1024 4096
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator import timing

TIMED = ("time_s", "comm_s", "wait_s", "compute_s", "bytes_sent", "bytes_recv", "peers",
         "steps")


def settings(workers: int, rounds: int, step_s: float) -> dict:
    return {"workers": workers, "model.preset": "tiny", "algo.name": "gasloc",
            "topology.name": "expander", "net.bw_profile": "skewed", "net.latency_ms": 20.0,
            "compute.step_time_s": step_s, "run.rounds": rounds, "run.dashboard": "off",
            "data.eval_batches": 2, "data.max_corpus_mb": 2.0}


def _count_events(clock) -> list[int]:
    """Wrap the clock's source so the steps it hands over are counted."""
    source, count = clock.source, [0]

    def counted(lane):
        ops = source(lane)
        count[0] += len(ops or ())
        return ops
    clock.source = counted
    return count


def one(workers: int, rounds: int, step_s: float, check_rounds: int | None) -> dict:
    cfg = C.resolve(None, settings(workers, rounds, step_s))
    t0, c0 = time.perf_counter(), time.process_time()
    plan = build_plan(cfg, data=False)
    plan_s, plan_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    timing.check(plan)
    clock, _ = timing.timing_clock(plan)
    events = _count_events(clock)
    t0, c0 = time.perf_counter(), time.process_time()
    timing.play(clock)
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    assert clock.finished()
    out = {"workers": workers, "rounds": rounds, "plan_s": plan_s, "wall_s": wall_s,
           "cpu_s": plan_cpu_s + cpu_s, "events": events[0], "predicted_s": clock.now_s}
    if check_rounds is not None:
        out["equal"] = equal_to_simulate(workers, check_rounds, step_s)
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def equal_to_simulate(workers: int, rounds: int, step_s: float) -> bool:
    from gasloc_emu.simulator.simulate import simulate
    cfg = C.resolve(None, settings(workers, rounds, step_s) | {"algo.local_steps": 2})
    with tempfile.TemporaryDirectory() as tmp:
        full = simulate(build_plan(cfg), Path(tmp) / "full", device="cpu")
        timed = timing.simulate_timing(build_plan(cfg, data=False), Path(tmp) / "timed")
        rows = [_rows(Path(tmp) / name) for name in ("full", "timed")]
        links = [json.loads((Path(tmp) / name / "links.json").read_text())["links"]
                 for name in ("full", "timed")]
    same_rows = rows[0].keys() == rows[1].keys() and all(
        {f: r.get(f) for f in TIMED} == {f: rows[1][k].get(f) for f in TIMED}
        for k, r in rows[0].items())
    return same_rows and links[0] == links[1] and full.predicted_wall_s == timed.predicted_wall_s


def _rows(folder: Path) -> dict:
    return {(r["worker"], r["round"]): r
            for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 32, 64, 128, 256])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--step-time-s", type=float, default=0.05)
    ap.add_argument("--check-upto", type=int, default=64)
    ap.add_argument("--check-rounds", type=int, default=3)
    ap.add_argument("--goal-workers", type=int, default=4096,
                    help="the worker count the goal is for (checked when it is run)")
    ap.add_argument("--goal-s", type=float, default=60.0,
                    help="plan s + wall s the goal allows at --goal-workers")
    ap.add_argument("--goal-mb", type=float, default=2048.0,
                    help="peak RSS the goal allows at --goal-workers")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        check = args.check_rounds if args.one <= args.check_upto else None
        print(json.dumps(one(args.one, args.rounds, args.step_time_s, check)))
        return
    print("| N | rounds | plan s | wall s | plan + wall s | CPU s | events | events/s | "
          "peak RSS MB | equal to simulate |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    prev, goal = None, None
    for n in args.workers:
        cmd = [sys.executable, __file__, "--one", str(n), "--rounds", str(args.rounds),
               "--step-time-s", str(args.step_time_s), "--check-upto", str(args.check_upto),
               "--check-rounds", str(args.check_rounds)]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                      text=True).stdout.splitlines()[-1])
        growth = f" ({r['wall_s'] / prev:.1f}x)" if prev else ""
        prev = r["wall_s"]
        eq = {True: "yes", False: "NO"}.get(r.get("equal"), "-")
        total = r["plan_s"] + r["wall_s"]
        print(f"| {n} | {r['rounds']} | {r['plan_s']:.1f} | {r['wall_s']:.2f}{growth} | "
              f"{total:.1f} | {r['cpu_s']:.1f} | {r['events']} | "
              f"{r['events'] / r['wall_s']:.0f} | {r['rss_mb']:.0f} | {eq} |", flush=True)
        if n == args.goal_workers:
            goal = total < args.goal_s and r["rss_mb"] < args.goal_mb and r.get("equal", True)
            print(f"\ngoal: {n} workers x {r['rounds']} rounds in {total:.1f} s (plan + wall; "
                  f"< {args.goal_s:g} s) with {r['rss_mb']:.0f} MB peak RSS (< "
                  f"{args.goal_mb:g} MB): {'met' if goal else 'NOT met'}\n", flush=True)
    if goal is False:
        sys.exit(1)


if __name__ == "__main__":
    main()
