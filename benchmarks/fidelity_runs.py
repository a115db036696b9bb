"""Does `run` emulate what was asked at training scale? Each case once in `run` and once in
`simulate` with the same settings, side by side in one process, one case at a time.

    python benchmarks/fidelity_runs.py [--cases 8w,2w-k1,2w-k4,16w,aws8] [--out DIR]

Printed per case: K, the run's emulated training time (the last row's ``time_s``: wall / K)
against simulate's (its virtual clock), the median of the rows' ``comm_s`` (emulated) against
simulate's, the median of the per-message transfer times (``recv_links``' transfer_s /
messages), the packet line's release lateness p99 and read lag p99 in wall ms over training (the
line's stats since the launcher's mark, the window the verdict judges) with the
verdict's limit, the run's own fidelity verdict (and its first reason), and whether every
row's train loss equals simulate's bit for
bit. The cases are the must-holds of the WAN-at-scale work:

- ``8w``: GASLoC on an 8-worker expander, every link 40 Mbit/s and 15 ms one way, cubic with
  idle restart, nominal 0.5 s steps, 3 local steps, 8 rounds.
- ``16w``: the same on 16 workers, a random 4-regular graph, 30 ms links.
- ``2w-k1`` / ``2w-k4``: 2 workers, 50 Mbit/s, 50 ms, cubic with idle restart, at K = 1 and 4
  (a point the machine carries at K = 1: the two must agree in emulated time).
- ``aws8``: 8 workers on the measured aws8 regions (``--bw-profile cloud --placement aws8``),
  ``--time-scale auto``.

``--time-scale`` overrides the cases' K (``auto`` picks per case). Each run's record is kept
under ``--out`` (default a temporary folder), ``<case>/run`` and ``<case>/sim``.
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

COMMON = ["--model", "tiny"]
CUBIC = ["--set", "tcp.congestion_control=cubic", "--set", "tcp.slow_start_after_idle=1"]


def _uniform(rate_mbit: float, latency_ms: float) -> list[str]:
    return ["--bw-profile", "uniform", "--rate-mbit", f"{rate_mbit:g}",
            "--latency-ms", f"{latency_ms:g}", "--delay", "packet-line"]


CASES: dict[str, tuple[list[str], str]] = {
    "8w": (["--algo", "gasloc", "--topology", "expander", "--workers", "8", "--local-steps", "3",
            "--step-time-s", "0.5", "--rounds", "8", *_uniform(40, 15), *CUBIC], "1"),
    "16w": (["--algo", "gasloc", "--topology", "expander", "--set", "topology.degree=4",
             "--workers", "16", "--local-steps", "3", "--step-time-s", "0.5", "--rounds", "8",
             *_uniform(30, 30), *CUBIC], "auto"),
    "2w-k1": (["--algo", "gasloc", "--topology", "ring", "--workers", "2", "--local-steps", "3",
               "--step-time-s", "0.5", "--rounds", "8", *_uniform(50, 50), *CUBIC], "1"),
    "2w-k4": (["--algo", "gasloc", "--topology", "ring", "--workers", "2", "--local-steps", "3",
               "--step-time-s", "0.5", "--rounds", "8", *_uniform(50, 50), *CUBIC], "4"),
    "aws8": (["--algo", "gasloc", "--topology", "expander", "--workers", "8",
              "--local-steps", "3", "--step-time-s", "0.05", "--rounds", "8",
              "--bw-profile", "cloud", "--placement", "aws8", "--delay", "packet-line"], "auto"),
}


def _rows(record: Path) -> dict[tuple[int, int], dict]:
    rows = {}
    for line in (record / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "train_loss" in r and "worker" in r:
            rows[(r["worker"], r["round"])] = r
    return rows


def _per_message_s(rows: dict) -> list[float]:
    out = []
    for r in rows.values():
        for obs in (r.get("recv_links") or {}).values():
            if obs.get("messages"):
                out.append(obs["transfer_s"] / obs["messages"])
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_case(name: str, args: list[str], k: str, out: Path, budget_s: float) -> dict:
    rec = {"case": name}
    for mode in ("run", "simulate"):
        d = out / name / ("run" if mode == "run" else "sim")
        argv = [sys.executable, "-m", "gasloc_emu", mode, *COMMON, *args, "--time-scale", k,
                "--out", str(d), "--overwrite"]
        if mode == "run":
            argv.append("--no-dashboard")
        t0 = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget_s)
        rec[f"{mode}_seconds"] = time.monotonic() - t0
        if not (d / "summary.json").exists():
            rec["error"] = f"{mode} exited {proc.returncode}: " + \
                (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            return rec
        rec[mode] = d
    return rec


def describe(rec: dict) -> dict:
    if "error" in rec:
        return rec
    run_dir, sim_dir = rec["run"], rec["simulate"]
    run_sum = json.loads((run_dir / "summary.json").read_text())
    run_rows, sim_rows = _rows(run_dir), _rows(sim_dir)
    links = json.loads((run_dir / "links.json").read_text()) \
        if (run_dir / "links.json").exists() else {}
    # training's window (the line's stats since the launcher's mark), the one the verdict
    # judges; the whole line's stats also hold the pre-run probe's bulk flows
    whole = links.get("packet_line") or {}
    line = whole.get("since_mark") or whole
    fid = run_sum.get("fidelity") or {}
    reasons = fid.get("reasons") or []
    same = run_rows.keys() == sim_rows.keys() and all(
        run_rows[key]["train_loss"] == sim_rows[key]["train_loss"] for key in run_rows)
    return {
        "case": rec["case"], "time_scale": run_sum.get("time_scale"),
        "run_wall_s": max(r["time_s"] for r in run_rows.values()),
        "sim_wall_s": max(r["time_s"] for r in sim_rows.values()),
        "comm_run_s": _median([r["comm_s"] for r in run_rows.values()]),
        "comm_sim_s": _median([r["comm_s"] for r in sim_rows.values()]),
        "msg_run_s": _median(_per_message_s(run_rows)),
        "msg_sim_s": _median(_per_message_s(sim_rows)),
        "lateness_p99_ms": (line.get("late_release") or {}).get("p99_ms"),
        "read_lag_p99_ms": (line.get("read_lag") or {}).get("p99_ms"),
        "limit_ms": (fid.get("thresholds") or {}).get("lateness_limit_ms"),
        "engine": whole.get("engine"),
        "fidelity": fid.get("fidelity"),
        "reason": reasons[0]["text"] if reasons else "",
        "losses_equal": same, "rows": len(run_rows),
    }


def table(rows: list[dict]) -> str:
    head = (f"{'case':7s} {'K':>4s} {'wall run/sim s':>16s} {'x':>5s} {'comm p50 run/sim s':>19s}"
            f" {'x':>5s} {'msg p50 run/sim s':>18s} {'late p99':>8s} {'lag p99':>7s}"
            f" {'limit':>5s} {'verdict':9s} {'loss=':5s}")
    out = [head]
    for r in rows:
        if "error" in r:
            out.append(f"{r['case']:7s} error: {r['error']}")
            continue
        late = r["lateness_p99_ms"]
        lag = r["read_lag_p99_ms"]
        limit = r["limit_ms"]
        out.append(
            f"{r['case']:7s} {r['time_scale'] or 1:4g} "
            f"{r['run_wall_s']:7.2f}/{r['sim_wall_s']:<8.2f} "
            f"{r['run_wall_s'] / r['sim_wall_s']:5.2f} "
            f"{r['comm_run_s']:8.3f}/{r['comm_sim_s']:<10.3f} "
            f"{r['comm_run_s'] / r['comm_sim_s']:5.2f} "
            f"{r['msg_run_s']:8.3f}/{r['msg_sim_s']:<9.3f} "
            f"{'-' if late is None else f'{late:.2f}':>8s} "
            f"{'-' if lag is None else f'{lag:.2f}':>7s} "
            f"{'-' if limit is None else f'{limit:.1f}':>5s} "
            f"{r['fidelity'] or '-':9s} {'yes' if r['losses_equal'] else 'NO':5s}")
        if r["reason"]:
            out.append(f"{'':7s} reason: {r['reason']}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--time-scale", default=None, help="every case's K (default: the case's)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--budget-s", type=float, default=900.0, help="per run or simulate")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting added to every case's run and simulate (repeatable), "
                         "e.g. net.tcp_sample_s=0 to see what the TCP sampler costs the line")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="fidelity-runs-"))
    rows = []
    for name in a.cases.split(","):
        if name not in CASES:
            ap.error(f"--cases: {name!r} is not a case; expected one of {', '.join(CASES)}")
        args, k = CASES[name]
        args = [*args, *(x for kv in a.set for x in ("--set", kv))]
        rows.append(describe(run_case(name, args, a.time_scale or k, out, a.budget_s)))
        print(table(rows[-1:]), flush=True)
    print()
    print(table(rows))
    print(f"records under {out}")
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
