"""Memory of a running emulation: PSS of every worker process (as smem counts it: each shared
page divided among the processes that map it), their total, and the launcher's and zygote's.

A `gasloc-emu run` of N tiny workers (nominal 0.05 s steps, unshaped, long enough to be
measured in flight) is started; once every worker has finished a round, /proc/<pid>/smaps_rollup
is read for each process, then the run is stopped with SIGINT. Usage:

    python benchmarks/bench_memory.py                    # 32 workers
    python benchmarks/bench_memory.py --workers 8 64
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def pss_mb(pid: int) -> float:
    """Proportional set size of one process, in MB (10^6 bytes)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no Pss line for pid {pid}")


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def measure(workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        proc = subprocess.Popen([sys.executable, "-m", "gasloc_emu", "run", "--workers",
                                 str(workers), "--model", "tiny", "--rounds", "100000",
                                 "--local-steps", "2", "--step-time-s", "0.05",
                                 "--no-dashboard", "--out", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 300
            while _rounds_done(out) < workers:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"run did not get going: {proc.stderr.read()[-2000:]}")
                time.sleep(0.5)
            pids = [w["pid"] for w in json.loads((out / "workers.json").read_text())]
            per = [pss_mb(p) for p in pids]
            others = {"launcher": pss_mb(proc.pid)}
            zygotes = [z for z in children(proc.pid) if z not in pids]
            if zygotes:
                others["zygote"] = pss_mb(zygotes[0])
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
    return {"workers": workers, "mean": statistics.fmean(per), "max": max(per),
            "total": sum(per), **others}


def _rounds_done(out: Path) -> int:
    metrics = out / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[32])
    args = ap.parse_args()
    print(f"{'workers':>7}  {'PSS/worker MB':>13}  {'max MB':>7}  {'total MB':>9}  "
          f"{'launcher MB':>11}  {'zygote MB':>9}")
    for n in args.workers:
        r = measure(n)
        print(f"{n:>7}  {r['mean']:>13.0f}  {r['max']:>7.0f}  {r['total']:>9.0f}  "
              f"{r['launcher']:>11.0f}  {r.get('zygote', float('nan')):>9.0f}")


if __name__ == "__main__":
    main()
