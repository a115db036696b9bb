"""GASLoC, DiLoCo (ring All-Reduce) and DSGD from 8 to 4096 workers on one measured WAN
placement: round time from ``simulate --timing-only``, rounds to a target from the consensus
surrogate, and their product, time to target.

The placement: the eight AWS regions of the ``aws8`` preset (``netem/cloud.py``), N / 8 workers
in each, in blocks (workers 0 .. N/8 - 1 in the first region, ...), every link at the
single-stream goodput and half the RTT measured between its regions (``--bw-profile cloud
--cloud-rate single-stream``; ``netem/data/cloud_regions.json``, from ../shared/data/wan/), two
workers of one region on that region's row or the same-region fill.

- Round time: ``simulate --timing-only``'s clock (``gasloc_emu.simulator.timing``: the same
  clock and link model as ``simulate``, no training) for ``--rounds`` rounds (``--diloco-rounds``
  for DiLoCo, whose ring sends 2 (N - 1) messages per worker and round), a GPT-2-shaped model
  (``--preset``, its float32 values on the wire) and nominal steps of ``--step-time-s``; the
  round time is the predicted wall-clock over the rounds. GASLoC and DiLoCo take
  ``--local-steps`` steps a round, DSGD one. GASLoC and DSGD gossip on a 4-regular expander.
- Rounds to target: the consensus surrogate (``gasloc-emu consensus``,
  ``gasloc_emu/experiments/consensus.py``) with the same N, graph, algorithm and H: the first
  round whose f(xbar) - f* is at most each of ``--targets`` of round 0's (1 % and 0.1 %: the
  second is below where GASLoC's and DiLoCo's ten local steps leave the average, a floor the
  workers' heterogeneity sets, and above DSGD's), on its heterogeneous quadratics
  (d = 16, lr 0.1, heterogeneity 1, seed 0). The target is the surrogate's, not a GPT's loss.
  GASLoC at outer lr 0.7 and momentum 0 (the default 0.9 is past gamma* on these expanders:
  the plan warns it unstable), DiLoCo at 0.7 and 0.9.

Each (algorithm, N) runs in a fresh process. Usage:

    PYTHONPATH=$PWD nice python benchmarks/scale_wan.py --out docs/results/scale-wan.json

``--merge FILE`` runs only the rows asked for (``--workers``, ``--algorithms``) and merges them
into a data file this script wrote with the same settings: a row of the same algorithm and N is
replaced, the others kept; the file records each merge's command, machine and seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gasloc_emu import config as C  # noqa: E402
from gasloc_emu.netplan import describe_link_model  # noqa: E402
from gasloc_emu.plan import build_plan  # noqa: E402
from netem.cloud import PRESETS  # noqa: E402

ALGORITHMS = {
    "gasloc": {"algo.name": "gasloc", "topology.name": "expander", "algo.outer_lr": 0.7,
               "algo.momentum": 0.0},
    "diloco": {"algo.name": "diloco", "algo.outer_lr": 0.7, "algo.momentum": 0.9},
    "dsgd": {"algo.name": "dsgd", "topology.name": "expander", "algo.local_steps": 1},
}
REGIONS = PRESETS["aws8"]


def placement(workers: int) -> str:
    if workers % len(REGIONS):
        raise SystemExit(f"--workers {workers}: a multiple of {len(REGIONS)} (one block of "
                         "workers per region)")
    return ",".join(f"{r}*{workers // len(REGIONS)}" for r in REGIONS)


def settings(algo: str, workers: int, args, rounds: int) -> dict:
    sets = {"workers": workers, "model.preset": args.preset, "net.bw_profile": "cloud",
            "net.placement": placement(workers), "net.cloud_rate": "single-stream",
            "compute.step_time_s": args.step_time_s, "algo.local_steps": args.local_steps,
            "run.rounds": rounds, "run.dashboard": "off", "data.eval_batches": 2}
    return sets | ALGORITHMS[algo]


def round_time(algo: str, workers: int, args) -> dict:
    from gasloc_emu.simulator import timing
    rounds = args.diloco_rounds if algo == "diloco" else args.rounds
    t0 = time.perf_counter()
    plan = build_plan(C.resolve(None, settings(algo, workers, args, rounds)), data=False)
    timing.check(plan)
    clock, _ = timing.timing_clock(plan)
    timing.play(clock)
    assert clock.finished()
    return {"timing_rounds": rounds, "round_s": clock.now_s / rounds,
            "link_model": describe_link_model(plan.link_model),
            "timing_wall_s": time.perf_counter() - t0}


def rounds_to_targets(algo: str, workers: int, args) -> dict:
    from gasloc_emu.experiments.consensus import run_consensus
    cfg = C.resolve(None, settings(algo, workers, args, args.surrogate_rounds))
    res = run_consensus(build_plan(cfg, data=False))
    hits = {str(target): next((t for t, gap in enumerate(res.loss_gap)
                               if gap <= target * res.loss_gap[0]), None)
            for target in args.targets}
    return {"rounds_to_target": hits, "gap_0": res.loss_gap[0],
            "gap_final": res.loss_gap[-1], "surrogate_rounds": args.surrogate_rounds,
            "surrogate_s": res.seconds}


def one(algo: str, workers: int, args) -> dict:
    out = {"algorithm": algo, "workers": workers} | round_time(algo, workers, args) \
        | rounds_to_targets(algo, workers, args)
    out["time_to_target_s"] = {k: None if hit is None else hit * out["round_s"]
                               for k, hit in out["rounds_to_target"].items()}
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def pct(target: float) -> str:
    return f"{target * 100:g} %"


def table(rows: list[dict], args) -> str:
    head = ["N", "algorithm", "round s (timing-only)"]
    for target in args.targets:
        head += [f"rounds to {pct(target)} (surrogate)", f"time to {pct(target)} s"]
    head.append(f"gap at round {args.surrogate_rounds} / round 0")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['workers']} | {r['algorithm']} | not run ({r['skipped']}) |"
                         + " - |" * (2 * len(args.targets) + 1))
            continue
        cells = [str(r["workers"]), r["algorithm"], f"{r['round_s']:.2f}"]
        for target in args.targets:
            key = str(target)
            cells += [fmt(r["rounds_to_target"][key], "d"),
                      fmt(r["time_to_target_s"][key], ".0f")]
        cells.append(f"{r['gap_final'] / r['gap_0']:.1e}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fastest(rows: list[dict], key: str) -> dict[int, str]:
    """Per N, the algorithm that reaches the target first (of those that reach it)."""
    best: dict[int, tuple[float, str]] = {}
    for r in rows:
        t = None if r.get("skipped") else r["time_to_target_s"][key]
        if t is not None and (r["workers"] not in best or t < best[r["workers"]][0]):
            best[r["workers"]] = (t, r["algorithm"])
    return {n: algo for n, (_, algo) in sorted(best.items())}


def round_leader(rows: list[dict]) -> str:
    """GASLoC's round time against DiLoCo's, N by N."""
    by = {(r["workers"], r["algorithm"]): r["round_s"] for r in rows if not r.get("skipped")}
    ns = sorted({n for n, a in by if a == "diloco" and (n, "gasloc") in by})
    parts = [f"{n}: DiLoCo {by[(n, 'diloco')] / by[(n, 'gasloc')]:.2f}x GASLoC's" for n in ns]
    return "round time, DiLoCo against GASLoC (N: ratio): " + ", ".join(parts) + "."


def summary(rows: list[dict], args) -> str:
    lines = [round_leader(rows)]
    unrun: dict[int, list[str]] = {}
    for r in rows:
        if r.get("skipped"):
            unrun.setdefault(r["workers"], []).append(r["algorithm"])
    for target in args.targets:
        best = fastest(rows, str(target))
        lines.append(f"first to {pct(target)} of round 0's gap: "
                     + ", ".join(f"N = {n}: {algo}"
                                 + (f" ({', '.join(unrun[n])} not run)" if n in unrun else "")
                                 for n, algo in best.items())
                     + (f"; none reaches it at N = "
                        f"{', '.join(str(n) for n in args.workers if n not in best)}"
                        if any(n not in best for n in args.workers) else "") + ".")
    return "\n".join(lines)


# the settings a merged row must share with the data file's (the rest say which rows run)
SHARED = ("preset", "step_time_s", "local_steps", "rounds", "diloco_rounds", "surrogate_rounds",
          "targets")


def check_mergeable(settings: dict, args) -> None:
    """Exit naming each setting of ``args`` that differs from the data file's."""
    differ = [f"--{k.replace('_', '-')} {getattr(args, k)!r} (the file's: {settings[k]!r})"
              for k in SHARED if getattr(args, k) != settings[k]]
    if differ:
        raise SystemExit(f"--merge {args.merge}: its rows were run with other settings: "
                         + "; ".join(differ))


def merged(record: dict, rows: list[dict], args, run: dict) -> dict:
    """``record`` (a data file) with ``rows`` in place of its rows of the same algorithm and N,
    the rows in order of N then ``ALGORITHMS``, its table made again, and ``run`` (this merge's
    command, machine, seconds and rows) added to its ``merges``."""
    new = {(r["algorithm"], r["workers"]): r for r in rows}
    runs = [r for r in record["runs"] if (r["algorithm"], r["workers"]) not in new] + rows
    order = list(ALGORITHMS)
    runs.sort(key=lambda r: (r["workers"], order.index(r["algorithm"])))
    settings = dict(record["settings"])
    settings["workers"] = sorted({r["workers"] for r in runs})
    settings["algorithms"] = [a for a in order if any(r["algorithm"] == a for r in runs)]
    # the largest N whose DiLoCo row was run (those not run say so in their row)
    settings["diloco_upto"] = max((r["workers"] for r in runs
                                   if r["algorithm"] == "diloco" and not r.get("skipped")),
                                  default=0)
    kept = argparse.Namespace(**settings)
    return record | {"settings": settings, "runs": runs,
                     "merges": record.get("merges", []) + [run],
                     "table": table(runs, kept) + "\n\n" + summary(runs, kept)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+",
                    default=[8, 32, 128, 512, 1024, 2048, 4096])
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS),
                    choices=list(ALGORITHMS))
    ap.add_argument("--preset", default="gpt2")
    ap.add_argument("--step-time-s", type=float, default=0.3)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--diloco-rounds", type=int, default=2)
    ap.add_argument("--diloco-upto", type=int, default=4096,
                    help="DiLoCo's timing beyond this N is not run (its ring's 2 (N - 1) "
                         "messages per worker and round)")
    ap.add_argument("--surrogate-rounds", type=int, default=400)
    ap.add_argument("--targets", type=float, nargs="+", default=[0.01, 0.001],
                    help="targets on f(xbar) - f*, as shares of round 0's")
    ap.add_argument("--out", default="")
    ap.add_argument("--print-from", default="",
                    help="print the table of a data file this script wrote, run nothing")
    ap.add_argument("--merge", default="",
                    help="run only the rows asked for and merge them into this data file "
                         "(written by this script with the same settings), replacing rows of "
                         "the same algorithm and N")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one[0], int(args.one[1]), args)))
        return
    if args.print_from:
        with open(args.print_from) as fh:
            record = json.load(fh)
        kept = argparse.Namespace(**record["settings"])
        print(table(record["runs"], kept) + "\n\n" + summary(record["runs"], kept))
        return
    kept = None
    if args.merge:
        with open(args.merge) as fh:
            kept = json.load(fh)
        check_mergeable(kept["settings"], args)
    rows, started = [], time.perf_counter()
    passed = [a for a in sys.argv[1:]]
    for n in args.workers:
        placement(n)
        for algo in args.algorithms:
            if algo == "diloco" and n > args.diloco_upto:
                rows.append({"algorithm": algo, "workers": n,
                             "skipped": f"--diloco-upto {args.diloco_upto}"})
                continue
            cmd = [sys.executable, os.path.abspath(__file__), *passed, "--one", algo, str(n)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            rows.append(json.loads(done.stdout.splitlines()[-1]))
            print(f"{algo} N={n}: {rows[-1]['round_s']:.2f} s a round, "
                  f"{rows[-1]['rounds_to_target']} rounds", file=sys.stderr, flush=True)
    command = "PYTHONPATH=$PWD nice python benchmarks/scale_wan.py " + " ".join(passed)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, "
               f"Python {platform.python_version()}")
    if kept is not None:
        record = merged(kept, rows, args, {"command": command, "machine": machine,
                                           "seconds": time.perf_counter() - started,
                                           "rows": [f"{r['algorithm']} {r['workers']}"
                                                    for r in rows]})
        with open(args.merge, "w") as fh:
            json.dump(record, fh, indent=1)
        print(record["table"])
        return
    text = table(rows, args) + "\n\n" + summary(rows, args)
    print(text)
    if args.out:
        record = {"command": command, "machine": machine,
                  "seconds": time.perf_counter() - started,
                  "placement": "aws8 regions, N / 8 workers each, in blocks; single-stream",
                  "targets": [f"f(xbar) - f* <= {t:g} x round 0's, consensus surrogate"
                              for t in args.targets],
                  "settings": {k: v for k, v in vars(args).items()
                               if k not in ("one", "out", "print_from")},
                  "runs": rows, "table": text}
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=1)


if __name__ == "__main__":
    main()
