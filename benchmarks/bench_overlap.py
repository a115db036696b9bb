"""Overlap against the compute floor, measured in the emulator and predicted by the simulator.

    python benchmarks/bench_overlap.py [--workers 8] [--rounds 5] [--step-time-s 0.3]
                                       [--profiles uniform,skewed]

GASLoC on one-peer matchings and DiLoCo, each sequential (``--overlap 0``) and overlapped
(``--overlap 1``), on shaped links whose rate makes one model transfer as long as one round's
compute (10 nominal steps; the tiny model's 482 kB at ``rate = 8 * 482 kB / (10 * step)``),
with the skewed profile's slow links 5x slower. For each: seconds per round measured by
``run`` (its run clock at the end of the last round, over the rounds) and predicted by
``simulate`` (the same on its virtual clock), their ratio, the ratio to the compute floor (10
steps), and the inner steps that overran their nominal time (a step time too short for this
host shows there first). ``run`` uses the userspace shaper, so it needs no privileges.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench_compute import rows, seconds_per, sim_and_run  # shared subprocess and readers

MODEL_BYTES = 482_304   # the tiny model's float32 parameters
ARMS = {"gasloc-matching": ["--algo", "gasloc", "--topology", "matching"],
        "diloco": ["--algo", "diloco"]}


def measure(tmp: Path, name: str, args: list[str], rounds: int) -> dict:
    sim, run = sim_and_run(tmp, name, args)
    return {"predicted": seconds_per(sim, rounds), "measured": seconds_per(run, rounds),
            "overruns": sum(r["overruns"] for r in rows(run))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--step-time-s", type=float, default=0.3)
    ap.add_argument("--profiles", default="uniform,skewed")
    a = ap.parse_args()
    compute_s = 10 * a.step_time_s
    rate = MODEL_BYTES * 8 / compute_s / 1e6
    base = ["--workers", str(a.workers), "--model", "tiny", "--rounds", str(a.rounds),
            "--local-steps", "10", "--step-time-s", str(a.step_time_s), "--seed", "0",
            "--rate-mbit", f"{rate:.4f}", "--shaper", "userspace",
            "--set", f"net.slow_rate_mbit={rate / 5:.4f}"]
    print(f"{a.workers} workers, {a.rounds} rounds, compute floor {compute_s:.2f} s a round, "
          f"links {rate:.3f} Mbit/s (slow {rate / 5:.3f}): one transfer = one round's compute\n")
    print("| profile | arm | overlap | measured s/round | predicted s/round | predicted/measured "
          "| measured/floor | overruns |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as d:
        for profile in a.profiles.split(","):
            for arm, args in ARMS.items():
                for overlap in (0, 1):
                    name = f"{profile}-{arm}-{overlap}"
                    m = measure(Path(d), name, [*base, "--bw-profile", profile, *args,
                                                "--overlap", str(overlap)], a.rounds)
                    print(f"| {profile} | {arm} | {overlap} | {m['measured']:.2f} | "
                          f"{m['predicted']:.2f} | {m['predicted'] / m['measured']:.3f} | "
                          f"{m['measured'] / compute_s:.2f} | {m['overruns']} |", flush=True)


if __name__ == "__main__":
    main()
