"""Emulator overheads and the simulator's wall-clock prediction, measured side by side.

    python benchmarks/bench_emulator.py [--quick]

Table 1: GASLoC with the `small` model on 4 processes over loopback (unshaped): mean round time
against the mean pure compute time of the same inner steps; communication overhead is the rest
(target: at most 10 % of the round).
Table 2: the same config in the simulator (virtual clock, with the bandwidth profile) and in the
emulator (real processes over shaped links): the simulator's predicted run clock at the end of
the last round against the emulator's measured one (target: within 15 %).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from itertools import pairwise
from pathlib import Path


def cli(*args: str) -> None:
    res = subprocess.run([sys.executable, "-m", "gasloc_emu", *args, "--no-dashboard"],
                         capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"gasloc-emu {' '.join(args)} failed:\n{res.stderr}")


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def round_ends(run_dir: Path) -> list[float]:
    ends: dict[int, float] = {}
    for r in rows(run_dir):
        ends[r["round"]] = max(ends.get(r["round"], 0.0), r["time_s"])
    return [ends[k] for k in sorted(ends)]


def overhead_table(tmp: Path, rounds: int) -> None:
    out = tmp / "loopback"
    cli("run", "--algo", "gasloc", "--topology", "ring", "--workers", "4", "--model", "small",
        "--local-steps", "10", "--rounds", str(rounds), "--out", str(out))
    ends = round_ends(out)
    round_s = statistics.mean(b - a for a, b in pairwise(ends))  # skips round 0's warm-up
    compute_s = statistics.mean(r["compute_s"] for r in rows(out) if r["round"] > 0)
    comm_s = statistics.mean(r["comm_s"] for r in rows(out) if r["round"] > 0)
    print("Table 1: gasloc, small model (1.04M params, 4.2 MB messages), 4 processes, loopback, "
          "H = 10")
    print(f"{'round s':>10} {'compute s':>10} {'comm s':>10} {'overhead of round':>18}")
    print(f"{round_s:10.3f} {compute_s:10.3f} {comm_s:10.3f} "
          f"{(round_s - compute_s) / round_s:17.1%}")
    print()


def prediction_table(tmp: Path, rounds: int) -> None:
    print("Table 2: simulator's predicted run clock vs the emulator's, profile skewed "
          "(50 / 5 Mbit/s), 8 workers, tiny model, H = 5")
    print(f"{'arm':>16} {'predicted s':>12} {'measured s':>11} {'ratio':>7}")
    for name, algo in {"gasloc-matching": ["--algo", "gasloc", "--topology", "matching"],
                       "gasloc-expander": ["--algo", "gasloc", "--topology", "expander"],
                       "diloco": ["--algo", "diloco"]}.items():
        common = [*algo, "--workers", "8", "--model", "tiny", "--local-steps", "5", "--rounds",
                  str(rounds), "--bw-profile", "skewed", "--seed", "0"]
        cli("simulate", *common, "--out", str(tmp / f"{name}-sim"))
        cli("run", *common, "--no-probe", "--out", str(tmp / f"{name}-run"))
        pred = round_ends(tmp / f"{name}-sim")[-1]
        meas = round_ends(tmp / f"{name}-run")[-1]
        print(f"{name:>16} {pred:12.2f} {meas:11.2f} {pred / meas:7.3f}")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    args = ap.parse_args()
    rounds = 4 if args.quick else 10
    with tempfile.TemporaryDirectory() as tmp:
        overhead_table(Path(tmp), rounds)
        prediction_table(Path(tmp), rounds)


if __name__ == "__main__":
    main()
