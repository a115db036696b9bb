"""How fast a run starts: from `gasloc-emu run` to every worker ready, and to every worker's
first step, for several worker counts.

Each run is the tiny model, one round of one nominal step (0.05 s), unshaped, no dashboard: all
it measures is the start. "ready" is when the last worker said ready (workers.json is written
then, just before the start); "first step" adds the latest worker's first round row (its one
step and the exchange after it, on the run's clock). Workers are forked from a zygote that has
imported torch (``emulator.zygote``); each run is repeated and the median printed. Usage:

    python benchmarks/bench_start.py                     # 8, 32 and 64 workers, 2 repeats
    python benchmarks/bench_start.py --workers 8 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_start(workers: int) -> tuple[float, float]:
    """(seconds to every worker ready, seconds to every worker's first step)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        t0 = time.time()
        res = subprocess.run([sys.executable, "-m", "gasloc_emu", "run", "--workers",
                              str(workers), "--model", "tiny", "--rounds", "1", "--local-steps",
                              "1", "--step-time-s", "0.05", "--no-dashboard", "--set",
                              "data.max_corpus_mb=1", "--set", "data.eval_batches=1",
                              "--out", str(out)], capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise SystemExit(f"{workers} workers: run failed\n{res.stderr[-2000:]}")
        ready = (out / "workers.json").stat().st_mtime - t0
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        first = max(r["time_s"] for r in rows if r["round"] == 0)
        return ready, ready + first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    print(f"{'workers':>7}  {'to ready s':>10}  {'to first step s':>15}")
    for n in args.workers:
        runs = [one_start(n) for _ in range(args.repeats)]
        print(f"{n:>7}  {statistics.median(r[0] for r in runs):>10.2f}  "
              f"{statistics.median(r[1] for r in runs):>15.2f}")


if __name__ == "__main__":
    main()
