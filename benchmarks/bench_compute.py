"""The compute model's prediction against the emulator: uniform, straggler and lognormal speeds.

    python benchmarks/bench_compute.py [--step-time-s 0.1] [--workers 4] [--inner-budget-s T]

One fixed configuration (4 workers by default, tiny model, H = 5, 3 rounds, nominal step time,
links at 1 Gbit/s; with a budget, steps per worker come from it) under three compute profiles,
for GASLoC on matchings and for DiLoCo. For each: the
simulator's predicted wall-clock (its virtual clock at the end of the last round), the
emulator's measured one (its run clock at the end of the last round, and its whole wall_s up to
the final evaluation), their ratio, and the inner steps that overran their nominal time in the
emulator (a step time too short for this host shows there first), and whether every worker took
the same inner steps in every round in both (the "steps" column).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

PROFILES = ("uniform", "straggler", "lognormal")
ALGOS = {"gasloc-matching": ["--algo", "gasloc", "--topology", "matching"],
         "diloco": ["--algo", "diloco"]}


def cli(*args: str) -> None:
    res = subprocess.run([sys.executable, "-m", "gasloc_emu", *args, "--no-dashboard"],
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"gasloc-emu {' '.join(args)} failed:\n{res.stderr}")


def sim_and_run(tmp: Path, name: str, args: list[str]) -> tuple[Path, Path]:
    """The same flags through ``simulate`` and ``run`` (no probe); their record folders."""
    sim, run = tmp / f"{name}-sim", tmp / f"{name}-run"
    cli("simulate", *args, "--out", str(sim))
    cli("run", *args, "--no-probe", "--out", str(run))
    return sim, run


def seconds_per(run_dir: Path, count: int) -> float:
    """The run clock at the last row's end over ``count`` rounds (or steps)."""
    return max(r["time_s"] for r in rows(run_dir)) / count


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def steps(run_dir: Path) -> dict[tuple[int, int], int]:
    """Inner steps per (round, worker)."""
    return {(r["round"], r["worker"]): r["steps"] for r in rows(run_dir)}


def last_round_end(run_dir: Path) -> float:
    return max(r["time_s"] for r in rows(run_dir))


def measure(tmp: Path, name: str, args: list[str]) -> dict:
    """Simulate and run one configuration; predicted and measured seconds, overruns."""
    sim, run = tmp / f"{name}-sim", tmp / f"{name}-run"
    cli("simulate", *args, "--out", str(sim))
    cli("run", *args, "--no-probe", "--out", str(run))
    return {"predicted": summary(sim)["predicted_wall_s"], "clock": last_round_end(run),
            "same_steps": steps(sim) == steps(run),
            "wall": summary(run)["wall_s"], "overruns": sum(r["overruns"] for r in rows(run)),
            "speeds": summary(sim)["compute"]["speeds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-time-s", type=float, default=0.1,
                    help="nominal step time at speed 1 (default 0.1)")
    ap.add_argument("--workers", type=int, default=4, help="workers (default 4)")
    ap.add_argument("--inner-budget-s", type=float, default=0.0,
                    help="compute seconds per round (default 0: H = 5 steps)")
    args = ap.parse_args()
    step, n, budget = args.step_time_s, args.workers, args.inner_budget_s
    common = ["--workers", str(n), "--model", "tiny", "--local-steps", "5", "--rounds", "3",
              "--seed", "0", "--step-time-s", str(step), "--inner-budget-s", str(budget),
              "--bw-profile", "uniform", "--rate-mbit", "1000", "--set", "data.max_corpus_mb=1"]
    steps_text = f"a budget of {budget:g} s" if budget else "H = 5"
    print(f"{n} workers, tiny model, {steps_text}, 3 rounds, step {step:g} s at speed 1, links "
          "1 Gbit/s; predicted = simulate's virtual clock, measured = run's clock at the last "
          "round")
    print(f"{'arm':>16} {'profile':>10} {'speeds':>{5 * n}} {'predicted s':>12} "
          f"{'measured s':>11} {'ratio':>6} {'wall_s':>7} {'overruns':>9} {'steps':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for arm, algo in ALGOS.items():
            for profile in PROFILES:
                m = measure(Path(tmp), f"{arm}-{profile}",
                            [*common, *algo, "--compute-profile", profile])
                speeds = " ".join(f"{v:.2f}" for v in m["speeds"])
                same = "same" if m["same_steps"] else "DIFFER"
                print(f"{arm:>16} {profile:>10} {speeds:>{5 * n}} {m['predicted']:12.2f} "
                      f"{m['clock']:11.2f} {m['clock'] / m['predicted']:6.3f} {m['wall']:7.2f} "
                      f"{m['overruns']:9d} {same:>6}", flush=True)


if __name__ == "__main__":
    main()
