"""A2CiD2 in the emulator against its event simulator: seconds per step, exchanges, and how
often a worker found no free neighbour, with and without uneven links.

    python benchmarks/bench_a2cid2.py [--workers 8] [--steps 40] [--step-time-s 0.1]
                                      [--profiles uniform,lognormal]

Asynchronous pairwise gossip on a ring of ``--workers`` processes (``run``, userspace shaper)
and in ``simulate`` (events on the virtual clock), with nominal step times and links whose
median rate makes one model transfer as long as one step (the tiny model's 482 kB at
``8 * 482 kB / step``). For each profile: each one's seconds per step (the run clock at the end
over the steps), their ratio, the exchanges made, the steps that found no partner, the steps
that overran their nominal time in ``run``, and DSGD on the same ring and links for scale (its
rounds wait for both neighbours every step). The order of events, and so the losses, differ
between the two; the clock is what is compared.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench_compute import rows, seconds_per, sim_and_run, summary  # shared helpers

MODEL_BYTES = 482_304   # the tiny model's float32 parameters


def measure(tmp: Path, name: str, args: list[str], steps: int) -> dict:
    sim, run = sim_and_run(tmp, name, args)
    rec = summary(run).get("asynchronous") or {}
    return {"predicted": seconds_per(sim, steps), "measured": seconds_per(run, steps),
            "exchanges": rec.get("exchanges"), "unpaired": sum(rec.get("unpaired", [])),
            "overruns": sum(r["overruns"] for r in rows(run))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-time-s", type=float, default=0.1)
    ap.add_argument("--profiles", default="uniform,lognormal")
    a = ap.parse_args()
    rate = MODEL_BYTES * 8 / a.step_time_s / 1e6
    base = ["--workers", str(a.workers), "--model", "tiny", "--rounds", str(a.steps),
            "--topology", "ring", "--step-time-s", str(a.step_time_s), "--seed", "0",
            "--rate-mbit", f"{rate:.4f}", "--shaper", "userspace", "--eval-every", "0"]
    print(f"{a.workers} workers on a ring, {a.steps} steps of {a.step_time_s:.2f} s, links "
          f"{rate:.3f} Mbit/s (median): one transfer = one step\n")
    print("| profile | algo | measured s/step | predicted s/step | predicted/measured | "
          "exchanges | unpaired | overruns |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as d:
        for profile in a.profiles.split(","):
            for algo in ("a2cid2", "dsgd"):
                m = measure(Path(d), f"{profile}-{algo}",
                            [*base, "--bw-profile", profile, "--algo", algo], a.steps)
                print(f"| {profile} | {algo} | {m['measured']:.3f} | {m['predicted']:.3f} | "
                      f"{m['predicted'] / m['measured']:.3f} | {m['exchanges'] or '-'} | "
                      f"{m['unpaired'] if m['exchanges'] else '-'} | {m['overruns']} |",
                      flush=True)


if __name__ == "__main__":
    main()
