"""Shaping accuracy: configured vs measured goodput per rate and shaper, and 8 workers all-to-all.

    python benchmarks/bench_shaping.py [--rates 1,5,50,200,1000] [--seconds 3] [--workers 8]
        [--all-to-all-latency-ms 0,5] [--time-scale 1]

The tc rows need network namespaces: the script re-executes itself inside its own user
namespace (as the launcher does) and skips tc, saying why, where that is impossible. Each row
is one link measured alone (``probe_links``, 1 -> 0 then 0 -> 1 is not needed: links are
independent); the all-to-all rows run every directed link of the ``skewed`` profile at once and
report the spread of the per-link ratios. Target for tc: 0.95-1.05 up to 1 Gbit/s.

Two readings of each link: ``ratio``, the receiver's (its process timestamps what it reads),
and, under tc, ``acked``: the sender's kernel (TCP_INFO's acknowledged bytes over its own
window, which a receiver process starved of CPU cannot skew; ``netem.tcpinfo``).

``--time-scale K`` plays the all-to-all rows dilated, as ``run --time-scale K`` does
(``gasloc_emu.netplan.dilate_link_plan``: every rate / K, every delay x K, each link measured
K times longer): the row says K, and its Mbit/s and latency are emulated (measured x K and / K;
the ratios are the same in either clock).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gasloc_emu.config import NetConfig
from gasloc_emu.netplan import dilate_link_plan
from netem.capabilities import CapabilityError, choose_shaper, probe
from netem.namespaces import NetworkSession, reexec_in_userns
from netem.probe import probe_links
from netem.profiles import build_link_plan


def _measure(shaper: str, net: NetConfig, workers: int, seconds: float, pairs,
             time_scale: float = 1.0) -> list[dict]:
    """Each link's probe row; at K > 1 on the dilated plan, K times longer, read back in
    emulated units (Mbit/s x K, ms / K)."""
    plan = dilate_link_plan(build_link_plan(net, workers, seed=0), time_scale)
    with NetworkSession(plan, choose_shaper(shaper, probe())) as session:
        rows = probe_links(session, pairs=pairs, seconds_per_link=seconds * time_scale,
                           parallel=True, pings=10)
    if time_scale != 1.0:
        for r in rows:
            for side, key in ((r, "measured_mbit"), (r, "configured_mbit"),
                              (r.get("sender") or {}, "acked_mbit")):
                if side.get(key) is not None:
                    side[key] *= time_scale
            if r.get("measured_latency_ms") is not None:
                r["measured_latency_ms"] /= time_scale
    return rows


def single_link_rows(rates: list[float], shapers: list[str], seconds: float) -> list[dict]:
    out = []
    for shaper in shapers:
        for rate in rates:
            net = NetConfig(bw_profile="uniform", rate_mbit=rate, shaper=shaper)
            row = _measure(shaper, net, 2, seconds, [(0, 1)])[0]
            out.append({"case": "1 link", "shaper": shaper, "configured_mbit": rate,
                        "measured_mbit": row["measured_mbit"], "ratio": row["ratio"],
                        "acked": _spread(acked_ratios([row], shaper)),
                        "latency_ms": row["measured_latency_ms"]})
    return out


def all_to_all_rows(workers: int, shapers: list[str], seconds: float,
                    latencies_ms: list[float], time_scale: float = 1.0) -> list[dict]:
    out = []
    for shaper in shapers:
        for latency in latencies_ms:
            out.append(_all_to_all_row(workers, shaper, seconds, latency, time_scale))
    return out


def _all_to_all_row(workers: int, shaper: str, seconds: float, latency_ms: float,
                    time_scale: float = 1.0) -> dict:
    """One row; a latency under tc puts the delay mode's packets in the path (the packet
    line where the kernel has no netem)."""
    net = NetConfig(bw_profile="skewed", rate_mbit=50.0, slow_rate_mbit=5.0, shaper=shaper,
                    latency_ms=latency_ms)
    rows = _measure(shaper, net, workers, seconds, None, time_scale)
    delay = f", {latency_ms:g} ms by {choose_shaper(shaper, probe()).delay}" if latency_ms else ""
    at_k = f", at K = {time_scale:g}" if time_scale != 1.0 else ""
    return {"case": f"{workers}x{workers - 1} flows, skewed 50/5{delay}{at_k}", "shaper": shaper,
            "configured_mbit": "50/5",
            "measured_mbit": round(sum(r["measured_mbit"] for r in rows), 1),
            "ratio": _spread([r["ratio"] for r in rows]),
            "acked": _spread(acked_ratios(rows, shaper)),
            "latency_ms": round(statistics.median(r["measured_latency_ms"] for r in rows), 3)}


def acked_ratios(rows: list[dict], shaper: str) -> list[float]:
    """Each link's rate as its sender's kernel saw it acknowledged, over its configured rate;
    none for the userspace shaper, which holds messages after the receiver's kernel has them."""
    if shaper != "tc":
        return []
    return [r["sender"]["acked_mbit"] / r["configured_mbit"] for r in rows
            if (r.get("sender") or {}).get("acked_mbit") is not None and r["configured_mbit"]]


def _spread(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    if len(ratios) == 1:
        return f"{ratios[0]:.3f}"
    return f"{min(ratios):.3f} / {statistics.median(ratios):.3f} / {max(ratios):.3f}"


def print_table(rows: list[dict]) -> None:
    head = ("case", "shaper", "configured Mbit/s", "measured Mbit/s", "ratio (min/median/max)",
            "acked", "latency ms")
    keys = ("case", "shaper", "configured_mbit", "measured_mbit", "ratio", "acked", "latency_ms")
    cells = [head] + [tuple(str(r[k]) for k in keys) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    for n, c in enumerate(cells):
        print("  ".join(v.rjust(w) for v, w in zip(c, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1,5,50,200,1000", help="Mbit/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=3.0, help="measurement per case")
    ap.add_argument("--workers", type=int, default=8,
                    help="workers of the all-to-all case (0: skip)")
    ap.add_argument("--shapers", default="tc,userspace")
    ap.add_argument("--all-to-all-latency-ms", default="0,5",
                    help="one all-to-all row per one-way latency, comma-separated")
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="time dilation K of the all-to-all rows (emulated units reported)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    shapers = args.shapers.split(",")
    if "tc" in shapers and not reexec_in_userns(sys.argv[1:],
                                                entry=[sys.executable, os.path.abspath(__file__)]):
        missing = probe().tc_missing() or "user namespaces are disabled"
        print(f"# tc skipped: {missing}")
        shapers.remove("tc")
    try:
        choose_shaper("tc", probe()) if "tc" in shapers else None
    except CapabilityError as exc:
        print(f"# tc skipped: {exc}")
        shapers.remove("tc")
    t = time.time()
    rows = single_link_rows([float(r) for r in args.rates.split(",")], shapers, args.seconds)
    if args.workers:
        rows += all_to_all_rows(args.workers, shapers, args.seconds,
                                [float(x) for x in args.all_to_all_latency_ms.split(",")],
                                args.time_scale)
    print(f"# {os.cpu_count()} cores, kernel {os.uname().release}, {time.time() - t:.0f} s; "
          f"delay: {choose_shaper('auto', probe()).delay}")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
