"""The GPU path, checked in one short run of a lent GPU machine: every worker pinned to its
own GPU, bf16 training that learns, throughput per worker, and resume after kill -9 on the
device. Prints one table row per check and exits 1 when any fails.

    python benchmarks/gpu_check.py                 # on a GPU machine (about 3 minutes)
    python benchmarks/gpu_check.py --device cpu    # the same checks on the CPU (no pinning)

Checks, each a ``gasloc-emu`` command as a user would type it:

- **pinning**: ``run --device auto`` with one worker per visible GPU (at least 2): each
  worker's ``gpu`` in workers.json is a different one, and its ``device`` is ``cuda:0``
  inside it (CUDA_VISIBLE_DEVICES narrowed to its GPU).
- **bf16**: the ``small`` preset with ``--precision bf16`` for a few rounds: every loss finite,
  the last round's mean below the first's.
- **throughput**: that run's tokens/s and model FLOPs utilisation per worker
  (``gasloc-emu export --csv``).
- **resume**: ``tiny`` with a checkpoint every round, the launcher killed with SIGKILL after
  round 2, ``run --resume``: the final eval loss against the uninterrupted run's (equal to
  the bit where the device's kernels are deterministic; the difference is printed).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMEOUT_S = 600  # one command; the whole check is bounded by four of them plus a kill


def gasloc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def check_pinning(tmp: Path, device: str, gpus: int) -> tuple[bool, str]:
    if device == "cpu":
        return True, "skipped: --device cpu"
    workers = max(2, gpus)
    out = tmp / "pinning"
    res = gasloc("run", "--workers", str(workers), "--model", "tiny", "--rounds", "2",
                 "--local-steps", "2", "--set", "run.device=auto", "--no-dashboard",
                 "--out", str(out))
    if res.returncode != 0:
        return False, res.stderr.strip().splitlines()[-1]
    placed = json.loads((out / "workers.json").read_text())
    gpus_used = [w["gpu"] for w in placed]
    distinct = len(set(gpus_used)) == min(workers, gpus)
    inside = all(w["device"] == "cuda:0" for w in placed)
    return distinct and inside, f"{workers} workers on GPUs {gpus_used}, devices " \
        f"{sorted({w['device'] for w in placed})}"


def check_bf16(tmp: Path, device: str) -> tuple[bool, str, Path | None]:
    out = tmp / "bf16"
    res = gasloc("run", "--workers", "2", "--model", "small", "--precision", "bf16",
                 "--rounds", "4", "--local-steps", "8", "--set", f"run.device={device}",
                 "--no-dashboard", "--out", str(out))
    if res.returncode != 0:
        return False, res.stderr.strip().splitlines()[-1], None
    got = rows(out)
    losses = [r["train_loss"] for r in got]
    first = [r["train_loss"] for r in got if r["round"] == 0]
    last = [r["train_loss"] for r in got if r["round"] == 3]
    ok = all(math.isfinite(x) for x in losses) and sum(last) / len(last) < sum(first) / len(first)
    return ok, f"train loss {sum(first) / len(first):.3f} -> {sum(last) / len(last):.3f}", out


# dense bf16 peaks (TFLOP/s) by device name, for MFU: NVIDIA's data sheets
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def peak_of(device: str, name: str, given: float | None) -> float | None:
    """The peak MFU is measured against: ``--peak-tflops``, else the data sheet's for a GPU
    named in ``PEAK_TFLOPS``, else export's default (one CPU core) on the CPU; None: no MFU."""
    if given is not None:
        return given
    if device == "cpu":
        return None
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def throughput(tmp: Path, run: Path | None, peak: float | None) -> tuple[bool, str]:
    if run is None:
        return False, "no bf16 run to read"
    table = tmp / "bf16.csv"
    res = gasloc("export", str(run), "--csv", str(table),
                 *(["--peak-tflops", str(peak)] if peak is not None else []))
    if res.returncode != 0:
        return False, res.stderr.strip().splitlines()[-1]
    with table.open() as f:
        got = list(csv.DictReader(f))
    by_worker: dict[str, list[dict]] = {}
    for row in got:
        by_worker.setdefault(row["worker"], []).append(row)
    parts = []
    for w, rs in sorted(by_worker.items()):
        tps = [float(r["tokens_per_s"]) for r in rs if r.get("tokens_per_s")]
        mfu = [float(r["mfu"]) for r in rs if r.get("mfu")]
        parts.append(f"w{w} {sum(tps) / max(1, len(tps)):,.0f} tok/s"
                     + (f" MFU {sum(mfu) / len(mfu):.1%}" if mfu else ""))
    return bool(parts), "; ".join(parts)


def check_resume(tmp: Path, device: str) -> tuple[bool, str]:
    base = ["--workers", "2", "--model", "tiny", "--rounds", "6", "--local-steps", "2",
            "--checkpoint-every", "1", "--step-time-s", "0.2", "--set", f"run.device={device}",
            "--no-dashboard"]
    whole = tmp / "whole"
    res = gasloc("run", *base, "--out", str(whole))
    if res.returncode != 0:
        return False, "uninterrupted: " + res.stderr.strip().splitlines()[-1]
    cut = tmp / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "gasloc_emu", "run", *base, "--out",
                             str(cut)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not (cut / "metrics.jsonl").exists() or \
                max((r["round"] for r in rows(cut)), default=-1) < 2:
            if proc.poll() is not None or time.monotonic() > deadline:
                return False, "the run to kill ended or stalled before round 2"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)   # the launcher, its zygote and workers
    finally:
        proc.kill()
        proc.wait()
    res = gasloc("run", "--resume", str(cut))
    if res.returncode != 0:
        return False, "resume: " + res.stderr.strip().splitlines()[-1]
    a, b = summary(whole)["final_eval_loss"], summary(cut)["final_eval_loss"]
    return a == b, f"final eval loss {a!r} uninterrupted, {b!r} resumed (diff {abs(a - b):.2e})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--peak-tflops", type=float, help="the device's peak for MFU (default: "
                    "the data sheet's bf16 dense peak of an H100, H200 or A100)")
    args = ap.parse_args()
    import torch
    gpus = torch.cuda.device_count()
    if args.device == "cuda" and gpus == 0:
        print("no GPU visible: run on a GPU machine, or with --device cpu", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if gpus else "cpu"
    peak = peak_of(args.device, name, args.peak_tflops)
    print(f"torch {torch.__version__}, {gpus} GPU(s): {name}; MFU against "
          + (f"{peak:g} TFLOP/s" if peak is not None else "export's default peak"))
    results = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        results.append(("pinning", *check_pinning(tmp, args.device, gpus)))
        ok, text, run = check_bf16(tmp, args.device)
        results.append(("bf16", ok, text))
        results.append(("throughput", *throughput(tmp, run, peak)))
        results.append(("resume", *check_resume(tmp, args.device)))
    width = max(len(r[0]) for r in results)
    for name, ok, text in results:
        print(f"{name:<{width}}  {'ok  ' if ok else 'FAIL'}  {text}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
